"""The reference of `weight_matmul`: y = x @ (q * scale[:, None])^T in float32, for weights kept as
int8 (one scale per output row) or bf16 (no scale)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def weight_matmul(x: jax.Array, q: jax.Array, scale: jax.Array | None = None) -> jax.Array:
  """x [M, K], q [N, K] int8 or bf16, scale [N] (int8) -> [M, N] float32."""
  w = q.astype(jnp.float32)
  if scale is not None:
    w = w * scale.astype(jnp.float32)[:, None]
  return jnp.matmul(x.astype(jnp.float32), w.T, precision=jax.lax.Precision.HIGHEST)
