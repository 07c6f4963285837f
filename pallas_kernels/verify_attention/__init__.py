"""Verification attention: T = 1+D new tokens per row over a KV cache (contiguous or paged) with a
causal or tree mask among the new tokens; `api.py` picks the Pallas kernel for the backend (GPU:
`kernel_gpu.py` / `paged_gpu.py`, TPU: `kernel_tpu.py`) or the jnp reference."""

from pallas_kernels.verify_attention.api import (IMPLS, choose_impl, paged_verify_attention,
                                                 verify_attention)
from pallas_kernels.verify_attention.reference import (attend, attend_unwritten, attention_mask,
                                                       paged_verify_attention_reference,
                                                       verify_attention_reference)

__all__ = ["IMPLS", "attend", "attend_unwritten", "attention_mask", "choose_impl",
           "paged_verify_attention", "paged_verify_attention_reference", "verify_attention",
           "verify_attention_reference"]
