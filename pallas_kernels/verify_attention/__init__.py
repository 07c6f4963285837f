"""Verification attention: T = 1+D new tokens per row over a KV cache (contiguous or paged) with a
causal or tree mask among the new tokens; `api.py` picks the kernel for the backend (GPU:
`kernel_gpu.py` / `paged_gpu.py`, TPU: `kernel_tpu.py`, CPU: `kernel_cpu.py`) or the jnp
reference."""

from pallas_kernels.verify_attention.api import (IMPLS, attend_unwritten, choose_impl,
                                                 paged_verify_attention, verify_attention)
from pallas_kernels.verify_attention.reference import (attend, attend_unwritten_reference,
                                                       attention_mask,
                                                       paged_verify_attention_reference,
                                                       verify_attention_reference)

__all__ = ["IMPLS", "attend", "attend_unwritten", "attend_unwritten_reference", "attention_mask",
           "choose_impl", "paged_verify_attention", "paged_verify_attention_reference",
           "verify_attention", "verify_attention_reference"]
