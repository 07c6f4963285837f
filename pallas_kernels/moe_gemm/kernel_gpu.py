"""Grouped GEMM (`gmm`, custom VJP) and its weight gradient (`tgmm`) as Triton-style pallas_calls:
GPU via Pallas' Triton lowering, CPU with interpret=True; the wrappers check the GPU tiling limits.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from pallas_kernels.triton_tiling import Tiling, pad_to_multiple

KERNEL_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def default_tiling(m: int, k: int, n: int) -> Tiling:
  """128x128x64 tiles, shrunk (to powers of two >= 16) for problems smaller than one tile."""
  fit = lambda size, cap: min(cap, max(16, 1 << (size - 1).bit_length()))
  return Tiling(block_m=fit(m, 128), block_n=fit(n, 128), block_k=fit(k, 64))


def _precision(dtype):
  # fp32 inputs get true fp32 products (Triton would otherwise use TF32); 16-bit inputs are exact.
  return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else lax.Precision.DEFAULT


def _check_dtypes(a: jax.Array, b: jax.Array) -> None:
  if a.dtype != b.dtype or not any(a.dtype == d for d in KERNEL_DTYPES):
    raise ValueError(f"gmm kernel operands must share one dtype of float32/bfloat16/float16; got "
                     f"{a.dtype} and {b.dtype}.")


def group_bounds(group_sizes: jax.Array, num_rows: int) -> tuple[jax.Array, jax.Array]:
  """(starts, ends) [E] int32 row ranges of the groups; totals past num_rows are cut at num_rows."""
  ends = jnp.minimum(jnp.cumsum(group_sizes.astype(jnp.int32)), num_rows)
  starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
  return starts, ends


def visit_metadata(group_sizes: jax.Array, num_rows: int, padded_rows: int,
                   block_m: int) -> jax.Array:
  """[4, V] int32 rows (group, tile, row_lo, row_hi) for the V = tiles_m + E grid steps of `gmm`.

  Step v computes rows [row_lo, row_hi) of row tile `tile` for `group`. A tile that straddles group
  boundaries is visited once per group it touches; empty groups get no visit. Group E is the padding
  [total, padded_rows), whose visits store zeros; steps past the last visit get group E + 1 (idle).
  Counting: E + 1 ranges tile [0, padded_rows) with at most tiles_m + E (range, tile) pairs.
  """
  e = group_sizes.shape[0]
  tiles_m = padded_rows // block_m
  starts, ends = group_bounds(group_sizes, num_rows)
  starts = jnp.concatenate([starts, ends[-1:]])                                  # [E+1]
  ends = jnp.concatenate([ends, jnp.full((1,), padded_rows, jnp.int32)])         # [E+1]
  first = starts // block_m
  tiles = jnp.where(ends > starts, (ends - 1) // block_m - first + 1, 0)         # [E+1]
  visit_end = jnp.cumsum(tiles)
  v = jnp.arange(tiles_m + e, dtype=jnp.int32)                                  # [V]
  group = jnp.sum(visit_end[None, :] <= v[:, None], axis=1, dtype=jnp.int32)    # [V]
  idle = group > e
  g = jnp.minimum(group, e)
  tile = jnp.clip(first[g] + v - (visit_end[g] - tiles[g]), 0, tiles_m - 1)
  lo = jnp.where(idle, 0, jnp.maximum(starts[g], tile * block_m))
  hi = jnp.where(idle, 0, jnp.minimum(ends[g], (tile + 1) * block_m))
  return jnp.stack([group, tile, lo, hi])


def _gmm_kernel(meta_ref, lhs_ref, rhs_ref, out_ref, *, num_groups, block_m, block_k, k_tiles,
                transpose_rhs, precision):
  # meta_ref [4, V]; lhs_ref [Mp, Kp]; rhs_ref [E, Kp, bn] ([E, bn, Kp] if transposed);
  # out_ref [Mp, bn]
  v = pl.program_id(0)
  group, tile, lo, hi = meta_ref[0, v], meta_ref[1, v], meta_ref[2, v], meta_ref[3, v]
  block_n = out_ref.shape[1]
  row0 = pl.multiple_of(tile * block_m, block_m)
  rows = row0 + jnp.arange(block_m, dtype=jnp.int32)                            # [bm]
  mask = jnp.broadcast_to(((rows >= lo) & (rows < hi))[:, None], (block_m, block_n))
  out_tile = out_ref.at[pl.ds(row0, block_m), :]

  @pl.when(group < num_groups)
  def _compute():
    def step(kk, acc):
      k0 = pl.multiple_of(kk * block_k, block_k)
      x = lhs_ref[pl.ds(row0, block_m), pl.ds(k0, block_k)]                     # [bm, bk]
      if transpose_rhs:
        w = rhs_ref[group, :, pl.ds(k0, block_k)]                                # [bn, bk]
        dims = (((1,), (1,)), ((), ()))
      else:
        w = rhs_ref[group, pl.ds(k0, block_k), :]                                # [bk, bn]
        dims = (((1,), (0,)), ((), ()))
      return acc + lax.dot_general(x, w, dims, precision=precision,
                                   preferred_element_type=jnp.float32)
    acc = lax.fori_loop(0, k_tiles, step, jnp.zeros((block_m, block_n), jnp.float32))
    plt.store(out_tile, acc.astype(out_ref.dtype), mask=mask)

  @pl.when(group == num_groups)
  def _zero_padding():
    plt.store(out_tile, jnp.zeros((block_m, block_n), out_ref.dtype), mask=mask)


def _gmm_call(lhs, rhs, group_sizes, tiling: Tiling, interpret: bool, transpose_rhs: bool):
  """lhs [M, K] x rhs [E, K, N] (or [E, N, K] with transpose_rhs) -> [M, N] in lhs.dtype."""
  _check_dtypes(lhs, rhs)
  bm, bn, bk = tiling.block_m, tiling.block_n, tiling.block_k
  tiling.check(lhs.dtype.itemsize, bm * bk + bk * bn)
  m = lhs.shape[0]
  e = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  lhs_p = pad_to_multiple(pad_to_multiple(lhs, 0, bm), 1, bk)  # [Mp, Kp]
  if transpose_rhs:
    rhs_p = pad_to_multiple(pad_to_multiple(rhs, 1, bn), 2, bk)  # [E, Np, Kp]
    rhs_spec = pl.BlockSpec((e, bn, rhs_p.shape[2]), lambda v, j: (0, j, 0))
  else:
    rhs_p = pad_to_multiple(pad_to_multiple(rhs, 1, bk), 2, bn)  # [E, Kp, Np]
    rhs_spec = pl.BlockSpec((e, rhs_p.shape[1], bn), lambda v, j: (0, 0, j))
  mp, kp = lhs_p.shape
  np_ = n + (-n % bn)
  meta = visit_metadata(group_sizes, m, mp, bm)                                   # [4, V]
  kernel = functools.partial(_gmm_kernel, num_groups=e, block_m=bm, block_k=bk, k_tiles=kp // bk,
                             transpose_rhs=transpose_rhs, precision=_precision(lhs.dtype))
  out = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((mp, np_), lhs.dtype),
      grid=(meta.shape[1], np_ // bn),
      in_specs=[pl.BlockSpec(meta.shape, lambda v, j: (0, 0)),
                pl.BlockSpec((mp, kp), lambda v, j: (0, 0)),
                rhs_spec],
      out_specs=pl.BlockSpec((mp, bn), lambda v, j: (0, j)),
      compiler_params=plt.CompilerParams(num_warps=tiling.num_warps,
                                         num_stages=tiling.num_stages),
      interpret=interpret,
      name="jspec_gmm",
  )(meta, lhs_p, rhs_p)
  return out[:m, :n]


def _tgmm_kernel(bounds_ref, lhs_ref, grad_ref, out_ref, *, block_m, precision):
  # bounds_ref [2, E]; lhs_ref [Mp, bk]; grad_ref [Mp, bn]; out_ref [bk, bn] (group squeezed)
  g = pl.program_id(0)
  start, end = bounds_ref[0, g], bounds_ref[1, g]
  # lax.div (truncating; the bounds are >= 0) keeps floor_divide's sign fix-ups out of the kernel.
  first = lax.div(start, block_m)
  stop = jnp.where(end > start, lax.div(end + block_m - 1, block_m), first)

  def step(t, acc):
    row0 = pl.multiple_of(t * block_m, block_m)
    rows = row0 + jnp.arange(block_m, dtype=jnp.int32)                          # [bm]
    inside = ((rows >= start) & (rows < end))[:, None]
    # Both operands masked: rows of other groups (or padding) contract here, and 0 * inf = NaN.
    x = jnp.where(inside, lhs_ref[pl.ds(row0, block_m), :], 0)                   # [bm, bk]
    y = jnp.where(inside, grad_ref[pl.ds(row0, block_m), :], 0)                  # [bm, bn]
    return acc + lax.dot_general(x, y, (((0,), (0,)), ((), ())), precision=precision,
                                 preferred_element_type=jnp.float32)
  acc = lax.fori_loop(first, stop, step, jnp.zeros(out_ref.shape, jnp.float32))
  out_ref[...] = acc.astype(out_ref.dtype)


def _tgmm_call(lhs, grad, group_sizes, tiling: Tiling, interpret: bool):
  """lhs [M, K], grad [M, N] -> [E, K, N]: per-group lhs^T @ grad over the group's rows."""
  _check_dtypes(lhs, grad)
  bm, bn, bk = tiling.block_m, tiling.block_n, tiling.block_k
  tiling.check(lhs.dtype.itemsize, bm * bk + bm * bn)
  (m, k), n = lhs.shape, grad.shape[1]
  e = group_sizes.shape[0]
  lhs_p = pad_to_multiple(pad_to_multiple(lhs, 0, bm), 1, bk)  # [Mp, Kp]
  grad_p = pad_to_multiple(pad_to_multiple(grad, 0, bm), 1, bn)  # [Mp, Np]
  (mp, kp), np_ = lhs_p.shape, grad_p.shape[1]
  bounds = jnp.stack(group_bounds(group_sizes, m))                                # [2, E]
  out = pl.pallas_call(
      functools.partial(_tgmm_kernel, block_m=bm, precision=_precision(lhs.dtype)),
      out_shape=jax.ShapeDtypeStruct((e, kp, np_), lhs.dtype),
      grid=(e, kp // bk, np_ // bn),
      in_specs=[pl.BlockSpec((2, e), lambda g, i, j: (0, 0)),
                pl.BlockSpec((mp, bk), lambda g, i, j: (0, i)),
                pl.BlockSpec((mp, bn), lambda g, i, j: (0, j))],
      out_specs=pl.BlockSpec((None, bk, bn), lambda g, i, j: (g, i, j)),
      compiler_params=plt.CompilerParams(num_warps=tiling.num_warps,
                                         num_stages=tiling.num_stages),
      interpret=interpret,
      name="jspec_tgmm",
  )(bounds, lhs_p, grad_p)
  return out[:, :k, :n]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _gmm(lhs, rhs, group_sizes, tiling, interpret):
  return _gmm_call(lhs, rhs, group_sizes, tiling, interpret, transpose_rhs=False)


def _gmm_fwd(lhs, rhs, group_sizes, tiling, interpret):
  return _gmm(lhs, rhs, group_sizes, tiling, interpret), (lhs, rhs, group_sizes)


def _gmm_bwd(tiling, interpret, res, g):
  lhs, rhs, group_sizes = res
  d_lhs = _gmm_call(g, rhs, group_sizes, tiling, interpret, transpose_rhs=True)   # [M, K]
  # tgmm's tiles are [bm, bk] and [bm, bn]: bigger than gmm's when bm > bk, so maybe fewer stages.
  bm, bn, bk = tiling.block_m, tiling.block_n, tiling.block_k
  t_tiling = tiling.fit_stages(lhs.dtype.itemsize, bm * bk + bm * bn)
  d_rhs = _tgmm_call(lhs, g, group_sizes, t_tiling, interpret)                   # [E, K, N]
  return d_lhs, d_rhs, np.zeros(group_sizes.shape, jax.dtypes.float0)


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


@functools.partial(jax.jit, static_argnames=("tiling", "interpret"))
def gmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, tiling: Tiling | None = None,
        interpret: bool = False) -> jax.Array:
  """lhs [M, K], rhs [E, K, N], group_sizes [E] int32 (non-negative) -> [M, N] in lhs.dtype.

  Rows are sorted by group; rows past sum(group_sizes) output zeros. fp32 accumulation.
  """
  tiling = tiling or default_tiling(*lhs.shape, rhs.shape[2])
  return _gmm(lhs, rhs, group_sizes.astype(jnp.int32), tiling, interpret)


@functools.partial(jax.jit, static_argnames=("tiling", "interpret"))
def tgmm(lhs: jax.Array, grad: jax.Array, group_sizes: jax.Array, *, tiling: Tiling | None = None,
         interpret: bool = False) -> jax.Array:
  """lhs [M, K], grad [M, N], group_sizes [E] -> [E, K, N] in lhs.dtype (weight gradient of gmm)."""
  if tiling is None:
    tiling = default_tiling(*lhs.shape, grad.shape[1])
    tiling = tiling.fit_stages(lhs.dtype.itemsize,
                               tiling.block_m * (tiling.block_k + tiling.block_n))
  return _tgmm_call(lhs, grad, group_sizes.astype(jnp.int32), tiling, interpret)
