"""Verification attention over a paged KV cache: a gather-then-reference oracle and a Pallas kernel
that follows each row's block table inside the kernel (gathered page indices, as Triton allows).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.verify_attention import kernel_gpu as kern
from pallas_kernels.verify_attention.packing import pack_queries, pack_tree_mask, unpack_output
from pallas_kernels.verify_attention.reference import normalize_tables






def _paged_kernel(lengths_ref, tables_ref, q_ref, k_ref, v_ref, *refs, tree: bool, split_kv: bool,
                  capacity: int, **static):
  tm_ref = refs[0] if tree else None
  o_ref, lse_ref = refs[tree:] if split_kv else (refs[tree], None)
  length = lengths_ref[0]
  page_size = k_ref.shape[1]
  block_k, block_new = static["block_k"], static["block_new"]
  pages_per_block = block_k // page_size

  prefix_len = jnp.minimum(length, capacity)

  def fetch_prefix(j):
    slot = j * block_k + jnp.arange(block_k)
    entry = tables_ref[jax.lax.div(slot, page_size)]                    # [bk]; < 0: no page
    start = pl.multiple_of(j * pages_per_block, pages_per_block)
    pages = jnp.maximum(tables_ref[pl.ds(start, pages_per_block)], 0)   # [pages_per_block]
    # Slots past the prefix or in no page may hold anything: zero V there so that a 0 weight
    # cannot meet an inf or NaN.
    valid = (slot < prefix_len) & (entry >= 0)
    k = k_ref[pages].reshape(block_k, -1)                               # [bk, Dh]
    v = jnp.where(valid[:, None], v_ref[pages].reshape(block_k, -1), 0)
    return k, v, valid

  def fetch_new(c):
    slot = length + c * block_new + jnp.arange(block_new)               # logical slots
    exists = (slot < length + static["num_new"]) & (slot < capacity)
    slot = jnp.where(exists, slot, 0)
    page = tables_ref[jax.lax.div(slot, page_size)]                     # [block_new]
    exists = exists & (page >= 0)                                       # a key in no page is none
    page = jnp.maximum(page, 0)
    offset = slot % page_size
    k = jnp.where(exists[:, None], k_ref[page, offset], 0)              # [block_new, Dh]
    v = jnp.where(exists[:, None], v_ref[page, offset], 0)
    return k, v, exists

  kern.attend_tile(q_ref, tm_ref, o_ref, lse_ref, prefix_len=prefix_len, fetch_prefix=fetch_prefix,
                   fetch_new=fetch_new, **static)


@functools.partial(jax.jit, static_argnames=("block_k", "block_q", "num_splits", "num_warps",
                                             "num_stages", "interpret"))
def paged_verify_attention_kernel(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
                                  block_tables: jax.Array, lengths: jax.Array,
                                  tree_mask: jax.Array | None = None, *, block_k: int = 64,
                                  block_q: int | None = None, num_splits: int = 1,
                                  num_warps: int | None = None, num_stages: int = 2,
                                  interpret: bool = False) -> jax.Array:
  """Same contract as `paged_verify_attention_reference` (a row that sees no key gets zeros).

  Pages k/v [P, page_size, KVH, Dh]; row b's logical slot s lives in page block_tables[b, s //
  page_size] at offset s % page_size; the logical capacity is pages_per_seq * page_size. A table
  entry outside [0, P) (the sentinel is -1) is no page: its slots hold no key (`reference.
  normalize_tables`). A prefix block is max(block_k, page_size) slots, whole pages gathered through
  the table; the new keys are gathered slot by slot. Grid and packing as in
  `kernel_gpu.verify_attention_kernel`.
  """
  b, t, hq, dh = q.shape
  num_pages, page_size, kvh, _ = k_pages.shape
  if not kern.is_pow2(page_size):
    raise ValueError(f"page_size must be a power of two for the Triton kernel, got {page_size}")
  block_k = max(block_k, page_size)
  group = hq // kvh
  block_q = block_q or kern.default_block_q(group * t)
  block_new = kern.new_block(block_k, t)
  tree_cols = pl.cdiv(t, block_new) * block_new
  kern.check_config(head_dim=dh, dtype=q.dtype, block_q=block_q, block_k=block_k,
                    num_splits=num_splits, num_stages=num_stages,
                    tree_cols=0 if tree_mask is None else tree_cols)
  pages_per_block = block_k // page_size
  capacity = block_tables.shape[1] * page_size
  # Whole blocks of table entries; the padding is no page (and past the capacity anyway).
  tables = normalize_tables(block_tables, num_pages)
  tables = jnp.pad(tables, ((0, 0), (0, -tables.shape[1] % pages_per_block)), constant_values=-1)
  qp = pack_queries(q, kvh, block_q)                               # [B, KVH, R, Dh]
  rows = qp.shape[2]
  grid = (b, kvh, rows // block_q, num_splits)
  page_spec = pl.BlockSpec((num_pages, page_size, None, dh), lambda i, h, r, s: (0, 0, h, 0))
  in_specs = [pl.BlockSpec((1,), lambda i, h, r, s: (i,)),
              pl.BlockSpec((None, tables.shape[1]), lambda i, h, r, s: (i, 0)),
              pl.BlockSpec((None, None, block_q, dh), lambda i, h, r, s: (i, h, r, 0)),
              page_spec, page_spec]
  args = [lengths.astype(jnp.int32), tables, qp, k_pages, v_pages]
  if tree_mask is not None:
    in_specs.append(pl.BlockSpec((None, block_q, tree_cols), lambda i, h, r, s: (i, r, 0)))
    args.append(pack_tree_mask(tree_mask, group, rows, tree_cols))
  out_shape, out_specs = kern.out_shapes(b, kvh, rows, dh, block_q, num_splits, q.dtype)
  kernel = functools.partial(
      _paged_kernel, tree=tree_mask is not None, split_kv=num_splits > 1, capacity=capacity,
      group=group, num_new=t, block_k=block_k, block_new=block_new, num_splits=num_splits,
      scale=dh ** -0.5)
  out = pl.pallas_call(
      kernel, out_shape=out_shape, grid=grid, in_specs=in_specs, out_specs=out_specs,
      compiler_params=kern.compiler_params(block_q, block_k, num_warps, num_stages),
      interpret=interpret, name=f"paged_verify_attention_bq{block_q}_bk{block_k}_s{num_splits}",
  )(*args)
  o, lse = out if num_splits > 1 else (out, None)
  return unpack_output(o, lse, q.shape, q.dtype)
