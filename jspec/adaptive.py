"""Adaptive draft length inside the one jitted round (`num_speculative_tokens: "auto"`).

`AdaptiveDrafter` wraps any chain drafter built for D_max = max(lengths). Every round it picks a
verify width 1 + D_k from a small compiled set (`lengths`, e.g. 0, 1, 2, 3, 5, 7; 0 is a plain
decode step) and verifies with `lax.switch`, so nothing recompiles when the choice changes. A
model-free drafter drafts D_max tokens first (its proposal count per row enters the choice); a
serial model drafter (`variable_length`: EAGLE-3, draft models) is asked for only the D_k tokens
it verifies, and one more in every `explore_every`-th round (and in plain rounds, where the first
draft costs no drafter step) so that the estimate of the next position keeps learning:

  AL_b(D_k) = 1 + sum_{i <= min(D_k, len_b)} prod_{j <= i} a_bj   (len_b: row b's proposals)
  AL_b(0)   = m                                                    (a plain round: m steps)
  F_b(k)    = cost_k + max(R_b - AL_b(D_k), 0) / r_b               (row b's projected finish)
  k*        = argmin_k  tau log sum_b exp(F_b(k) / tau)            (live rows b)

R_b is the tokens row b may still make and r_b its long-run tokens per unit of round cost (an
exponentially weighted average over earlier rounds, `rate_decay`; before the first, the best
AL_b(D_k) / cost_k with every position proposed): a batch decodes until its last row is done, so
k* is the length after which the batch is projected to finish soonest. Which row finishes last is
uncertain while much is left, so the max over rows is softened with tau = sqrt(mean R) / (2 mean r)
(about the spread of a row's finish): early on k* maximises the rows' summed progress this round
at the long-run price of a token, near the end it serves the straggler. A row's rate, not this
round's draft, picks the straggler: an n-gram row without a match this round is not, by that
alone, the row that decides the batch. At B = 1 with r = max_k AL(D_k) / cost_k this is the most
tokens per unit of cost (without R, `choose_length` maximises mean_b AL_b(D_k) / cost_k).

A plain round (D_k = 0) runs m = `plain_steps` target steps (default 4, at most D_max + 1), each
sampling the next token from the target as plain decoding does, so the round's fixed work (the
choice, the drafter's upkeep such as EAGLE-3's head over the new positions) is paid once per m
tokens; the first of them is still compared with the first draft, so the estimate of a_1 keeps
learning while the round decodes plainly.

a_bj is row b's running estimate of the probability that draft position j is accepted once the
positions before it were: an exponentially weighted average of what *earlier* rounds observed
(accepted positions count 1, the first rejected one 0; when a whole block is accepted, the bonus
token equal to the next draft token counts as that position's outcome, which is how a width-1 round
keeps learning a_1; for a drafter that samples its drafts this undercounts a little). The estimates
start from the drafter's calibrated acceptance when the cost table has it (`jspec plan`: measured
over the rounds that proposed each position, as the estimates are, so that an n-gram drafter's
rounds without a match do not pull it down), else 0.5. cost_k is the time of a whole round
verifying D_k: timed on this machine at the call's own shapes when they compile (`time_rounds`,
what `SpecDecoder` does by default), or from a cost table, in plain decode steps at the prompts'
padding (`CostTable.round` / `round_at`, from `jspec plan` or the built-in CPU defaults: jspec.costs),
or where no round was measured (T_verif(B, 1+D_k) + T_draft(B, drafted_k)) / T_verif(B, 1)
(m T_verif(B, 1) for the plain round). The choice depends on the committed context and earlier
rounds only, never on this round's verification, so each round is an ordinary rejection-sampling
round over a chain of D_k drafts: lossless for every choice.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jspec.costs import CostTable, fit_round_costs
from jspec.drafters.base import Drafter, WidthPolicy

DEFAULT_LENGTHS = (0, 1, 2, 3, 5, 7)


def validate_lengths(lengths, d_max: int | None = None) -> tuple[int, ...]:
  ok = isinstance(lengths, (list, tuple)) and len(lengths) >= 2 and all(
      isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in lengths)
  if not ok or len(set(lengths)) != len(lengths):
    raise ValueError(f"draft_lengths must be at least two distinct integers >= 0 (0 = a plain "
                     f"step), got {lengths!r}")
  out = tuple(sorted(lengths))
  if out[-1] < 1:
    raise ValueError(f"draft_lengths needs a length >= 1, got {lengths!r}")
  if d_max is not None and out[-1] != d_max:
    raise ValueError(f"the largest of draft_lengths {list(out)} must equal num_speculative_tokens "
                     f"({d_max}); or pass num_speculative_tokens='auto'")
  return out


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AdaptiveParams:
  inner: Any
  cost: jax.Array          # [P, len(batch_sizes), len(lengths)] round cost per compiled length,
                           # at each of P measured prompt paddings
  prior: jax.Array         # [D_max] starting estimates of the conditional acceptance
  log_padding: jax.Array   # [P] log2 of those paddings (one 0: the same costs at any padding)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AdaptiveState:
  inner: Any
  est: jax.Array           # [B, R, D_max] per-row conditional acceptance estimates, one set per
                           # regime of the inner drafter (R = its `regimes`; 1 for most)
  regime: jax.Array        # [B] this round's regime per row (`prepare`)
  avail: jax.Array         # [B] drafts this round's regime can propose (D_max unless known)
  chosen: jax.Array        # [len(lengths)] rounds that verified each length
  last: jax.Array          # [] the index into lengths of the last round's width
  mix: jax.Array           # [P] weights of params.cost's paddings at this call's prompt padding
  rate: jax.Array          # [B] tokens per unit of round cost over earlier rounds (0: none yet)


@dataclasses.dataclass(frozen=True)
class AdaptiveDrafter(WidthPolicy):
  inner: Drafter
  lengths: tuple[int, ...] = DEFAULT_LENGTHS
  batch_sizes: tuple[int, ...] = (1,)   # the rows of params.cost
  decay: float = 0.25                   # weight of a new observation in the running estimate
  prior: float = 0.5                    # the starting estimate where the cost table has none
  plain_steps: int = 4                  # target steps per plain round (at most D_max + 1)
  explore_every: int = 4                # a serial drafter drafts one past the verified length
                                        # in every this many rounds (0: never)
  rate_decay: float = 0.1               # weight of a round in the rows' long-run token rates
  fixed: int | None = None              # the program of one width (`at_width`); None: switch
  per_row: bool = False                 # B > 1: a round at lengths[k] verifies B * lengths[k]
                                        # drafts, each row as many as its estimates earn
                                        # (`row_widths`), in a packed verify of B (1 + lengths[k])
                                        # tokens

  def __post_init__(self):
    if not (isinstance(self.plain_steps, int) and self.plain_steps >= 1):
      raise ValueError(f"plain_steps must be an integer >= 1, got {self.plain_steps!r}")
    if not (isinstance(self.explore_every, int) and self.explore_every >= 0):
      raise ValueError(f"explore_every must be an integer >= 0, got {self.explore_every!r}")
    if not 0.0 < self.rate_decay <= 1.0:
      raise ValueError(f"rate_decay must be in (0, 1], got {self.rate_decay!r}")
    if self.fixed is not None and not 0 <= self.fixed < len(self.lengths):
      raise ValueError(f"fixed must index lengths {self.lengths}, got {self.fixed!r}")

  @property
  def fixed_index(self) -> int | None:
    return self.fixed

  def at_width(self, k: int | None) -> "AdaptiveDrafter":
    """This policy with every round verifying lengths[k] (None: chosen in the round). The same
    params and state; the host chooses k between rounds (`SpecDecoder(choice="host")`)."""
    return dataclasses.replace(self, fixed=k)

  def num_to_draft(self, k: jax.Array, round_index: jax.Array, widths: jax.Array) -> jax.Array:
    """[] drafts a serial drafter is asked for in a round verifying lengths[k] (rows' widths [B]):
    the most any row verifies, plus one past them in every `explore_every`-th round (so that the
    next position's estimate keeps learning without paying a draft step that is never verified in
    every round) and in plain rounds (the first draft, read off the drafter's state without a step,
    keeps a_1 learning). A function of the round index and the choice only: non-anticipating."""
    plain = jnp.asarray(self.lengths, jnp.int32)[k] == 0
    explore = (round_index % self.explore_every == 0) if self.explore_every else False
    extra = jnp.where(plain | explore, 1, 0)
    return jnp.minimum(jnp.max(widths) + extra, self.num_draft).astype(jnp.int32)

  def _split(self, batch: int) -> bool:
    return self.per_row and batch > 1

  def block_width(self, k: int, batch: int) -> int:
    """lengths[k]; with per_row, the most one row may get: min(D_max, B * lengths[k])."""
    if not self._split(batch):
      return self.lengths[k]
    return min(self.num_draft, batch * self.lengths[k])

  def packed_tokens(self, k: int, batch: int) -> int | None:
    """With per_row, B (1 + lengths[k]) when fewer than the padded block's tokens."""
    total = batch * (1 + self.lengths[k])
    if not self._split(batch) or total >= batch * (1 + self.block_width(k, batch)):
      return None
    return total

  def row_widths(self, params, state: AdaptiveState, draft_len: jax.Array, live: jax.Array,
                 k: jax.Array) -> jax.Array:
    """[B] the drafts each row verifies at lengths[k]: lengths[k]; with per_row, the batch's
    B * lengths[k] drafts go to the positions likeliest to be reached and accepted
    (`draft_ranks`), each row getting a prefix of its chain."""
    b = draft_len.shape[0]
    width = jnp.asarray(self.lengths, jnp.int32)[k]
    if not self._split(b):
      return jnp.broadcast_to(width, (b,))
    ranks = draft_ranks(self._current(state), jnp.minimum(draft_len, state.avail), live)
    return jnp.sum(ranks < b * width, axis=1).astype(jnp.int32)

  @property
  def plain_block(self) -> int:
    """Tokens a plain round (length 0) decodes: plain_steps, at most D_max + 1 (the round's
    output block); 1 where the lengths have no 0."""
    return min(self.plain_steps, self.num_draft + 1) if self.lengths[0] == 0 else 1

  @property
  def num_draft(self) -> int:
    return self.inner.num_draft

  @property
  def target_taps(self) -> tuple[int, ...]:
    return self.inner.target_taps

  @property
  def choose_before_drafting(self) -> bool:
    """The inner drafter drafts only what it is asked for (`propose(num=...)`)."""
    return self.inner.variable_length

  @property
  def num_extra(self) -> int:
    return self.inner.num_extra

  def make_request(self, prediction, batch_size: int, *, vocab_size: int, tokenizer=None):
    return self.inner.make_request(prediction, batch_size, vocab_size=vocab_size,
                                   tokenizer=tokenizer)

  def after_generate(self, params: AdaptiveParams, prompts, outputs) -> AdaptiveParams:
    return dataclasses.replace(params, inner=self.inner.after_generate(params.inner, prompts,
                                                                       outputs))

  def chosen(self, state: AdaptiveState) -> jax.Array:
    return state.chosen

  def make_params(self, inner_params, costs: CostTable) -> AdaptiveParams:
    known = list(costs.acceptance[:self.num_draft])
    prior = known + [known[-1] if known else self.prior] * (self.num_draft - len(known))
    cost, log_padding = cost_tensor(costs, self.batch_sizes, self.lengths, self.num_draft,
                                    self.choose_before_drafting, self.plain_block,
                                    self.explore_every)
    return AdaptiveParams(inner_params, cost, jnp.asarray(prior, jnp.float32), log_padding)

  def _cost_row(self, b: int) -> int:
    below = [i for i, s in enumerate(self.batch_sizes) if s <= b]
    return below[-1] if below else 0

  @property
  def regimes(self) -> int:
    return self.inner.regimes

  def init_state(self, params: AdaptiveParams, prompt, ctx, max_len: int) -> AdaptiveState:
    b, width = prompt.shape
    return AdaptiveState(self.inner.init_state(params.inner, prompt, ctx, max_len),
                         jnp.broadcast_to(params.prior, (b, self.regimes, self.num_draft)),
                         jnp.zeros((b,), jnp.int32), jnp.full((b,), self.num_draft, jnp.int32),
                         jnp.zeros((len(self.lengths),), jnp.int32), jnp.zeros((), jnp.int32),
                         padding_weights(params.log_padding, width), jnp.zeros((b,), jnp.float32))

  def prepare(self, params: AdaptiveParams, state: AdaptiveState, ctx) -> AdaptiveState:
    """Reads the inner drafter's regime per row for this round (a drafter with `regimes` > 1: the
    hybrid's copy or learned side), so that the choice uses that regime's estimates."""
    if self.regimes == 1:
      return state
    regime, avail = self.inner.regime(params.inner, state.inner, ctx)
    return dataclasses.replace(state, regime=regime, avail=avail)

  def _current(self, state: AdaptiveState) -> jax.Array:
    """[B, D_max] the estimates of each row's regime this round."""
    return jnp.take_along_axis(state.est, state.regime[:, None, None], axis=1)[:, 0]

  def propose(self, params: AdaptiveParams, state: AdaptiveState, ctx, key, num=None):
    extra = {} if num is None else {"num": num}
    draft, inner = self.inner.propose(params.inner, state.inner, ctx, key, **extra)
    return draft, dataclasses.replace(state, inner=inner)

  def commit(self, params: AdaptiveParams, state: AdaptiveState, ctx) -> AdaptiveState:
    """The inner commit. A drafter that reads the target's taps (EAGLE-3, MTP, Medusa, DFlash)
    commits over the round's block only: one branch per compiled length, each given the taps of
    that block (1 + D_k positions, or the plain round's steps; the rest are padding), so a width-1
    round re-runs its head over 2 positions, not D_max + 1."""
    if not self.inner.target_taps:
      return dataclasses.replace(state, inner=self.inner.commit(params.inner, state.inner, ctx))

    def commit_width(width, inner, ctx):
      narrow = dataclasses.replace(ctx, target_hidden=tuple(h[:, :width + 1]
                                                            for h in ctx.target_hidden))
      return self.inner.commit(params.inner, inner, narrow)

    b = ctx.tokens.shape[0]
    blocks = [self.block_width(i, b) + 1 if d else self.plain_block
              for i, d in enumerate(self.lengths)]
    if self.fixed is not None:
      inner = commit_width(blocks[self.fixed] - 1, state.inner, ctx)
      return dataclasses.replace(state, inner=inner)
    inner = jax.lax.switch(state.last, [functools.partial(commit_width, w - 1) for w in blocks],
                           state.inner, ctx)
    return dataclasses.replace(state, inner=inner)

  def choose(self, params: AdaptiveParams, state: AdaptiveState, draft_len: jax.Array,
             live: jax.Array, remaining: jax.Array | None = None) -> jax.Array:
    """The index into `lengths` this round verifies (from earlier rounds and this draft only;
    `remaining` [B]: the tokens each row may still make, `choose_length`)."""
    cost = self._cost(params, state)
    rate = None if remaining is None else self._rate(state, cost)
    avail = jnp.minimum(draft_len, state.avail)
    widths = None
    if self._split(draft_len.shape[0]):
      ranks = draft_ranks(self._current(state), avail, live)
      budget = draft_len.shape[0] * jnp.asarray(self.lengths, jnp.int32)
      widths = jnp.sum(ranks[:, :, None] < budget[None, None, :], axis=1)      # [B, K]
    return choose_length(self._current(state), avail, live, self.lengths, cost, self.plain_block,
                         remaining, rate, widths)

  def _cost(self, params, state: AdaptiveState) -> jax.Array:
    return cost_at(params.cost, state.mix)[self._cost_row(state.est.shape[0])]

  def _rate(self, state: AdaptiveState, cost: jax.Array) -> jax.Array:
    """[B] the rows' long-run tokens per unit of cost; before any round, the best
    AL_b(D_k) / cost_k of the current estimates with every position proposed."""
    est = self._current(state)
    b, d = est.shape
    al = expected_lengths(est, jnp.full((b,), d, jnp.int32), self.lengths, self.plain_block)
    return jnp.where(state.rate > 0, state.rate, jnp.max(al / cost, axis=1))

  def observe(self, params, state: AdaptiveState, k: jax.Array, widths: jax.Array,
              n_acc: jax.Array, emitted: jax.Array, draft_tokens: jax.Array, draft_len: jax.Array,
              live: jax.Array) -> AdaptiveState:
    """Folds this round's outcomes into the estimates and the rows' token rates (after the choice
    was made); widths [B]: the drafts each row verified."""
    width = jnp.asarray(self.lengths, jnp.int32)[k]
    cur = update_estimates(self._current(state), widths, n_acc, emitted, draft_tokens, draft_len,
                           live, self.decay)
    est = state.est.at[jnp.arange(cur.shape[0]), state.regime].set(cur)
    cost = self._cost(params, state)
    tokens = jnp.where(width == 0, float(self.plain_block), n_acc.astype(jnp.float32) + 1.0)
    prev = self._rate(state, cost)
    rate = jnp.where(live, prev + self.rate_decay * (tokens / cost[k] - prev), state.rate)
    return dataclasses.replace(state, est=est, chosen=state.chosen.at[k].add(1), last=k,
                               rate=rate)


def time_rounds(run, params: AdaptiveParams, state, lengths: tuple[int, ...], *, tokens: int = 8,
                repeats: int = 3) -> dict[int, float] | None:
  """Seconds per round verifying each of `lengths` on this machine today, at the shapes of one
  compiled program: `run(params, state)` is its generate loop and `state` its prefilled start (not
  consumed). Each timing decodes `tokens` per row from a copy of `state`, with costs that force
  every round to one length; the lengths are timed in turn, `repeats` passes in alternating order
  after one untimed pass (the first runs after compiling ran up to 30% slow). A busy machine slows
  whole passes: each pass is scaled by its median ratio to the lengths' medians over the passes
  (`pass_normalised`), then each length's median is kept. The rows' keys are re-salted, so these
  rounds draw none of the random numbers that the real run will: its choices stay independent of
  its own outcomes. None when no round ran (every row already done)."""
  k_all = len(lengths)
  passes = []
  start = dataclasses.replace(
      state, max_new=jnp.minimum(state.max_new, tokens),
      keys=jax.vmap(lambda key: jax.random.fold_in(key, 0x5EED))(state.keys))
  for r in range(-1, repeats):
    times = [0.0] * k_all
    for k in (range(k_all) if r % 2 == 0 else reversed(range(k_all))):
      force = jnp.where(jnp.arange(k_all) == k, 1.0, 1e9).astype(params.cost.dtype)
      forced = dataclasses.replace(params, cost=jnp.broadcast_to(force, params.cost.shape))
      copy = jax.tree_util.tree_map(jnp.copy, start)
      jax.block_until_ready(copy)
      t0 = time.perf_counter()
      out = jax.block_until_ready(run(forced, copy))
      seconds = time.perf_counter() - t0
      rounds = int(out.round)
      if rounds == 0:
        return None
      times[k] = seconds / rounds
    if r >= 0:
      passes.append(times)
  return dict(zip(lengths, pass_normalised(passes)))


def pass_normalised(passes: list[list[float]]) -> list[float]:
  """Per length, the median over passes of its times, each pass first divided by its own median
  ratio to the lengths' medians over all passes (a pass run while the machine was slow counts at
  the others' pace); scaled back to the medians' level."""
  t = np.asarray(passes, np.float64)                        # [passes, lengths]
  med = np.median(t, axis=0)
  phase = np.median(t / med, axis=1, keepdims=True)         # [passes, 1]
  return (np.median(t / phase, axis=0) * np.median(phase)).tolist()


def with_round_costs(params: AdaptiveParams, seconds: dict[int, float]) -> AdaptiveParams:
  """params choosing by measured seconds per round (`time_rounds`), at every padding and batch
  row of the cost tensor; for D >= 1 the curve through them (`fit_round_costs`), so that one noisy
  length cannot win or lose the choice alone."""
  fit = fit_round_costs(seconds)
  row = jnp.asarray([fit[d] for d in sorted(seconds)], params.cost.dtype)
  return dataclasses.replace(params, cost=jnp.broadcast_to(row, params.cost.shape))


def cost_tensor(costs: CostTable, batch_sizes, lengths, d_max: int, *args):
  """([P, len(batch_sizes), len(lengths)] round costs at each padding the table measured, [P] the
  paddings' log2); one entry (log2 0) where the costs do not depend on the padding. `args`:
  CostTable.round_costs' variable_length, plain, explore_every."""
  pads = costs.paddings or (None,)
  cost = [[costs.round_costs(b, lengths, d_max, *args, padding=p) for b in batch_sizes]
          for p in pads]
  log = [0.0] if pads == (None,) else [float(np.log2(p)) for p in pads]
  return jnp.asarray(np.asarray(cost, np.float32)), jnp.asarray(log, jnp.float32)


def padding_weights(log_padding: jax.Array, width: int) -> jax.Array:
  """[P]: the weights of the measured paddings' costs at a prompt padded to `width` tokens, linear
  in log2(width) between them and clamped outside (CostTable.round_costs' rule, in the round)."""
  x = jnp.log2(jnp.float32(width))
  return jax.vmap(lambda e: jnp.interp(x, log_padding, e))(jnp.eye(log_padding.shape[0]))


def cost_at(cost: jax.Array, mix: jax.Array) -> jax.Array:
  """[rows, K]: the [P, rows, K] costs mixed by `padding_weights`."""
  return jnp.tensordot(mix, cost, axes=1)


def expected_lengths(est: jax.Array, draft_len: jax.Array, lengths: tuple[int, ...],
                     plain: int = 1, widths: jax.Array | None = None) -> jax.Array:
  """[B, len(lengths)]: AL_b(D_k) = 1 + sum_{i <= min(D_k, len_b)} prod_{j <= i} est_bj; `plain`
  tokens for D_k = 0 (a plain round of that many steps). widths [B, K]: row b verifies
  widths[b, k] drafts at lengths[k] (per-row widths) instead of D_k."""
  b, d = est.shape
  proposed = jnp.arange(d)[None, :] < draft_len[:, None]
  reach = jnp.cumprod(est, axis=1) * proposed                     # P(the first i+1 accepted)
  csum = jnp.concatenate([jnp.zeros((b, 1), est.dtype), jnp.cumsum(reach, axis=1)], axis=1)
  if widths is None:
    widths = jnp.broadcast_to(jnp.asarray(lengths, jnp.int32), (b, len(lengths)))
  al = 1.0 + jnp.take_along_axis(csum, widths, axis=1)
  return jnp.where(jnp.asarray(lengths) == 0, float(plain), al)


def draft_ranks(est: jax.Array, draft_len: jax.Array, live: jax.Array) -> jax.Array:
  """[B, D] each draft position's rank in the batch (0 first) by the probability that it is
  reached and accepted, prod_{j <= i} est_bj; positions a row did not propose, and dead rows',
  last. Ties go to the earlier position, so the n best of the batch are a prefix of each row's
  chain, and giving each row its positions ranked below n maximises the batch's expected accepted
  drafts among all splits of n drafts (each row's probabilities fall along its chain)."""
  b, d = est.shape
  ok = (jnp.arange(d)[None, :] < draft_len[:, None]) & live[:, None]
  score = jnp.where(ok, jnp.cumprod(est, axis=1), -1.0)
  order = jnp.argsort(-score.T.reshape(-1), stable=True)   # position-major: earlier positions first
  ranks = jnp.zeros((d * b,), jnp.int32).at[order].set(jnp.arange(d * b, dtype=jnp.int32))
  return ranks.reshape(d, b).T


def choose_length(est, draft_len, live, lengths: tuple[int, ...], cost, plain: int = 1,
                  remaining=None, rate=None, widths=None):
  """The index into `lengths` to verify. Without `remaining`: the most tokens per unit cost,
  mean_b AL_b(D_k) / cost_k over the live rows. With `remaining` [B] (tokens each row may still
  make) and `rate` [B] (each row's long-run tokens per unit of cost; default: its best
  AL_b(D_k) / cost_k this round): the length after which the batch is projected to finish
  soonest, argmin_k tau logsumexp_b(F_b(k) / tau), F_b(k) = cost_k + max(R_b - AL_b(D_k), 0) / r_b
  over the live rows, tau = sqrt(mean R) / (2 mean r) (the module docstring); at B = 1 with the
  default rate, the same choice as without `remaining` while R exceeds every AL. widths [B, K]:
  per-row widths at each length (`expected_lengths`)."""
  al = expected_lengths(est, draft_len, lengths, plain, widths)   # [B, K]
  if remaining is not None:
    if rate is None:
      rate = jnp.max(al / cost, axis=1)
    rem = jnp.maximum(remaining, 1).astype(est.dtype)
    w = live.astype(est.dtype)
    n = jnp.maximum(jnp.sum(w), 1.0)
    rate = jnp.maximum(rate, 1e-6)
    tau = jnp.sqrt(jnp.sum(rem * w) / n) / (2.0 * jnp.sum(rate * w) / n)
    finish = cost[None, :] + jnp.maximum(rem[:, None] - al, 0.0) / rate[:, None]   # [B, K]
    z = jnp.where(live[:, None], finish / tau, -1e30)
    return jnp.argmin(jax.nn.logsumexp(z, axis=0)).astype(jnp.int32)   # ties: the shorter
  w = live.astype(est.dtype)[:, None]
  mean_al = jnp.sum(al * w, axis=0) / jnp.maximum(jnp.sum(w), 1.0)
  return jnp.argmax(mean_al / cost).astype(jnp.int32)            # ties: the shorter length


def update_estimates(est, width, n_acc, emitted, draft_tokens, draft_len, live, decay: float):
  """est [B, D]; width [] or [B]: the drafts verified this round; n_acc [B] accepted of them;
  emitted [B, D+1] the round's tokens (accepted drafts, then the correction or bonus)."""
  b, d = est.shape
  i = jnp.arange(d)[None, :]
  n = n_acc[:, None]
  width = jnp.broadcast_to(jnp.asarray(width, jnp.int32), (b,))[:, None]
  proposed = i < draft_len[:, None]
  accepted = i < n
  rejected = (i == n) & (i < width) & proposed
  bonus = jnp.take_along_axis(emitted, width, axis=1)                               # [B, 1]
  frontier = (i == width) & (n == width) & proposed
  value = jnp.where(accepted, 1.0, jnp.where(frontier, (bonus == draft_tokens).astype(est.dtype),
                                             0.0))
  seen = (accepted | rejected | frontier) & live[:, None]
  return jnp.where(seen, est + decay * (value - est), est)
