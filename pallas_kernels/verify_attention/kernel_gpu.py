"""Verification attention as a Triton-style Pallas kernel: the G*T query rows of one KV head share a
tile and stream that head's KV prefix once, with online softmax and optional split-KV.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.verify_attention.packing import pack_queries, pack_tree_mask, unpack_output

SMEM_BUDGET = 227 * 1024   # bytes of shared memory one block may use on H100 / H200
MAX_BLOCK_Q = 128          # query rows per tile; more rows get more tiles
MIN_DOT = 16               # Triton's tl.dot needs every dimension >= 16
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
_M_INIT = -1e30            # finite, so a row that has seen nothing yet stays NaN-free


def next_pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def is_pow2(n: int) -> bool:
  return n > 0 and n & (n - 1) == 0


def default_block_q(rows: int) -> int:
  return min(MAX_BLOCK_Q, max(MIN_DOT, next_pow2(rows)))


def new_block(block_k: int, t: int) -> int:
  """Width of the chunks the T new keys are read in: a power of two in [16, block_k]."""
  return max(MIN_DOT, min(block_k, next_pow2(t)))


def unsupported(head_dim: int, dtype) -> str | None:
  """Why the kernel cannot serve this head_dim / dtype at any block size, or None."""
  if jnp.dtype(dtype) not in [jnp.dtype(d) for d in DTYPES]:
    return f"dtype {jnp.dtype(dtype)} (the kernel takes float32/bfloat16/float16)"
  if not is_pow2(head_dim) or head_dim < MIN_DOT:
    return f"head_dim {head_dim} (the Triton kernel needs a power of two >= {MIN_DOT})"
  return None


def smem_bytes(head_dim: int, dtype, block_q: int, block_k: int, num_stages: int,
               tree_cols: int = 0) -> int:
  """Shared memory of one program, roughly: the q tile, num_stages K and V blocks, the tree mask."""
  itemsize = jnp.dtype(dtype).itemsize
  return itemsize * head_dim * (block_q + 2 * num_stages * block_k) + block_q * tree_cols


def check_config(*, head_dim: int, dtype, block_q: int, block_k: int, num_splits: int,
                 num_stages: int, tree_cols: int) -> None:
  """Raises ValueError for a configuration the Triton lowering rejects or cannot fit. Interpret mode
  checks none of this, so the CPU tests only pass configurations a GPU also accepts."""
  reason = unsupported(head_dim, dtype)
  if reason is not None:
    raise ValueError(f"verify_attention kernel cannot serve {reason}; use impl='reference'")
  for name, value in (("block_q", block_q), ("block_k", block_k)):
    if not is_pow2(value) or value < MIN_DOT:
      raise ValueError(f"{name} must be a power of two >= {MIN_DOT} (Triton block sizes), "
                       f"got {value}")
  if num_splits < 1:
    raise ValueError(f"num_splits must be >= 1, got {num_splits}")
  if num_stages < 1:
    raise ValueError(f"num_stages must be >= 1, got {num_stages}")
  smem = smem_bytes(head_dim, dtype, block_q, block_k, num_stages, tree_cols)
  if smem > SMEM_BUDGET:
    raise ValueError(f"block_q={block_q}, block_k={block_k}, num_stages={num_stages} need ~{smem} "
                     f"bytes of shared memory, over the {SMEM_BUDGET}-byte budget; lower block_k "
                     "or num_stages")


def compiler_params(block_q: int, block_k: int, num_warps: int | None, num_stages: int):
  """Triton compiler params (they also pick the Triton backend over Mosaic GPU on jax >= 0.11)."""
  if num_warps is None:
    num_warps = 4 if block_q * block_k <= 64 * 64 else 8
  return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def attend_tile(q_ref, tm_ref, o_ref, lse_ref, *, prefix_len, fetch_prefix: Callable,
                fetch_new: Callable, group: int, num_new: int, block_k: int, block_new: int,
                num_splits: int, scale: float):
  """The body shared by the contiguous and paged kernels, for one (row, KV head, tile, split).

  prefix_len: the row's committed length clamped to the cache's capacity (a length past the cache
              must not walk past it: every slot of the cache is then prefix).
  fetch_prefix(j) -> k, v [block_k, Dh] and which of them are keys [block_k] for prefix columns
                    j*block_k + i (< prefix_len, and in an allocated page for a paged cache);
  fetch_new(c)   -> k, v [block_new, Dh] for new keys u = c*block_new + i, zero where invalid, and
                    which of them exist [block_new] (u < T and inside the cache).
  """
  block_q, head_dim = q_ref.shape
  tile, split = pl.program_id(2), pl.program_id(3)
  q = q_ref[...]                                                   # [bq, Dh]
  # fp32 is the accuracy path: IEEE dots, not Triton's TF32 default (bf16/fp16 use tensor cores).
  precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
  token = lax.div(tile * block_q + jnp.arange(block_q), group)     # [bq] new-token index per row

  def update(carry, k, v, visible):
    acc, m, l = carry
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                        preferred_element_type=jnp.float32) * scale   # [bq, bk]
    s = jnp.where(visible, s, -jnp.inf)
    m_new = jnp.maximum(m, s.max(axis=1))
    p = jnp.exp(s - m_new[:, None])
    alpha = jnp.exp(m - m_new)
    pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision=precision,
                         preferred_element_type=jnp.float32)          # [bq, Dh]
    return alpha[:, None] * acc + pv, m_new, alpha * l + p.sum(axis=1)

  def prefix_step(j, carry):
    cols = j * block_k + jnp.arange(block_k)
    k, v, valid = fetch_prefix(j)
    return update(carry, k, v, (valid & (cols < prefix_len))[None, :])

  def new_step(c, carry):   # causal: c is a loop index
    u = c * block_new + jnp.arange(block_new)
    k, v, exists = fetch_new(c)
    return update(carry, k, v, (u[None, :] <= token[:, None]) & exists[None, :])

  def tree_step(c: int, carry, enabled):   # tree mask: c is static
    k, v, exists = fetch_new(c)
    seen = tm_ref[:, pl.ds(c * block_new, block_new)] != 0
    return update(carry, k, v, seen & exists[None, :] & enabled)

  carry = (jnp.zeros((block_q, head_dim), jnp.float32),
           jnp.full((block_q,), _M_INIT, jnp.float32),
           jnp.zeros((block_q,), jnp.float32))
  # This split's even share of the prefix blocks below `prefix_len`; blocks past it are never read.
  num_blocks = pl.cdiv(prefix_len, block_k)
  per_split = pl.cdiv(num_blocks, num_splits)
  first = split * per_split
  carry = lax.fori_loop(first, jnp.minimum(first + per_split, num_blocks), prefix_step, carry)
  # The new keys go to the last split only.
  if tm_ref is None:   # causal: this tile's last token sees no new key past itself
    span = jnp.minimum(num_new, lax.div((tile + 1) * block_q - 1, group) + 1)
    chunks = jnp.where(split == num_splits - 1, pl.cdiv(span, block_new), 0)
    acc, m, l = lax.fori_loop(0, chunks, new_step, carry)
  else:   # unrolled: the tree's few chunks (a loop here failed Triton's scf.for check on jax 0.11)
    for c in range(pl.cdiv(num_new, block_new)):
      carry = tree_step(c, carry, split == num_splits - 1)
    acc, m, l = carry
  seen_any = l > 0
  l = jnp.where(seen_any, l, 1.0)
  o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
  if lse_ref is not None:
    lse_ref[...] = jnp.where(seen_any, m + jnp.log(l), -jnp.inf)


def _contiguous_kernel(lengths_ref, q_ref, k_ref, v_ref, *refs, tree: bool, split_kv: bool,
                       **static):
  tm_ref = refs[0] if tree else None
  o_ref, lse_ref = refs[tree:] if split_kv else (refs[tree], None)
  length = lengths_ref[0]
  kv_len = k_ref.shape[0]
  block_k, block_new = static["block_k"], static["block_new"]

  prefix_len = jnp.minimum(length, kv_len)

  def fetch_prefix(j):
    start = pl.multiple_of(j * block_k, block_k)
    valid = start + jnp.arange(block_k) < prefix_len
    k = pltriton.load(k_ref.at[pl.ds(start, block_k), :], mask=valid[:, None], other=0.0)
    v = pltriton.load(v_ref.at[pl.ds(start, block_k), :], mask=valid[:, None], other=0.0)
    return k, v, valid

  def fetch_new(c):
    start = length + c * block_new
    slot = start + jnp.arange(block_new)
    # Keys past the cache were dropped when written: they do not exist.
    exists = (slot < length + static["num_new"]) & (slot < kv_len)
    k = pltriton.load(k_ref.at[pl.ds(start, block_new), :], mask=exists[:, None], other=0.0)
    v = pltriton.load(v_ref.at[pl.ds(start, block_new), :], mask=exists[:, None], other=0.0)
    return k, v, exists

  attend_tile(q_ref, tm_ref, o_ref, lse_ref, prefix_len=prefix_len, fetch_prefix=fetch_prefix,
              fetch_new=fetch_new, **static)








def out_shapes(b: int, kvh: int, rows: int, dh: int, block_q: int, num_splits: int, dtype):
  """(out_shape, out_specs) for grid (B, KVH, tiles, splits): the rows themselves when unsplit, else
  fp32 normalised partials and their log-sum-exp per split."""
  if num_splits == 1:
    return (jax.ShapeDtypeStruct((b, kvh, rows, dh), dtype),
            pl.BlockSpec((None, None, block_q, dh), lambda i, h, r, s: (i, h, r, 0)))
  return ((jax.ShapeDtypeStruct((b, kvh, num_splits, rows, dh), jnp.float32),
           jax.ShapeDtypeStruct((b, kvh, num_splits, rows), jnp.float32)),
          (pl.BlockSpec((None, None, None, block_q, dh), lambda i, h, r, s: (i, h, s, r, 0)),
           pl.BlockSpec((None, None, None, block_q), lambda i, h, r, s: (i, h, s, r))))


@functools.partial(jax.jit, static_argnames=("block_k", "block_q", "num_splits", "num_warps",
                                             "num_stages", "interpret"))
def verify_attention_kernel(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array,
                            tree_mask: jax.Array | None = None, *, block_k: int = 64,
                            block_q: int | None = None, num_splits: int = 1,
                            num_warps: int | None = None, num_stages: int = 2,
                            interpret: bool = False) -> jax.Array:
  """Same contract as `verify_attention_reference` (inputs validated by the api), except that a row
  which sees no key at all gets zeros instead of NaN.

  Grid (B, KVH, query tiles, KV splits). Query rows are packed token-major (row r = token r // G,
  head r % G of the group), padded to a power of two; more than MAX_BLOCK_Q rows (prefill) take
  several tiles, so any T runs here. Each program walks its split's share of the committed prefix
  [0, lengths[b]) in block_k blocks, then (last split only) the T new keys at lengths[b] + u under
  the causal or tree mask, and writes its rows normalised plus their log-sum-exp;
  `packing.unpack_output` merges the splits in jnp.
  """
  b, t, hq, dh = q.shape
  kv_len, kvh = k.shape[1], k.shape[2]
  group = hq // kvh
  block_q = block_q or default_block_q(group * t)
  block_new = new_block(block_k, t)
  tree_cols = pl.cdiv(t, block_new) * block_new
  check_config(head_dim=dh, dtype=q.dtype, block_q=block_q, block_k=block_k,
               num_splits=num_splits, num_stages=num_stages,
               tree_cols=0 if tree_mask is None else tree_cols)
  qp = pack_queries(q, kvh, block_q)                                # [B, KVH, R, Dh]
  rows = qp.shape[2]
  grid = (b, kvh, rows // block_q, num_splits)
  kv_spec = pl.BlockSpec((None, kv_len, None, dh), lambda i, h, r, s: (i, 0, h, 0))
  in_specs = [pl.BlockSpec((1,), lambda i, h, r, s: (i,)),
              pl.BlockSpec((None, None, block_q, dh), lambda i, h, r, s: (i, h, r, 0)),
              kv_spec, kv_spec]
  args = [lengths.astype(jnp.int32), qp, k, v]
  if tree_mask is not None:
    in_specs.append(pl.BlockSpec((None, block_q, tree_cols), lambda i, h, r, s: (i, r, 0)))
    args.append(pack_tree_mask(tree_mask, group, rows, tree_cols))
  out_shape, out_specs = out_shapes(b, kvh, rows, dh, block_q, num_splits, q.dtype)
  kernel = functools.partial(
      _contiguous_kernel, tree=tree_mask is not None, split_kv=num_splits > 1, group=group,
      num_new=t, block_k=block_k, block_new=block_new, num_splits=num_splits, scale=dh ** -0.5)
  out = pl.pallas_call(
      kernel, out_shape=out_shape, grid=grid, in_specs=in_specs, out_specs=out_specs,
      compiler_params=compiler_params(block_q, block_k, num_warps, num_stages),
      interpret=interpret, name=f"verify_attention_bq{block_q}_bk{block_k}_s{num_splits}",
  )(*args)
  o, lse = out if num_splits > 1 else (out, None)
  return unpack_output(o, lse, q.shape, q.dtype)
