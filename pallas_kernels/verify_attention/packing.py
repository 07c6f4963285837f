"""Query packing shared by the GPU and TPU verification kernels: the G*T query rows of one KV head
in one tile (row r = token r // G, head r % G of the group), the tree mask per packed row, and the
log-sum-exp merge of KV splits back to [B, T, Hq, Dh]."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def pack_queries(q: jax.Array, kvh: int, block_q: int) -> jax.Array:
  """[B, T, Hq, Dh] -> [B, KVH, tiles * block_q, Dh], row r = token r // G, group head r % G."""
  b, t, hq, dh = q.shape
  g = hq // kvh
  qp = q.reshape(b, t, kvh, g, dh).transpose(0, 2, 1, 3, 4).reshape(b, kvh, t * g, dh)
  pad = -(t * g) % block_q
  return jnp.pad(qp, ((0, 0), (0, 0), (0, pad), (0, 0)))


def pack_tree_mask(tree_mask: jax.Array, group: int, rows: int, cols: int,
                   dtype=jnp.int8) -> jax.Array:
  """[B, T, T] bool -> [B, rows, cols] 0/1 in `dtype` per packed query row (padding sees none)."""
  b, t, _ = tree_mask.shape
  tm = jnp.repeat(tree_mask.astype(dtype), group, axis=1)      # [B, T*G, T]
  return jnp.pad(tm, ((0, 0), (0, rows - t * group), (0, cols - t)))


def unpack_output(out: jax.Array, lse: jax.Array | None, q_shape, dtype) -> jax.Array:
  """Merges KV splits ([B, KVH, NS, R, Dh] normalised partials + [B, KVH, NS, R] log-sum-exp; or
  [B, KVH, R, Dh] unsplit) and unpacks rows to [B, T, Hq, Dh]."""
  b, t, hq, dh = q_shape
  if lse is not None:
    top = lse.max(axis=2, keepdims=True)
    w = jnp.exp(lse - jnp.where(jnp.isfinite(top), top, 0.0))       # [B, KVH, NS, R]
    den = w.sum(axis=2)
    out = (w[..., None] * out).sum(axis=2) / jnp.where(den > 0, den, 1.0)[..., None]
  kvh = out.shape[1]
  g = hq // kvh
  out = out[:, :, :t * g].reshape(b, kvh, t, g, dh).transpose(0, 2, 1, 3, 4)
  return out.reshape(b, t, hq, dh).astype(dtype)
