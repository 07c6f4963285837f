"""Chain verification by rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

Given target probabilities p [B, D+1, V] (already processed: temperature, top-k, top-p), draft
tokens d [B, D] and the draft distributions q they were sampled from (None = deterministic draft,
treated as one-hot), accept d_i with probability min(1, p_i(d_i) / q_i(d_i)) left to right; at the
first rejection emit a token from the residual normalise(max(0, p_i - q_i)); if every draft token is
accepted emit a bonus token from p_{D+1}. The emitted sequence is distributed exactly as sampling
from p token by token. Greedy rows are the temperature-0 case (p one-hot at the argmax).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def acceptance_probability(p_d: jax.Array, q_d: jax.Array | None) -> jax.Array:
  """min(1, p(d) / q(d)); a draft token with q(d) = 0 (never sampled) is rejected."""
  if q_d is None:
    return p_d
  return jnp.where(q_d > 0, jnp.minimum(1.0, p_d / jnp.where(q_d > 0, q_d, 1.0)), 0.0)


def residual_distribution(p: jax.Array, q: jax.Array) -> jax.Array:
  """normalise(max(0, p - q)) over the last axis; falls back to p where that has no mass."""
  r = jnp.maximum(p - q, 0.0)
  mass = jnp.sum(r, axis=-1, keepdims=True)
  return jnp.where(mass > 1e-9, r / jnp.where(mass > 1e-9, mass, 1.0), p)


def verify_chain(keys: jax.Array, p: jax.Array, draft: jax.Array, q: jax.Array | None,
                 draft_len: jax.Array | None = None):
  """Returns (n_accepted [B], tokens [B, D+1]); the first n_accepted + 1 tokens of a row are its
  output (accepted drafts, then the residual or bonus token); the rest are padding.

  keys: [B] per-row PRNG keys. draft_len: [B] how many of the D draft tokens a row proposes (the
  rest are never accepted; a model-free drafter may find fewer than D).
  """
  b, d = draft.shape
  v = p.shape[-1]
  p_draft = jnp.take_along_axis(p[:, :d], draft[:, :, None], axis=-1)[..., 0]           # [B, D]
  q_draft = None if q is None else jnp.take_along_axis(q, draft[:, :, None], axis=-1)[..., 0]
  u_key, r_key = jax.vmap(jax.random.split, out_axes=1)(keys)
  u = 1.0 - jax.vmap(lambda k: jax.random.uniform(k, (d,)))(u_key)   # (0, 1]: P(u <= a) = a
  ok = u <= acceptance_probability(p_draft, q_draft)
  if draft_len is not None:
    ok &= jnp.arange(d)[None, :] < draft_len[:, None]
  n_acc = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)                     # [B]
  # The final token: residual at the first rejected position, or the bonus from p_{D+1}.
  rows = jnp.arange(b)
  p_final = p[rows, n_acc]                                                               # [B, V]
  if q is None:
    q_final = jax.nn.one_hot(draft[rows, jnp.minimum(n_acc, d - 1)], v, dtype=p.dtype)
  else:
    q_final = q[rows, jnp.minimum(n_acc, d - 1)]
  proposed = n_acc < (d if draft_len is None else jnp.minimum(draft_len, d))
  q_final = jnp.where(proposed[:, None], q_final, 0.0)   # nothing proposed there: sample from p
  final_dist = residual_distribution(p_final, q_final)
  gumbel = jax.vmap(lambda k: jax.random.gumbel(k, (v,)))(r_key)
  final = jnp.argmax(jnp.log(final_dist) + gumbel, axis=-1).astype(jnp.int32)
  tokens = jnp.concatenate([draft, jnp.zeros((b, 1), draft.dtype)], axis=1)
  tokens = tokens.at[rows, n_acc].set(final)
  return n_acc, tokens
