"""The one logits-processing path (temperature, then top-k, then top-p) shared by plain and
speculative decoding, with per-row parameters; greedy rows (temperature 0) mix with sampled rows."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingParams:
  temperature: jax.Array   # [B] float32; 0 = greedy
  top_k: jax.Array         # [B] int32; 0 = off
  top_p: jax.Array         # [B] float32 in (0, 1]; 1 = off

  @classmethod
  def make(cls, batch_size: int, temperature: float | Sequence[float] = 0.0,
           top_k: int | Sequence[int] = 0, top_p: float | Sequence[float] = 1.0) -> "SamplingParams":
    """Scalars apply to every row; sequences give one value per row. Validated here, before jit."""
    def per_row(name, value, dtype):
      arr = np.broadcast_to(np.asarray(value, dtype), (batch_size,)) if np.ndim(value) == 0 \
          else np.asarray(value, dtype)
      if arr.shape != (batch_size,):
        raise ValueError(f"{name} has {arr.shape[0]} values for a batch of {batch_size} rows")
      return arr
    t = per_row("temperature", temperature, np.float32)
    k = per_row("top_k", top_k, np.int32)
    p = per_row("top_p", top_p, np.float32)
    if np.any(~np.isfinite(t)) or np.any(t < 0):
      raise ValueError(f"temperature must be >= 0 (0 = greedy), got {t.tolist()}")
    if np.any(k < 0):
      raise ValueError(f"top_k must be >= 0 (0 = off), got {k.tolist()}")
    if np.any(~(p > 0)) or np.any(p > 1):
      raise ValueError(f"top_p must be in (0, 1] (1 = off), got {p.tolist()}")
    return cls(jnp.asarray(t), jnp.asarray(k), jnp.asarray(p))

  @property
  def greedy(self) -> jax.Array:
    return self.temperature == 0


def _per_row(x: jax.Array, ndim: int) -> jax.Array:
  return x.reshape(x.shape + (1,) * (ndim - 1))


TOP_CANDIDATES = 256   # a row's cut is looked for among its largest logits first (no full sort)


def _order_keys(x: jax.Array) -> jax.Array:
  """float32 -> uint32 keys in the floats' order (negative floats bit-flipped)."""
  u = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  return jnp.where((u >> 31) == 1, ~u, u | jnp.uint32(0x80000000))


def _bisect_cut(keys: jax.Array, weights: jax.Array, limit: jax.Array) -> jax.Array:
  """Per row (last axis): the smallest key x with sum(weights[keys > x]) < limit: 32 halvings of
  the key range, each one pass over the row. Keeping keys >= x keeps the largest values whose
  weight before them stays below the limit, ties at the cut included."""
  lo = jnp.zeros(keys.shape[:-1], jnp.uint32)
  hi = jnp.max(keys, axis=-1)

  def halve(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    above = jnp.sum(jnp.where(keys > mid[..., None], weights, 0.0), axis=-1)
    below_limit = above < limit[..., 0]
    return jnp.where(below_limit, lo, mid), jnp.where(below_limit, mid, hi)

  return jax.lax.fori_loop(0, 32, halve, (lo, hi))[1][..., None]


def _filter(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
  """Masks scaled logits [B, ..., V] outside top-k then top-p; ties at a cut are kept.

  Top-k keeps the values >= the k-th largest; top-p then keeps the largest values while the
  probability (softmax over the top-k set) of the values above them is < top_p. The cut is found
  among each row's TOP_CANDIDATES largest logits (`lax.top_k`: a full sort of a [64, 49152] batch
  costs ~0.7 s per step on XLA:CPU, top-256 ~13 ms); a row whose cut lies deeper is cut by
  bisection over the whole row instead (only when some row needs it). Which way a row goes
  depends on its own logits alone, so a row's result never depends on the rest of the batch."""
  v = scaled.shape[-1]
  c = min(TOP_CANDIDATES, v)
  k = _per_row(jnp.where(top_k > 0, jnp.minimum(top_k, v), v), scaled.ndim)
  p = _per_row(top_p, scaled.ndim)
  top = jax.lax.top_k(scaled, c)[0]                                      # [..., c] descending
  rank = jnp.arange(c)
  kth = jnp.where(k >= v, -jnp.inf,
                  jnp.take_along_axis(top, jnp.minimum(k, c) - 1, axis=-1))
  in_k = jnp.where(scaled >= kth, scaled, -jnp.inf)
  lse = jax.scipy.special.logsumexp(in_k, axis=-1, keepdims=True)
  p_top = jnp.where(top >= kth, jnp.exp(top - lse), 0.0)
  mass_before = jnp.cumsum(p_top, axis=-1) - p_top
  n_keep = jnp.maximum(jnp.sum((mass_before < p) & (top >= kth), axis=-1, keepdims=True), 1)
  pth = jnp.where(p >= 1.0, -jnp.inf, jnp.take_along_axis(top, n_keep - 1, axis=-1))
  keys = _order_keys(scaled)
  cut = _order_keys(jnp.maximum(kth, pth))
  deep = ((k > c) & (k < v)) | ((p < 1.0) & (n_keep >= c) & (c < v))   # [B, ..., 1]

  def bisect(_):
    k_cut = jnp.where(k >= v, jnp.uint32(0), _bisect_cut(keys, jnp.ones_like(scaled),
                                                         k.astype(jnp.float32)))
    probs = jax.nn.softmax(jnp.where(keys >= k_cut, scaled, -jnp.inf), axis=-1)
    p_cut = jnp.where(p >= 1.0, jnp.uint32(0), _bisect_cut(keys, probs, p))
    return jnp.where(deep, jnp.maximum(k_cut, p_cut), cut)

  cut = jax.lax.cond(jnp.any(deep), bisect, lambda _: cut, None)
  return jnp.where(keys >= cut, scaled, -jnp.inf)


def process_logits(logits: jax.Array, params: SamplingParams) -> jax.Array:
  """Raw logits [B, ..., V] -> log-probabilities of the distribution actually sampled from.

  Greedy rows get the one-hot distribution at the argmax (log 1 = 0, -inf elsewhere)."""
  logits = logits.astype(jnp.float32)
  t = _per_row(params.temperature, logits.ndim)
  scaled = logits / jnp.where(t > 0, t, 1.0)
  needs_filter = jnp.any((params.top_k > 0) | (params.top_p < 1.0))
  scaled = jax.lax.cond(needs_filter, lambda s: _filter(s, params.top_k, params.top_p),
                        lambda s: s, scaled)
  logp = jax.nn.log_softmax(scaled, axis=-1)
  onehot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.bool_)
  return jnp.where(t > 0, logp, jnp.where(onehot, 0.0, -jnp.inf))


CATEGORICAL_BLOCK = 256   # tokens per block of the two-level inverse-CDF draw


def categorical(keys: jax.Array, probs: jax.Array) -> jax.Array:
  """One index per row from probs [B, V] (>= 0, any positive total; zeros are never drawn) with
  per-row keys [B]: an inverse-CDF draw from one uniform per row, first over block sums, then
  within the chosen block. Exact up to fp32 rounding of the sums, and ~40x cheaper than
  Gumbel-max on XLA:CPU (no V random numbers per row: 2.5 against 98 ms at [64, 49152])."""
  b, v = probs.shape
  c = CATEGORICAL_BLOCK
  nb = -(-v // c)
  p = jnp.pad(probs.astype(jnp.float32), ((0, 0), (0, nb * c - v))).reshape(b, nb, c)
  u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)     # [0, 1)
  block_mass = p.sum(axis=-1)                                                # [B, nb]
  ends = jnp.cumsum(block_mass, axis=-1)
  target = u * ends[:, -1]                                                   # [B]
  # the first block whose cumulative mass passes the target (<= : a zero-mass block never is);
  # rounding may push the target past the end: then the last block with mass
  last_block = nb - 1 - jnp.argmax((block_mass > 0)[:, ::-1], axis=-1)
  blk = jnp.minimum(jnp.sum(ends <= target[:, None], axis=-1), last_block)
  before = jnp.where(blk > 0, jnp.take_along_axis(ends, jnp.maximum(blk - 1, 0)[:, None],
                                                  axis=1)[:, 0], 0.0)
  inside = jnp.take_along_axis(p, blk[:, None, None], axis=1)[:, 0]          # [B, c]
  last_tok = c - 1 - jnp.argmax((inside > 0)[:, ::-1], axis=-1)
  cum = jnp.cumsum(inside, axis=-1) + before[:, None]
  tok = jnp.minimum(jnp.sum(cum <= target[:, None], axis=-1), last_tok)
  return (blk * c + tok).astype(jnp.int32)


def sample(keys: jax.Array, logits: jax.Array, params: SamplingParams) -> jax.Array:
  """One token per row from [B, V] logits with per-row keys [B] (a row's draw does not depend on
  the rest of the batch). Greedy rows take the argmax."""
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

  def draw(_):
    probs = jnp.exp(process_logits(logits, params))
    return jnp.where(params.greedy, greedy, categorical(keys, probs))

  # An all-greedy batch skips the processing and the noise (~13 ms per step at B=4 on XLA:CPU).
  return jax.lax.cond(jnp.all(params.greedy), lambda _: greedy, draw, None)
