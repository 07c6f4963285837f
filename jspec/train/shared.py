"""Pieces every head's training uses: the target's teacher-forced features, training-time-test
(TTT) attention, position shifts and gathers, and a short array digest."""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from models.kv_cache import KVCache
from models.llama import Llama


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Features:
  taps: tuple[jax.Array, ...]   # [B, N, H] each: the residual stream entering the head's layers
  target_logits: jax.Array      # [B, N, Vd] the target's logits on the draft vocabulary


def target_features(target: Llama, tokens: jax.Array, taps: tuple[int, ...],
                    draft_ids: jax.Array, cached: jax.Array | None = None) -> Features:
  """Teacher-forced target pass over tokens [B, N] (no gradient), or the same read from a feature
  cache: cached [B, N, K+1, H] holds the K taps and the final normed hidden state."""
  cfg = target.config
  if cached is None:
    b, n = tokens.shape
    out = target(tokens, KVCache.init(cfg, b, n, dtype=target.activation_dtype),
                 logit_indices=jnp.zeros((b, 1), jnp.int32), taps=tuple(taps) + (cfg.num_layers,))
    hidden, final = tuple(out.hidden[:-1]), target.norm(out.hidden[-1])      # [B, N, H]
  else:
    cached = cached.astype(jnp.float32)
    hidden, final = tuple(cached[:, :, i] for i in range(len(taps))), cached[:, :, len(taps)]
  rows = target.head_rows(draft_ids)                                           # [Vd, H]
  logits = jnp.einsum("bnh,vh->bnv", final, rows.astype(final.dtype),
                      preferred_element_type=jnp.float32)
  return jax.lax.stop_gradient(Features(hidden, logits))


def ttt_attend(prev: list, anchors: jax.Array | None, scale: float):
  """Attention for TTT step j = len(prev); prev holds the (k, v) of steps 0 .. j-1. Step 0 runs
  over all N positions, causally. Steps j > 0 run over K anchors [B, K] (positions t): their
  queries see step 0's keys at positions <= t and the keys of steps 1..j at the same anchor."""
  def attend(q, k, v):
    b, m, hq, dh = q.shape
    kvh = k.shape[2]
    qg = q.reshape(b, m, kvh, hq // kvh, dh).astype(jnp.float32)              # [B, M, KVH, G, Dh]
    steps = prev + [(k, v)]
    k0, v0 = steps[0]
    n = k0.shape[1]
    t = jnp.broadcast_to(jnp.arange(m)[None], (b, m)) if anchors is None else anchors
    seen = jnp.arange(n)[None, None, :] <= t[:, :, None]                       # [B, M, N]
    s0 = jnp.einsum("btkgd,bskd->bkgts", qg, k0.astype(jnp.float32)) * scale   # [B,KVH,G,M,N]
    s0 = jnp.where(seen[:, None, None], s0, -jnp.inf)
    diag = [jnp.einsum("btkgd,btkd->bkgt", qg, ki.astype(jnp.float32))[..., None] * scale
            for ki, _ in steps[1:]]                                            # [B,KVH,G,M,1]
    probs = jax.nn.softmax(jnp.concatenate([s0] + diag, axis=-1), axis=-1)
    out = jnp.einsum("bkgts,bskd->btkgd", probs[..., :n], v0.astype(jnp.float32))
    for i, (_, vi) in enumerate(steps[1:]):
      out = out + jnp.einsum("bkgt,btkd->btkgd", probs[..., n + i], vi.astype(jnp.float32))
    return out.reshape(b, m, hq, dh).astype(q.dtype), (k, v)
  return attend


def shift(x: jax.Array, k: int) -> jax.Array:
  """x[:, t + k] at t (zeros past the end)."""
  return jnp.concatenate([x[:, k:], jnp.zeros_like(x[:, :k])], axis=1)


def take_at(x: jax.Array, idx: jax.Array) -> jax.Array:
  """x [B, N, ...] at per-row positions idx [B, K] (clipped to the sequence)."""
  idx = jnp.clip(idx, 0, x.shape[1] - 1)
  return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)


def digest(a: np.ndarray) -> str:
  """A short content hash of an array (a cache key for data-derived arrays)."""
  return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]
