"""Grouped GEMM on TPU through jax's own Mosaic-TPU kernels (megablox `gmm` / `tgmm`), under
jspec's `gmm` contract: rows past sum(group_sizes) come out zero (megablox leaves them unwritten),
M need not be a tile multiple, and a custom VJP gives d_lhs (zero on padding rows), d_rhs and a
float0 cotangent for the group sizes.

Why megablox rather than a kernel of our own: it already schedules row tiles over groups with
scalar-prefetched metadata (a tile that straddles two groups is visited once per group), tiles K and
N with masked remainders, and has the weight-gradient kernel; the GPU kernel (`kernel_gpu.py`)
implements the same contract for Triton.
"""

from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu as pltpu

# The module itself: the package re-exports its custom-VJP `gmm` under the module's name.
megablox = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")

DTYPES = (jnp.float32, jnp.bfloat16)
LANES = 128


def sublanes(dtype) -> int:
  return 8 * (4 // jnp.dtype(dtype).itemsize)


def default_tiling(m: int, k: int, n: int, dtype) -> tuple[int, int, int]:
  """(tm, tk, tn): 128 rows (fewer, on a sublane multiple, for small M); 128-lane K and N tiles,
  or the whole dimension where it is narrower than one tile (the TPU block rule)."""
  sub = sublanes(dtype)
  tm = min(128, -(-m // sub) * sub)
  return tm, (LANES if k >= LANES else k), (LANES if n >= LANES else n)


def check_tiling(tiling, m: int, k: int, n: int, dtype) -> None:
  """Raises ValueError for tiles that break the TPU layout rules (what to change in the message)."""
  if jnp.dtype(dtype) not in [jnp.dtype(d) for d in DTYPES]:
    raise ValueError(f"gmm TPU kernel (megablox) takes float32/bfloat16, got {jnp.dtype(dtype)}: "
                     "cast, or use impl='reference'")
  if not (isinstance(tiling, tuple) and len(tiling) == 3 and all(isinstance(x, int) and x > 0
                                                                  for x in tiling)):
    raise ValueError(f"gmm TPU tiling must be a (tm, tk, tn) tuple of positive ints, got "
                     f"{tiling!r}")
  tm, tk, tn = tiling
  sub = sublanes(dtype)
  if tm % sub:
    raise ValueError(f"gmm TPU tiling: tm={tm} must be a multiple of {sub} for "
                     f"{jnp.dtype(dtype)} (the sublane tile)")
  for name, tile, dim in (("tk", tk, k), ("tn", tn, n)):
    if tile % LANES and tile != dim:
      raise ValueError(f"gmm TPU tiling: {name}={tile} must be a multiple of {LANES} (the lane "
                       f"width) or the whole dimension ({dim})")


def _interpret(interpret: bool):
  return pltpu.InterpretParams() if interpret else False


def _rows_inside(group_sizes: jax.Array, m: int) -> jax.Array:
  return (jnp.arange(m, dtype=jnp.int32) < jnp.sum(group_sizes))[:, None]       # [M, 1]


def _gmm_call(lhs, rhs, group_sizes, tiling, interpret, transpose_rhs=False):
  m = lhs.shape[0]
  lhs_p = jnp.pad(lhs, ((0, -m % tiling[0]), (0, 0)))
  out = megablox.gmm(lhs_p, rhs, group_sizes, lhs.dtype, tiling, None, None,
                     transpose_rhs=transpose_rhs, interpret=_interpret(interpret))[:m]
  return jnp.where(_rows_inside(group_sizes, m), out, 0).astype(lhs.dtype)


def _tgmm_call(lhs, grad, group_sizes, tiling, interpret):
  """[E, K, N] per-group lhs^T @ grad; the rows past the groups are zeroed first, so that whatever
  a caller's cotangent holds there (inf, NaN) cannot reach a weight gradient."""
  m = lhs.shape[0]
  inside = _rows_inside(group_sizes, m)
  pad = ((0, -m % tiling[0]), (0, 0))
  lhs_t = jnp.pad(jnp.where(inside, lhs, 0), pad).swapaxes(0, 1)             # [K, Mp]
  grad_p = jnp.pad(jnp.where(inside, grad, 0), pad)                            # [Mp, N]
  return megablox.tgmm(lhs_t, grad_p, group_sizes, lhs.dtype, tiling,
                       interpret=_interpret(interpret))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _gmm(lhs, rhs, group_sizes, tiling, interpret):
  return _gmm_call(lhs, rhs, group_sizes, tiling, interpret)


def _gmm_fwd(lhs, rhs, group_sizes, tiling, interpret):
  return _gmm(lhs, rhs, group_sizes, tiling, interpret), (lhs, rhs, group_sizes)


def _gmm_bwd(tiling, interpret, res, g):
  lhs, rhs, group_sizes = res
  tm, tk, tn = tiling
  d_lhs = _gmm_call(g.astype(lhs.dtype), rhs, group_sizes, (tm, tn, tk), interpret,
                    transpose_rhs=True)                                          # [M, K]
  d_rhs = _tgmm_call(lhs, g.astype(lhs.dtype), group_sizes, tiling, interpret)  # [E, K, N]
  return d_lhs, d_rhs.astype(rhs.dtype), np.zeros(group_sizes.shape, jax.dtypes.float0)


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


@functools.partial(jax.jit, static_argnames=("tiling", "interpret"))
def gmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
        tiling: tuple[int, int, int] | None = None, interpret: bool = False) -> jax.Array:
  """lhs [M, K], rhs [E, K, N], group_sizes [E] int32 -> [M, N] in lhs.dtype; rows past
  sum(group_sizes) are zero. fp32 accumulation. interpret: run under `pltpu.InterpretParams`."""
  (m, k), n = lhs.shape, rhs.shape[2]
  if lhs.dtype != rhs.dtype:
    raise ValueError(f"gmm TPU kernel operands must share one dtype, got {lhs.dtype} and "
                     f"{rhs.dtype}")
  tiling = tiling or default_tiling(m, k, n, lhs.dtype)
  check_tiling(tiling, m, k, n, lhs.dtype)
  return _gmm(lhs, rhs, group_sizes.astype(jnp.int32), tiling, interpret)
