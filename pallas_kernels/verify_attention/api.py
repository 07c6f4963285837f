"""Public verification-attention ops: validate inputs, then run the backend's kernel (the
Triton-style Pallas kernel on GPU, the Mosaic-TPU kernel on TPU, the jax.ffi C++ kernel on CPU) or
the jnp reference (where no kernel can serve the shapes)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp

from pallas_kernels.verify_attention import kernel_cpu, kernel_tpu
from pallas_kernels.verify_attention.kernel_cpu import logical, value_dtype
from pallas_kernels.verify_attention import kernel_gpu as kern
from pallas_kernels.verify_attention.paged_gpu import paged_verify_attention_kernel
from pallas_kernels.verify_attention.reference import (attend_unwritten_reference,
                                                      paged_verify_attention_reference,
                                                      verify_attention_reference)

IMPLS = ("auto", "pallas", "pallas_gpu", "pallas_tpu", "cpu", "reference")
TARGET_PROGRAMS = 132        # streaming multiprocessors on an H100 / H200: programs to keep busy
MIN_BLOCKS_PER_SPLIT = 4     # a split shorter than this costs more in the combine than it saves


def _cpu_unsupported(head_dim: int, group: int, dtype) -> str | None:
  reason = kernel_cpu.unsupported(head_dim, group, dtype)
  if reason is None and not jax.sharding.get_abstract_mesh().empty:
    reason = "a mesh (XLA's partitioner cannot split the custom call)"
  if reason is None and not kernel_cpu.available():
    reason = f"an unavailable kernel ({kernel_cpu.why_unavailable()})"
  return reason


def choose_impl(impl: str, *, head_dim: int, dtype, group: int = 1) -> str:
  """Resolves `impl` to "pallas_gpu", "pallas_tpu", "cpu" or "reference" (static: from the backend
  and the shapes only; group = query heads per KV head). "auto" takes the backend's kernel (on CPU
  the C++ kernel, which reads only the keys each row holds), the reference where the kernel cannot
  serve; "pallas" is the backend's Pallas kernel (the TPU kernel on TPU, else the GPU kernel, in
  interpret mode off the GPU); "cpu" is the C++ kernel (CPU only)."""
  if impl not in IMPLS:
    raise ValueError(f"verify_attention impl must be one of {IMPLS}, got {impl!r}")
  backend = jax.default_backend()
  if impl == "pallas":
    return "pallas_tpu" if backend == "tpu" else "pallas_gpu"
  if impl == "cpu":
    reason = "another backend" if backend != "cpu" else _cpu_unsupported(head_dim, group, dtype)
    if reason is not None:
      raise ValueError(f"verify_attention impl='cpu' cannot serve {reason}; use impl='auto'")
    return impl
  if impl != "auto":
    return impl
  if backend == "gpu":
    reason = kern.unsupported(head_dim, dtype)
  elif backend == "tpu":
    reason = kernel_tpu.unsupported(dtype)
  else:
    reason = _cpu_unsupported(head_dim, group, dtype)
    if reason is not None:   # bf16 caches, meshes: the reference is the CPU's other path
      return "reference"
    return "cpu"
  if reason is not None:
    warnings.warn(f"verify_attention: falling back to the jnp reference for {reason}")
    return "reference"
  return f"pallas_{backend}"


def default_block_k(head_dim: int, dtype, block_q: int, num_stages: int) -> int:
  """64, or the largest smaller power of two whose tiles fit in shared memory."""
  block_k = 64
  while (block_k > kern.MIN_DOT
         and kern.smem_bytes(head_dim, dtype, block_q, block_k, num_stages) > kern.SMEM_BUDGET):
    block_k //= 2
  return block_k


def default_num_splits(programs: int, kv_len: int, block_k: int) -> int:
  """Enough KV splits to give every SM a program, never below MIN_BLOCKS_PER_SPLIT blocks each."""
  blocks = -(-kv_len // block_k)
  return max(1, min(TARGET_PROGRAMS // programs, blocks // MIN_BLOCKS_PER_SPLIT))


def _check_inputs(q, k, v, lengths, tree_mask, kv_len: int) -> None:
  if q.ndim != 4 or k.ndim != 4:
    raise ValueError(f"q must be [B, T, Hq, Dh] and k/v [.., KVH, Dh]; got q {q.shape}, "
                     f"k {k.shape}")
  if k.shape != v.shape:
    raise ValueError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
  b, t, hq, dh = q.shape
  kvh = k.shape[2]
  if k.shape[3] != dh:
    raise ValueError(f"head_dim differs: q has {dh}, k/v have {k.shape[3]}")
  if hq % kvh:
    raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({kvh})")
  for name, x in (("q", q), ("k", k), ("v", v)):
    if not jnp.issubdtype(value_dtype(x.dtype), jnp.floating):
      raise ValueError(f"{name} must be floating point (or bf16 bits), got {x.dtype}")
  if lengths.shape != (b,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
    raise ValueError(f"lengths must be an integer [B] = [{b}] array, got {lengths.dtype}"
                     f"{list(lengths.shape)}")
  if tree_mask is not None and (tree_mask.shape != (b, t, t) or tree_mask.dtype != jnp.bool_):
    raise ValueError(f"tree_mask must be bool [B, T, T] = [{b}, {t}, {t}], got {tree_mask.dtype}"
                     f"{list(tree_mask.shape)}")
  if t < 1 or kv_len < 1:
    raise ValueError(f"need T >= 1 new tokens and a KV capacity >= 1, got T={t}, S={kv_len}")


def _interpret_tpu(interpret: bool | None) -> bool:
  return jax.default_backend() != "tpu" if interpret is None else interpret


def kernel_options(q, kvh: int, kv_len: int, block_k, block_q, num_splits, num_stages,
                   interpret) -> dict:
  """The kernel's static options, defaults filled in from the shapes and the backend."""
  b, t, hq, dh = q.shape
  interpret = jax.default_backend() != "gpu" if interpret is None else interpret
  block_q = block_q or kern.default_block_q(t * hq // kvh)
  block_k = block_k or default_block_k(dh, q.dtype, block_q, num_stages)
  if num_splits is None:
    tiles = -(-(t * hq // kvh) // block_q)
    num_splits = 1 if interpret else default_num_splits(b * kvh * tiles, kv_len, block_k)
  return dict(block_k=block_k, block_q=block_q, num_splits=num_splits, num_stages=num_stages,
              interpret=interpret)


def verify_attention(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array,
                     tree_mask: jax.Array | None = None, *, impl: str = "auto",
                     mask: jax.Array | None = None, interpret: bool | None = None,
                     block_k: int | None = None, block_q: int | None = None,
                     num_splits: int | None = None, num_stages: int = 2) -> jax.Array:
  """Attention of T new tokens over a KV cache that already holds their keys.

  q [B, T, Hq, Dh]; k/v [B, S, KVH, Dh] with the new keys at slots lengths[b] .. lengths[b]+T-1
  (slots past S were dropped); lengths [B] committed prefix per row; tree_mask [B, T, T] bool, which
  new tokens each new token sees (None = causal). Returns [B, T, Hq, Dh] in q.dtype.

  impl: "auto" (the backend's kernel: Pallas on GPU and TPU, C++ on CPU; the reference where it
    cannot serve), "pallas" (the backend's Pallas kernel), "pallas_gpu", "pallas_tpu", "cpu" or
    "reference".
  mask: the [B, T, S] `reference.attention_mask` when the caller already has it (one per forward,
    shared by the layers); only the reference uses it. It must agree with lengths and tree_mask.
  interpret: run the kernel in Pallas interpret mode (default: off the kernel's own backend; the TPU
    kernel then runs under `pltpu.InterpretParams`).
  block_k / block_q / num_splits / num_stages: kernel tiling (defaults from the shapes; num_stages
    is GPU-only); the kernel runs q in k's dtype, and gives zeros (not NaN) to a row that sees no
    key.
  """
  _check_inputs(q, k, v, lengths, tree_mask, k.shape[1])
  if mask is not None and mask.shape != (q.shape[0], q.shape[1], k.shape[1]):
    raise ValueError(f"mask must be [B, T, S] = {(q.shape[0], q.shape[1], k.shape[1])}, "
                     f"got {mask.shape}")
  chosen = choose_impl(impl, head_dim=q.shape[3], dtype=value_dtype(k.dtype),
                       group=q.shape[2] // k.shape[2])
  if chosen != "cpu":   # a bf16 cache held as bits (models.kv_cache): the values, for the others
    k, v = logical(k), logical(v)
  if chosen == "reference":
    return verify_attention_reference(q, k, v, lengths, tree_mask, mask=mask)
  if chosen == "cpu":
    return kernel_cpu.verify_attention_kernel(q, k, v, lengths, tree_mask).astype(q.dtype)
  if chosen == "pallas_tpu":
    out = kernel_tpu.verify_attention_kernel(
        q.astype(k.dtype), k, v, lengths, tree_mask, block_k=block_k, block_q=block_q,
        num_splits=1 if num_splits is None else num_splits,
        interpret=_interpret_tpu(interpret))
    return out.astype(q.dtype)
  options = kernel_options(q, k.shape[2], k.shape[1], block_k, block_q, num_splits, num_stages,
                           interpret)
  out = kern.verify_attention_kernel(q.astype(k.dtype), k, v, lengths, tree_mask, **options)
  return out.astype(q.dtype)


def attend_unwritten(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, lengths: jax.Array,
                     k_new: jax.Array, v_new: jax.Array, tree_mask: jax.Array | None = None, *,
                     impl: str = "auto") -> jax.Array:
  """`verify_attention` for a block whose keys are not in the cache: q, k_new, v_new [B, T, ...]
  for the T new tokens, the cache's slots < lengths[b] as the prefix; the cache is only read (see
  `reference.attend_unwritten_reference`). impl: "auto" (the C++ kernel on CPU, the reference
  elsewhere), "cpu" or "reference"; GPU and TPU take the reference."""
  _check_inputs(q, k_cache, v_cache, lengths, tree_mask, k_cache.shape[1])
  if k_new.shape != q.shape[:2] + k_cache.shape[2:] or v_new.shape != k_new.shape:
    raise ValueError(f"k_new/v_new must be [B, T, KVH, Dh] = {q.shape[:2] + k_cache.shape[2:]}, "
                     f"got {k_new.shape} and {v_new.shape}")
  chosen = choose_impl(impl, head_dim=q.shape[3], dtype=value_dtype(k_cache.dtype),
                       group=q.shape[2] // k_cache.shape[2])
  if chosen != "cpu":
    k_cache, v_cache = logical(k_cache), logical(v_cache)
  if chosen == "cpu":
    return kernel_cpu.attend_unwritten_kernel(q, k_cache, v_cache, lengths, k_new, v_new,
                                              tree_mask).astype(q.dtype)
  return attend_unwritten_reference(q, k_cache, v_cache, lengths, k_new, v_new, tree_mask)


def paged_verify_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
                           block_tables: jax.Array, lengths: jax.Array,
                           tree_mask: jax.Array | None = None, *, impl: str = "auto",
                           interpret: bool | None = None, block_k: int | None = None,
                           block_q: int | None = None, num_splits: int | None = None,
                           num_stages: int = 2) -> jax.Array:
  """`verify_attention` over a paged cache: k/v pages [P, page_size, KVH, Dh], block_tables
  [B, pages_per_seq] int (row b's logical slot s lives in page block_tables[b, s // page_size])."""
  if block_tables.ndim != 2 or block_tables.shape[0] != q.shape[0] or not jnp.issubdtype(
      block_tables.dtype, jnp.integer):
    raise ValueError(f"block_tables must be an integer [B, pages_per_seq] array with B = "
                     f"{q.shape[0]}, got {block_tables.dtype}{list(block_tables.shape)}")
  capacity = block_tables.shape[1] * k_pages.shape[1]
  _check_inputs(q, k_pages, v_pages, lengths, tree_mask, capacity)
  chosen = choose_impl(impl, head_dim=q.shape[3], dtype=k_pages.dtype)
  if chosen == "reference":
    return paged_verify_attention_reference(q, k_pages, v_pages, block_tables, lengths, tree_mask)
  if chosen == "pallas_tpu":
    if block_k not in (None, k_pages.shape[1]):
      raise ValueError(f"the TPU paged kernel reads one page per KV block: block_k must be None or "
                       f"the page size {k_pages.shape[1]}, got {block_k}")
    out = kernel_tpu.paged_verify_attention_kernel(
        q.astype(k_pages.dtype), k_pages, v_pages, block_tables, lengths, tree_mask,
        block_q=block_q, num_splits=1 if num_splits is None else num_splits,
        interpret=_interpret_tpu(interpret))
    return out.astype(q.dtype)
  options = kernel_options(q, k_pages.shape[2], capacity, block_k, block_q, num_splits,
                           num_stages, interpret)
  out = paged_verify_attention_kernel(q.astype(k_pages.dtype), k_pages, v_pages, block_tables,
                                      lengths, tree_mask, **options)
  return out.astype(q.dtype)
