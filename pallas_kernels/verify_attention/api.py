"""Public verification-attention ops: validate inputs, then run the Pallas kernel (GPU by default)
or the jnp reference (CPU/TPU by default, or where the kernel cannot serve the shapes)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp

from pallas_kernels.verify_attention import kernel as kern
from pallas_kernels.verify_attention.paged import (paged_verify_attention_kernel,
                                                   paged_verify_attention_reference)
from pallas_kernels.verify_attention.reference import verify_attention_reference

IMPLS = ("auto", "pallas", "reference")
TARGET_PROGRAMS = 132        # streaming multiprocessors on an H100 / H200: programs to keep busy
MIN_BLOCKS_PER_SPLIT = 4     # a split shorter than this costs more in the combine than it saves


def choose_impl(impl: str, *, head_dim: int, dtype) -> str:
  """Resolves `impl` to "pallas" or "reference" (static: from the backend and the shapes only).
  "auto" takes the kernel on GPU, the reference elsewhere and where the kernel cannot serve."""
  if impl not in IMPLS:
    raise ValueError(f"verify_attention impl must be one of {IMPLS}, got {impl!r}")
  if impl != "auto":
    return impl
  if jax.default_backend() != "gpu":
    return "reference"
  reason = kern.unsupported(head_dim, dtype)
  if reason is not None:
    warnings.warn(f"verify_attention: falling back to the jnp reference for {reason}")
    return "reference"
  return "pallas"


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
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise ValueError(f"{name} must be floating point, got {x.dtype}")
  if lengths.shape != (b,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
    raise ValueError(f"lengths must be an integer [B] = [{b}] array, got {lengths.dtype}"
                     f"{list(lengths.shape)}")
  if tree_mask is not None and (tree_mask.shape != (b, t, t) or tree_mask.dtype != jnp.bool_):
    raise ValueError(f"tree_mask must be bool [B, T, T] = [{b}, {t}, {t}], got {tree_mask.dtype}"
                     f"{list(tree_mask.shape)}")
  if t < 1 or kv_len < 1:
    raise ValueError(f"need T >= 1 new tokens and a KV capacity >= 1, got T={t}, S={kv_len}")


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

  impl: "auto" (kernel on GPU, reference elsewhere), "pallas" or "reference".
  mask: the [B, T, S] `reference.attention_mask` when the caller already has it (one per forward,
    shared by the layers); only the reference uses it. It must agree with lengths and tree_mask.
  interpret: run the kernel in Pallas interpret mode (default: off the GPU).
  block_k / block_q / num_splits / num_stages: kernel tiling (defaults from the shapes); the kernel
    runs q in k's dtype, and gives zeros (not NaN) to a row that sees no key.
  """
  _check_inputs(q, k, v, lengths, tree_mask, k.shape[1])
  if mask is not None and mask.shape != (q.shape[0], q.shape[1], k.shape[1]):
    raise ValueError(f"mask must be [B, T, S] = {(q.shape[0], q.shape[1], k.shape[1])}, "
                     f"got {mask.shape}")
  if choose_impl(impl, head_dim=q.shape[3], dtype=k.dtype) == "reference":
    return verify_attention_reference(q, k, v, lengths, tree_mask, mask=mask)
  options = kernel_options(q, k.shape[2], k.shape[1], block_k, block_q, num_splits, num_stages,
                           interpret)
  out = kern.verify_attention_kernel(q.astype(k.dtype), k, v, lengths, tree_mask, **options)
  return out.astype(q.dtype)


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
  if choose_impl(impl, head_dim=q.shape[3], dtype=k_pages.dtype) == "reference":
    return paged_verify_attention_reference(q, k_pages, v_pages, block_tables, lengths, tree_mask)
  options = kernel_options(q, k_pages.shape[2], capacity, block_k, block_q, num_splits,
                           num_stages, interpret)
  out = paged_verify_attention_kernel(q.astype(k_pages.dtype), k_pages, v_pages, block_tables,
                                      lengths, tree_mask, **options)
  return out.astype(q.dtype)
