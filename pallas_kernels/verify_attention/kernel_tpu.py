"""Verification attention as a Mosaic-TPU Pallas kernel, contiguous and paged caches.

Grid (B, query tiles, KV splits, KV blocks); the last axis walks this split's share of the row's
visible slots [0, min(lengths[b] + T, capacity)) one VMEM block at a time (the pipeline prefetches
the next block while this one computes), with the online-softmax state in VMEM scratch. One program
serves every KV head of the row: K/V blocks are [block_k, KVH, Dh] tiles of the model's own cache
layout [B, S, KVH, Dh] (the TPU block rule then holds for any KVH and Dh, since the last two block
dimensions are whole), and each KV head's G*T query rows share one packed [block_q, Dh] tile.

The new tokens' keys sit in the cache at lengths[b] .. lengths[b]+T-1, like the prefix; a slot's
visibility comes from 2-D iotas (prefix, causal), and for a tree mask from a small matmul of the
packed [block_q, T] mask with the block's one-hot slot-to-token map (no gathers inside the kernel).
Block indices come from scalar-prefetched lengths (and block tables), clamped so that blocks past
a row's end are never fetched.

Layout choices: block_q is a multiple of 8 rows for float32 and 16 for bfloat16 (the sublane tile;
bf16 packs two rows per sublane); block_k is a multiple of 128 (the score tile's lane dimension) or
the whole cache when that is shorter; a paged block is one page, whose size must be a multiple of
the sublane tile (128 or more keeps the score tiles full). fp16 has no TPU matmul path: use bf16.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.verify_attention.packing import pack_queries, pack_tree_mask, unpack_output
from pallas_kernels.verify_attention.reference import normalize_tables

DTYPES = (jnp.float32, jnp.bfloat16)
LANES = 128
VMEM_BUDGET = 16 * 2**20     # the default scoped VMEM limit on v5e (v6e/v7x: 32 MiB)
MAX_BLOCK_Q = 256
_M_INIT = -1e30              # finite, so a row that has seen nothing yet stays NaN-free


def sublanes(dtype) -> int:
  """Rows per (sublane, 128-lane) tile: 8 for 32-bit types, 16 for bf16."""
  return 8 * (4 // jnp.dtype(dtype).itemsize)


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def default_block_q(rows: int, dtype) -> int:
  return min(MAX_BLOCK_Q, _round_up(rows, sublanes(dtype)))


def default_block_k(kv_len: int) -> int:
  """The whole cache up to 128 slots, else 128, or 256 (two score tiles) past 256 slots."""
  return kv_len if kv_len <= LANES else 2 * LANES if kv_len > 2 * LANES else LANES


def unsupported(dtype) -> str | None:
  if jnp.dtype(dtype) not in [jnp.dtype(d) for d in DTYPES]:
    return f"dtype {jnp.dtype(dtype)} (the TPU kernel takes float32/bfloat16)"
  return None


def vmem_bytes(*, kvh: int, head_dim: int, dtype, block_q: int, block_k: int, t: int,
               tree: bool, split: bool) -> int:
  """VMEM of one program, padded to (sublane, lane) tiles: double-buffered q/K/V/out/mask blocks
  and the fp32 scratch."""
  item = jnp.dtype(dtype).itemsize
  dh = _round_up(head_dim, LANES)
  kv = 2 * 2 * block_k * _round_up(kvh, sublanes(dtype)) * dh * item
  q = 2 * kvh * block_q * dh * item
  out = 2 * kvh * block_q * (dh * (4 if split else item) + (LANES * 4 if split else 0))
  mask = 2 * block_q * _round_up(t, LANES) * 4 if tree else 0
  scratch = kvh * block_q * (dh + 2 * LANES) * 4
  return kv + q + out + mask + scratch


def check_config(*, kvh: int, head_dim: int, dtype, block_q: int, block_k: int, num_splits: int,
                 t: int, tree: bool, paged: bool, kv_len: int) -> None:
  """Raises ValueError for tiles that break the TPU layout rules or overflow VMEM. Interpret mode
  checks none of this, so the CPU tests only pass configurations a TPU also accepts."""
  reason = unsupported(dtype)
  if reason is not None:
    raise ValueError(f"verify_attention TPU kernel cannot serve {reason}; cast to bfloat16 or use "
                     "impl='reference'")
  sub = sublanes(dtype)
  if block_q < sub or block_q % sub:
    raise ValueError(f"block_q must be a positive multiple of {sub} for {jnp.dtype(dtype)} on TPU "
                     f"(the sublane tile), got {block_q}")
  if paged and block_k % sub:
    raise ValueError(f"page_size must be a multiple of {sub} for {jnp.dtype(dtype)} on TPU (the "
                     f"sublane tile; 128 or more fills the score tiles), got {block_k}")
  if not paged and block_k != kv_len and (block_k < LANES or block_k % LANES):
    raise ValueError(f"block_k must be a positive multiple of {LANES} on TPU (the lane width of "
                     f"the score tile) or the whole cache ({kv_len}), got {block_k}")
  if num_splits < 1:
    raise ValueError(f"num_splits must be >= 1, got {num_splits}")
  need = vmem_bytes(kvh=kvh, head_dim=head_dim, dtype=dtype, block_q=block_q, block_k=block_k,
                    t=t, tree=tree, split=num_splits > 1)
  if need > VMEM_BUDGET:
    raise ValueError(f"block_q={block_q}, block_k={block_k} need ~{need >> 10} KiB of VMEM, over "
                     f"the {VMEM_BUDGET >> 20} MiB budget; lower block_k (or the page size) or "
                     "block_q")


def kv_block(lengths_ref, b, s, j, *, num_new: int, capacity: int, block_k: int,
             num_splits: int):
  """(logical KV block of grid step (b, s, j) clamped to the row's last one, whether it is live):
  the row's visible blocks cover [0, min(lengths[b] + T, capacity)), evenly split."""
  end = jnp.minimum(lengths_ref[b] + num_new, capacity)
  blocks = lax.div(end + block_k - 1, block_k)
  per_split = lax.div(blocks + num_splits - 1, num_splits)
  idx = s * per_split + j
  return jnp.minimum(idx, blocks - 1), (j < per_split) & (idx < blocks)


def _kernel(*refs, tree: bool, split_kv: bool, paged: bool, kvh: int, group: int, num_new: int,
            block_k: int, capacity: int, num_splits: int, scale: float):
  lengths_ref = refs[0]
  tables_ref = refs[1] if paged else None
  q_ref, k_ref, v_ref = refs[1 + paged:4 + paged]
  rest = refs[4 + paged:]
  tm_ref, rest = (rest[0], rest[1:]) if tree else (None, rest)
  o_ref, lse_ref, rest = (rest[0], rest[1], rest[2:]) if split_kv else (rest[0], None, rest[1:])
  m_ref, l_ref, acc_ref = rest
  b, tile, split, j = (pl.program_id(i) for i in range(4))
  block_q = q_ref.shape[1]
  length = lengths_ref[b]
  blk, live = kv_block(lengths_ref, b, split, j, num_new=num_new, capacity=capacity,
                       block_k=block_k, num_splits=num_splits)

  @pl.when(j == 0)
  def _init():
    m_ref[...] = jnp.full(m_ref.shape, _M_INIT, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

  @pl.when(live)
  def _step():
    shape = (block_q, block_k)
    col = blk * block_k + lax.broadcasted_iota(jnp.int32, shape, 1)     # cache slot per column
    u = col - length                                                   # index among new tokens
    is_new = (u >= 0) & (u < num_new) & (col < capacity)
    if tm_ref is None:
      token = lax.div(tile * block_q + lax.broadcasted_iota(jnp.int32, shape, 0), group)
      allowed = u <= token
    else:   # [bq, T] @ one-hot [T, bk]: tree_mask[token, u] for every (row, slot)
      onehot = (blk * block_k + lax.broadcasted_iota(jnp.int32, (num_new, block_k), 1) - length
                == lax.broadcasted_iota(jnp.int32, (num_new, block_k), 0)).astype(jnp.float32)
      allowed = jnp.dot(tm_ref[...], onehot, preferred_element_type=jnp.float32) > 0.5
    # a block in no page (table entry -1) holds no key
    in_page = tables_ref[b * (capacity // block_k) + blk] >= 0 if paged else True
    visible = ((col < length) | (is_new & allowed)) & (col < capacity) & in_page
    # Slots past the row's end may hold anything (another row's pages, never-written memory):
    # zero V there, so that a 0 probability cannot meet an inf or NaN.
    v_slot = blk * block_k + lax.broadcasted_iota(jnp.int32, (block_k, q_ref.shape[2]), 0)
    v_ok = (v_slot < jnp.minimum(length + num_new, capacity)) & in_page
    precision = lax.Precision.HIGHEST if q_ref.dtype == jnp.float32 else None
    for h in range(kvh):   # static: every KV head of this row shares the fetched block
      q = q_ref[h]                                                     # [bq, Dh]
      k = k_ref[:, h, :]                                               # [bk, Dh]
      v = jnp.where(v_ok, v_ref[:, h, :], 0)
      s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                          preferred_element_type=jnp.float32) * scale  # [bq, bk]
      s = jnp.where(visible, s, -jnp.inf)
      m_prev = m_ref[h][:, :1]                                         # [bq, 1]
      m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
      p = jnp.exp(s - m_new)
      alpha = jnp.exp(m_prev - m_new)
      pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision=precision,
                           preferred_element_type=jnp.float32)         # [bq, Dh]
      acc_ref[h] = alpha * acc_ref[h] + pv
      l_ref[h] = jnp.broadcast_to(alpha * l_ref[h][:, :1] + p.sum(axis=1, keepdims=True),
                                  (block_q, LANES))
      m_ref[h] = jnp.broadcast_to(m_new, (block_q, LANES))

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    for h in range(kvh):
      l = l_ref[h][:, :1]
      seen = l > 0
      o_ref[h] = (acc_ref[h] / jnp.where(seen, l, 1.0)).astype(o_ref.dtype)
      if lse_ref is not None:
        lse_ref[h] = jnp.where(seen, m_ref[h][:, :1] + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)


def _call(q, k, v, lengths, tree_mask, tables, *, block_k: int, block_q: int | None,
          num_splits: int, interpret: bool):
  """Shared by the contiguous (tables None; k/v [B, S, KVH, Dh]) and paged (k/v pages [P, page,
  KVH, Dh], tables [B, N]) kernels."""
  b, t, hq, dh = q.shape
  paged = tables is not None
  kvh = k.shape[2]
  group = hq // kvh
  capacity = tables.shape[1] * k.shape[1] if paged else k.shape[1]
  block_q = block_q or default_block_q(group * t, q.dtype)
  check_config(kvh=kvh, head_dim=dh, dtype=q.dtype, block_q=block_q, block_k=block_k,
               num_splits=num_splits, t=t, tree=tree_mask is not None, paged=paged,
               kv_len=capacity)
  qp = pack_queries(q, kvh, block_q)                                   # [B, KVH, R, Dh]
  rows = qp.shape[2]
  steps = -(-(-(-capacity // block_k)) // num_splits)                  # KV blocks per split, max
  grid = (b, rows // block_q, num_splits, steps)
  where = functools.partial(kv_block, num_new=t, capacity=capacity, block_k=block_k,
                            num_splits=num_splits)
  if paged:
    num_pages = tables.shape[1]

    def kv_map(i, r, s, j, lengths_ref, tables_ref):
      return jnp.maximum(tables_ref[i * num_pages + where(lengths_ref, i, s, j)[0]], 0), 0, 0, 0
    kv_spec = pl.BlockSpec((None, block_k, kvh, dh), kv_map)
    prefetch = (lengths.astype(jnp.int32), tables.reshape(-1).astype(jnp.int32))
  else:
    def kv_map(i, r, s, j, lengths_ref):
      return i, where(lengths_ref, i, s, j)[0], 0, 0
    kv_spec = pl.BlockSpec((None, block_k, kvh, dh), kv_map)
    prefetch = (lengths.astype(jnp.int32),)
  in_specs = [pl.BlockSpec((None, kvh, block_q, dh), lambda i, r, s, j, *_: (i, 0, r, 0)),
              kv_spec, kv_spec]
  args = [qp, k, v]
  if tree_mask is not None:
    in_specs.append(pl.BlockSpec((None, block_q, t), lambda i, r, s, j, *_: (i, r, 0)))
    args.append(pack_tree_mask(tree_mask, group, rows, t, jnp.float32))
  if num_splits == 1:
    out_shape = jax.ShapeDtypeStruct((b, kvh, rows, dh), q.dtype)
    out_specs = pl.BlockSpec((None, kvh, block_q, dh), lambda i, r, s, j, *_: (i, 0, r, 0))
  else:
    out_shape = (jax.ShapeDtypeStruct((b, kvh, num_splits, rows, dh), jnp.float32),
                 jax.ShapeDtypeStruct((b, kvh, num_splits, rows, 1), jnp.float32))
    split_map = lambda i, r, s, j, *_: (i, 0, s, r, 0)
    out_specs = (pl.BlockSpec((None, kvh, None, block_q, dh), split_map),
                 pl.BlockSpec((None, kvh, None, block_q, 1), split_map))
  kernel = functools.partial(
      _kernel, tree=tree_mask is not None, split_kv=num_splits > 1, paged=paged, kvh=kvh,
      group=group, num_new=t, block_k=block_k, capacity=capacity, num_splits=num_splits,
      scale=dh ** -0.5)
  scratch = [pltpu.VMEM((kvh, block_q, LANES), jnp.float32),
             pltpu.VMEM((kvh, block_q, LANES), jnp.float32),
             pltpu.VMEM((kvh, block_q, dh), jnp.float32)]
  out = pl.pallas_call(
      kernel, out_shape=out_shape,
      grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=len(prefetch), grid=grid,
                                             in_specs=in_specs, out_specs=out_specs,
                                             scratch_shapes=scratch),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
      interpret=pltpu.InterpretParams() if interpret else False,
      name=f"verify_attention_tpu_bq{block_q}_bk{block_k}_s{num_splits}{'_paged' * paged}",
  )(*prefetch, *args)
  o, lse = out if num_splits > 1 else (out, None)
  return unpack_output(o, None if lse is None else lse[..., 0], q.shape, q.dtype)


@functools.partial(jax.jit, static_argnames=("block_k", "block_q", "num_splits", "interpret"))
def verify_attention_kernel(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array,
                            tree_mask: jax.Array | None = None, *, block_k: int | None = None,
                            block_q: int | None = None, num_splits: int = 1,
                            interpret: bool = False) -> jax.Array:
  """Same contract as `verify_attention_reference` (inputs validated by the api), except that a row
  which sees no key at all gets zeros instead of NaN. q must have k's dtype (the api casts)."""
  return _call(q, k, v, lengths, tree_mask, None, block_k=block_k or default_block_k(k.shape[1]),
               block_q=block_q, num_splits=num_splits, interpret=interpret)


@functools.partial(jax.jit, static_argnames=("block_q", "num_splits", "interpret"))
def paged_verify_attention_kernel(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
                                  block_tables: jax.Array, lengths: jax.Array,
                                  tree_mask: jax.Array | None = None, *, block_q: int | None = None,
                                  num_splits: int = 1, interpret: bool = False) -> jax.Array:
  """Same contract as `paged_verify_attention_reference`; one page per KV block, its index read
  from the scalar-prefetched block table (an entry outside the pool, -1, is no page)."""
  tables = normalize_tables(block_tables, k_pages.shape[0])
  return _call(q, k_pages, v_pages, lengths, tree_mask, tables, block_k=k_pages.shape[1],
               block_q=block_q, num_splits=num_splits, interpret=interpret)
