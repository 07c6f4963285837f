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

from jspec.sampling import SamplingParams, categorical, process_logits


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


def chain_outcomes(p: jax.Array, draft: jax.Array, q: jax.Array | None,
                   draft_len: jax.Array | None = None):
  """The deterministic part of chain verification.

  Returns (accept [B, D], final [B, D+1, V]): accept[b, i] is the probability that draft token i is
  accepted given tokens < i were; final[b, k] is the distribution of the token emitted when exactly
  k drafts are accepted (the residual at the first rejection, or p_{D+1} as the bonus when k = D).
  Positions at or past draft_len were not proposed: never accepted, and sampled from p there.
  """
  b, d = draft.shape
  v = p.shape[-1]
  proposed = jnp.arange(d)[None, :] < (d if draft_len is None else draft_len[:, None])   # [B, D]
  p_draft = jnp.take_along_axis(p[:, :d], draft[:, :, None], axis=-1)[..., 0]
  q_draft = None if q is None else jnp.take_along_axis(q, draft[:, :, None], axis=-1)[..., 0]
  accept = jnp.where(proposed, acceptance_probability(p_draft, q_draft), 0.0)
  q_used = jax.nn.one_hot(draft, v, dtype=p.dtype) if q is None else q.astype(p.dtype)
  q_used = jnp.where(proposed[..., None], q_used, 0.0)
  q_used = jnp.concatenate([q_used, jnp.zeros((b, 1, v), p.dtype)], axis=1)               # [B, D+1, V]
  return accept, residual_distribution(p, q_used)


def verify_chain(keys: jax.Array, p: jax.Array, draft: jax.Array, q: jax.Array | None,
                 draft_len: jax.Array | None = None):
  """Returns (n_accepted [B], tokens [B, D+1]); the first n_accepted + 1 tokens of a row are its
  output (accepted drafts, then the residual or bonus token); the rest are padding.

  keys: [B] per-row PRNG keys. draft_len: [B] how many of the D draft tokens a row proposes (a
  model-free drafter may find fewer than D).
  """
  b, d = draft.shape
  accept, final = chain_outcomes(p, draft, q, draft_len)
  u_key, r_key = jax.vmap(jax.random.split, out_axes=1)(keys)
  u = 1.0 - jax.vmap(lambda k: jax.random.uniform(k, (d,)))(u_key)   # (0, 1]: P(u <= a) = a
  n_acc = jnp.sum(jnp.cumprod((u <= accept).astype(jnp.int32), axis=1), axis=1)         # [B]
  rows = jnp.arange(b)
  last = categorical(r_key, final[rows, n_acc])
  tokens = jnp.concatenate([draft, jnp.zeros((b, 1), draft.dtype)], axis=1)
  return n_acc, tokens.at[rows, n_acc].set(last)


def verify_chain_greedy(logits: jax.Array, draft: jax.Array, draft_len: jax.Array | None = None):
  """`verify_chain` for a batch whose rows are all greedy (p one-hot at the argmax): accept while
  the draft equals the target's argmax, then emit the argmax. Same outputs, no exp, no noise."""
  b, d = draft.shape
  target = jnp.argmax(logits, axis=-1).astype(jnp.int32)                                  # [B, D+1]
  ok = draft == target[:, :d]
  if draft_len is not None:
    ok &= jnp.arange(d)[None, :] < draft_len[:, None]
  n_acc = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)
  rows = jnp.arange(b)
  tokens = jnp.concatenate([draft, jnp.zeros((b, 1), draft.dtype)], axis=1)
  return n_acc, tokens.at[rows, n_acc].set(target[rows, n_acc])


def verify(keys: jax.Array, logits: jax.Array, params: SamplingParams, draft: jax.Array,
           q: jax.Array | None, draft_len: jax.Array | None = None):
  """Raw target logits [B, D+1, V] -> (n_accepted, tokens), taking the cheap exact path when every
  row is greedy (the exp over [B, D+1, V] and the noise cost several ms a round on XLA:CPU)."""
  def general(_):
    p = jnp.exp(process_logits(logits, params))
    return verify_chain(keys, p, draft, q, draft_len)

  return jax.lax.cond(jnp.all(params.greedy),
                      lambda _: verify_chain_greedy(logits, draft, draft_len), general, None)
