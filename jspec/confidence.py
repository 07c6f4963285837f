"""Confidence-scheduled verification (DSpark, arXiv 2607.05147, Algorithm 1) on static shapes.

A drafter that scores its own drafts (DSpark's confidence head: c_k = P(slot k survives | slots < k
accepted)) gives each row's survival a_{r,j} = prod_{i <= j} c_{r,i} after post-hoc per-position
temperature scaling (`fit_temperatures`; saved beside the head as calibration.json,
jspec.drafters.dspark.calibration). Each round the
scheduler admits (row, position) candidates in decreasing a_{r,j}: expected tokens
tau = R + sum of the admitted a, cost = the measured round cost of the compiled verify width that
holds the longest admitted prefix; it keeps admitting while tau / cost grows and stops at the first
candidate that does not raise it. Because a_{r,j} only falls along a row, the admitted positions of a
row are a prefix, and the stop depends on a row's survivals up to one position past its prefix: a
function of the drafts before that position, never of later drafts or of anything the target samples
this round; so each row's verified prefix is a stopping time of its draft and rejection sampling over
it stays lossless. Positions past a row's prefix are masked (`Draft.length`); the batch verifies the
smallest compiled width that holds every live row's prefix (`lax.switch`, nothing recompiles).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jspec.adaptive import AdaptiveDrafter, AdaptiveParams, cost_at, cost_tensor
from jspec.costs import CostTable

def survival(conf_logits: jax.Array, temperatures: jax.Array) -> jax.Array:
  """[B, D] confidence logits, [D] temperatures -> a [B, D] = cumprod(sigmoid(z / t))."""
  return jnp.cumprod(jax.nn.sigmoid(conf_logits / temperatures[None, :]), axis=1)


def prefix_lengths(a: jax.Array, widths: tuple[int, ...], cost: jax.Array) -> jax.Array:
  """Algorithm 1 with early stop. a [B, D] (non-increasing along D), widths: the compiled verify
  widths (sorted, the last = D), cost [len(widths)]: each width's round cost. Returns the verified
  prefix length per row [B] int32."""
  b, d = a.shape
  val = a.reshape(-1)
  pos = jnp.tile(jnp.arange(d, dtype=jnp.int32), b)
  order = jnp.lexsort((pos, -val))                     # by survival, ties: the earlier position
  v, p = val[order], pos[order]
  w = jax.lax.cummax(p + 1)                            # the longest admitted prefix
  ws = jnp.asarray(widths, jnp.int32)
  k = jnp.minimum(jnp.searchsorted(ws, w, side="left"), len(widths) - 1)
  theta = (b + jnp.cumsum(v)) / cost[k]
  k0 = jnp.minimum(jnp.searchsorted(ws, 0, side="left"), len(widths) - 1)
  prev = jnp.concatenate([jnp.full((1,), b / cost[k0]), theta[:-1]])
  stop = jnp.argmax(jnp.concatenate([~(theta > prev), jnp.ones((1,), bool)]))   # first miss
  admitted = jnp.zeros((b * d,), bool).at[order].set(jnp.arange(b * d) < stop)
  return admitted.reshape(b, d).sum(axis=1).astype(jnp.int32)


def fit_temperatures(logits: np.ndarray, survived: np.ndarray, grid=None, bins: int = 10):
  """Per-position temperature scaling (STS): position k's temperature minimises the expected
  calibration error of the cumulative product, earlier positions fixed. logits [N, D] confidence
  logits, survived [N, D] 1 where positions 1..k were all accepted. Returns (temperatures [D],
  ECE per position before, after)."""
  grid = np.geomspace(0.2, 5.0, 49) if grid is None else np.asarray(grid)
  logits = np.asarray(logits, np.float64)
  survived = np.asarray(survived, np.float64)
  n, d = logits.shape
  sig = lambda x: 1.0 / (1.0 + np.exp(-x))

  def ece(pred, obs):
    idx = np.minimum((pred * bins).astype(int), bins - 1)
    total = 0.0
    for i in range(bins):
      m = idx == i
      if m.any():
        total += m.sum() / n * abs(pred[m].mean() - obs[m].mean())
    return total

  temps, before, after = np.ones(d), [], []
  prefix = np.ones(n)
  raw_prefix = np.ones(n)
  for k in range(d):
    raw_prefix = raw_prefix * sig(logits[:, k])
    before.append(ece(raw_prefix, survived[:, k]))
    errs = [ece(prefix * sig(logits[:, k] / t), survived[:, k]) for t in grid]
    temps[k] = float(grid[int(np.argmin(errs))])
    prefix = prefix * sig(logits[:, k] / temps[k])
    after.append(float(min(errs)))
  return temps, np.asarray(before), np.asarray(after)


def default_widths(d: int) -> tuple[int, ...]:
  """The compiled verify widths for a block of d drafts: 0 (a plain step), 1, 2, 3, 4, 6, 8, ...
  up to d."""
  base = [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
  return tuple(sorted({w for w in base if w < d} | {d}))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ScheduleParams:
  inner: Any
  cost: jax.Array          # [P, len(batch_sizes), len(lengths)] round cost per compiled width
  temperatures: jax.Array  # [D] per-position confidence temperatures
  log_padding: jax.Array   # [P] as AdaptiveParams'


@dataclasses.dataclass(frozen=True)
class ConfidenceScheduler(AdaptiveDrafter):
  """Wraps a drafter with `propose_with_confidence` (DSpark): each round verifies the prefix
  Algorithm 1 picks per row from this draft's calibrated confidences and the cost table."""

  @property
  def choose_before_drafting(self) -> bool:
    return False

  def make_params(self, inner_params, costs: CostTable,
                  temperatures=None) -> ScheduleParams:
    cost, log_padding = cost_tensor(costs, self.batch_sizes, self.lengths, self.num_draft)
    t = np.ones(self.num_draft, np.float32) if temperatures is None else temperatures
    return ScheduleParams(inner_params, cost, jnp.asarray(t, jnp.float32), log_padding)

  def init_state(self, params: ScheduleParams, prompt, ctx, max_len: int):
    return super().init_state(_as_adaptive(params, self.num_draft), prompt, ctx, max_len)

  def propose(self, params: ScheduleParams, state, ctx, key, num=None):
    draft, conf = self.inner.propose_with_confidence(params.inner, state.inner, ctx, key)
    a = survival(conf, params.temperatures)
    cost = cost_at(params.cost, state.mix)[self._cost_row(a.shape[0])]
    length = prefix_lengths(a, self.lengths, cost)
    return dataclasses.replace(draft, length=length), state

  def choose(self, params: ScheduleParams, state, draft_len: jax.Array, live: jax.Array,
             remaining: jax.Array | None = None):
    """The smallest compiled width that holds every live row's scheduled prefix."""
    need = jnp.max(jnp.where(live, draft_len, 0))
    return jnp.searchsorted(jnp.asarray(self.lengths, jnp.int32), need,
                            side="left").astype(jnp.int32)


def _as_adaptive(params: ScheduleParams, d: int):
  return AdaptiveParams(params.inner, params.cost, jnp.full((d,), 0.5, jnp.float32),
                        params.log_padding)
