"""Weight-only int8 / bf16 matmul as a Triton-style pallas_call: each program holds a [bm, bn] tile
of y = x @ (q * scale)^T, walks K in blocks, converts the weight block to x's dtype in registers
(no dequantised copy of the weights in memory) and applies the per-row scale once at the end. GPU
via Pallas' Triton lowering, CPU with interpret=True (the tests)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from pallas_kernels.triton_tiling import Tiling, pad_to_multiple


# few rows (decode and verify)
DEFAULT_TILING = Tiling(block_m=16, block_n=64, block_k=64)


def _kernel(x_ref, q_ref, s_ref, o_ref, *, block_k: int, k_tiles: int, precision):
  # x_ref [bm, Kp]; q_ref [bn, Kp]; s_ref [bn]; o_ref [bm, bn]
  def step(kk, acc):
    k0 = pl.multiple_of(kk * block_k, block_k)
    x = x_ref[:, pl.ds(k0, block_k)]                                  # [bm, bk]
    w = q_ref[:, pl.ds(k0, block_k)].astype(x.dtype)                 # [bn, bk], in registers
    return acc + lax.dot_general(x, w, (((1,), (1,)), ((), ())), precision=precision,
                                 preferred_element_type=jnp.float32)
  bm, bn = o_ref.shape
  acc = lax.fori_loop(0, k_tiles, step, jnp.zeros((bm, bn), jnp.float32))
  o_ref[...] = acc * s_ref[...][None, :]


def weight_matmul(x: jax.Array, q: jax.Array, scale: jax.Array | None = None, *,
                  tiling: Tiling = DEFAULT_TILING, interpret: bool = False) -> jax.Array:
  """x [M, K] (float32 / bfloat16), q [N, K] int8 with scale [N], or bf16 without -> [M, N] f32."""
  if q.dtype == jnp.int8:
    if scale is None or scale.shape != (q.shape[0],):
      raise ValueError(f"int8 weights [N={q.shape[0]}, K] need a scale of shape [N], got "
                       f"{None if scale is None else scale.shape}")
  elif q.dtype == jnp.bfloat16:
    if scale is not None:
      raise ValueError("bf16 weights take no scale")
    scale = jnp.ones((q.shape[0],), jnp.float32)
  else:
    raise ValueError(f"weight_matmul reads int8 or bfloat16 weights, got {q.dtype}")
  if x.ndim != 2 or q.ndim != 2 or x.shape[1] != q.shape[1]:
    raise ValueError(f"x [M, K] and q [N, K] must share K, got {x.shape} and {q.shape}")
  bm, bn, bk = tiling.block_m, tiling.block_n, tiling.block_k
  tiling.check(max(x.dtype.itemsize, q.dtype.itemsize), bm * bk + bn * bk)
  m, n = x.shape[0], q.shape[0]
  x_p = pad_to_multiple(pad_to_multiple(x, 0, bm), 1, bk)
  q_p = pad_to_multiple(pad_to_multiple(q, 0, bn), 1, bk)
  s_p = pad_to_multiple(scale.astype(jnp.float32), 0, bn)
  mp, kp = x_p.shape
  np_ = q_p.shape[0]
  precision = lax.Precision.HIGHEST if x.dtype == jnp.float32 else lax.Precision.DEFAULT
  out = pl.pallas_call(
      functools.partial(_kernel, block_k=bk, k_tiles=kp // bk, precision=precision),
      out_shape=jax.ShapeDtypeStruct((mp, np_), jnp.float32),
      grid=(mp // bm, np_ // bn),
      in_specs=[pl.BlockSpec((bm, kp), lambda i, j: (i, 0)),
                pl.BlockSpec((bn, kp), lambda i, j: (j, 0)),
                pl.BlockSpec((bn,), lambda i, j: (j,))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
      compiler_params=plt.CompilerParams(num_warps=tiling.num_warps,
                                         num_stages=tiling.num_stages),
      interpret=interpret,
      name="jspec_weight_matmul",
  )(x_p, q_p, s_p)
  return out[:m, :n]
