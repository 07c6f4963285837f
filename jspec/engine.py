"""The speculative round and the generate loop.

One round = draft -> verify -> accept -> commit, composed under one `jax.jit`:
  draft   drafter.propose(params, state, ctx, keys) -> Draft(tokens [B, D], q, length)
  verify  the target runs once over [last committed, d_1..d_D] at cache slots length-1 ...
  accept  rejection sampling with per-row first-rejection index (jspec.rejection)
  commit  per-row lengths advance by the emitted tokens (EOS, max_new_tokens and cache capacity
          truncate); nothing is copied: K/V past the new length is garbage the next round overwrites.
A tree draft (Draft.parent, jspec.tree) is verified in the same forward under its ancestor mask at
positions prefix + depth; the accepted path's K/V is then moved to contiguous slots.
`generate` is a `lax.while_loop` over rounds on device; `stream` is a host loop over the same
jitted round. A width policy (adaptive length) can also run as one program per width, the host
choosing between them when the choice changes (`spec_rounds_at`, `spec_choose`). B, D and the
buffer length are static; per-row progress lives in lengths and masks.

Invariant between rounds: `tokens[b, :length[b]]` is committed; the target cache holds K/V of the
first length-1 of them (the last committed token is fed at the start of the next verify).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jspec import tree
from jspec.drafters.base import Context, WidthPolicy
from jspec.rejection import verify
from jspec.sampling import SamplingParams, sample
from models.kv_cache import KVCache

RUNNING, STOP_EOS, STOP_LENGTH, STOP_CACHE_FULL = 0, 1, 2, 3
FINISH_REASONS = {RUNNING: "running", STOP_EOS: "stop", STOP_LENGTH: "length",
                  STOP_CACHE_FULL: "cache_full"}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Metrics:
  rounds: jax.Array        # [B] verify passes while the row was live
  drafted: jax.Array       # [B] draft tokens proposed while live
  accepted: jax.Array      # [B] draft tokens accepted while live
  emitted: jax.Array       # [B] tokens committed by rounds (the prefill's first token excluded)
  accepted_at: jax.Array   # [B, D] rounds in which draft position i was accepted
  offered_at: jax.Array    # [B, D] rounds that verified draft position i, the ones before accepted


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SpecState:
  tokens: jax.Array        # [B, S] committed tokens, prompt first
  length: jax.Array        # [B]
  prompt_len: jax.Array    # [B]
  max_new: jax.Array       # [B]
  finish: jax.Array        # [B] RUNNING or the reason the row stopped
  cache: KVCache           # target cache, lengths = length - 1
  drafter_state: Any
  keys: jax.Array          # [B] per-row PRNG keys
  round: jax.Array         # [] int32
  hidden: tuple            # target taps of the last verify, for drafters that want them
  metrics: Metrics

  @property
  def done(self) -> jax.Array:
    return self.finish != RUNNING

  def context(self, sampling: SamplingParams, num_new: jax.Array | None = None) -> Context:
    return Context(tokens=self.tokens, length=self.length, prompt_len=self.prompt_len,
                   sampling=sampling, target_hidden=self.hidden, num_new=num_new)


def _step_keys(keys: jax.Array, step: jax.Array, salt: int) -> jax.Array:
  return jax.vmap(lambda k: jax.random.fold_in(jax.random.fold_in(k, step), salt))(keys)


@functools.partial(jax.jit, static_argnames=("graphdef", "drafter", "max_len", "eos_ids"))
def spec_prefill(graphdef, weights, drafter, drafter_params, prompt: jax.Array,
                 prompt_len: jax.Array, max_new: jax.Array, sampling: SamplingParams,
                 keys: jax.Array, request: Any = None, *, max_len: int,
                 eos_ids: tuple[int, ...]) -> SpecState:
  """Prefills the target on the prompts, samples the first token, and initialises the drafter
  (which sees the prompt's hidden taps and the call's per-row drafter inputs, `request`)."""
  model = nnx.merge(graphdef, weights)
  b, p = prompt.shape
  cache = model.init_cache(b, max_len)
  out = model.prefill(prompt, cache, prompt_len, taps=drafter.target_taps)
  first = sample(_step_keys(keys, jnp.int32(0), 0), out.logits[:, 0], sampling)
  tokens = jnp.zeros((b, max_len), jnp.int32).at[:, :p].set(prompt)
  rows = jnp.arange(b)
  tokens = tokens.at[rows, prompt_len].set(first, mode="drop")
  is_eos = jnp.isin(first, jnp.asarray(eos_ids, jnp.int32)) if eos_ids else jnp.zeros((b,), bool)
  length = prompt_len + 1
  finish = jnp.where(is_eos, STOP_EOS, jnp.where(max_new <= 1, STOP_LENGTH,
                                                 jnp.where(length >= max_len, STOP_CACHE_FULL,
                                                           RUNNING)))
  d = drafter.num_draft
  zeros = jnp.zeros((b,), jnp.int32)
  metrics = Metrics(zeros, zeros, zeros, zeros, jnp.zeros((b, d), jnp.int32),
                    jnp.zeros((b, d), jnp.int32))
  state = SpecState(tokens=tokens, length=length, prompt_len=prompt_len, max_new=max_new,
                    finish=finish, cache=out.cache, drafter_state=None, keys=keys,
                    round=jnp.zeros((), jnp.int32), hidden=_empty_hidden(model, b, drafter),
                    metrics=metrics)
  ctx = dataclasses.replace(state.context(sampling),
                            target_hidden=tuple(h.astype(jnp.float32) for h in out.hidden),
                            request=request)
  dstate = drafter.init_state(drafter_params, prompt, ctx, max_len)
  return dataclasses.replace(state, drafter_state=dstate)


def _empty_hidden(model, b, drafter):
  h = model.config.hidden_size
  return tuple(jnp.zeros((b, drafter.num_draft + 1, h), jnp.float32) for _ in drafter.target_taps)


def round_step(model, drafter, drafter_params, state: SpecState, sampling: SamplingParams,
               eos_ids: tuple[int, ...]) -> SpecState:
  """One speculative round (traceable; `spec_round` and `spec_generate` jit it)."""
  b, s = state.tokens.shape
  d = drafter.num_draft
  rows = jnp.arange(b)
  live = ~state.done
  remaining = state.max_new - (state.length - state.prompt_len)   # tokens each row may still make
  step = state.round + 1
  ctx = state.context(sampling)

  # 1-3. draft; verify [last committed, d_1..d_W] in one target forward; accept by rejection
  # sampling. W = D, or the width a width policy picks among its compiled lengths (jspec.adaptive).
  draft_keys = _step_keys(state.keys, step, 1)
  verify_keys = _step_keys(state.keys, step, 2)
  n_more = jnp.zeros((), jnp.int32)       # plain steps after a plain round's first (adaptive)
  extra_argmax = None
  if isinstance(drafter, WidthPolicy):
    n_acc, n_more, new, out_cache, hidden, extra_argmax, draft_len, dstate = _policy_round(
        model, drafter, drafter_params, state, ctx, sampling, live, remaining, step, draft_keys,
        verify_keys)
  else:
    draft, dstate = drafter.propose(drafter_params, state.drafter_state, ctx, draft_keys)
    draft_len = draft.length if draft.length is not None else jnp.full((b,), d, jnp.int32)
    if draft.parent is not None:
      n_acc, new, out_cache, hidden = _verify_tree(model, drafter, state, draft, draft_len,
                                                   sampling, verify_keys)
    else:
      n_acc, new, out_cache, hidden, extra_argmax = _verify_width(
          model, drafter, state, draft, draft_len, sampling, verify_keys, width=d)
  n_out = n_acc + n_more      # the round's tokens, less one

  # 4. commit: EOS inside the block, max_new_tokens and cache capacity truncate per row
  j = jnp.arange(d + 1)[None, :]
  is_eos = jnp.isin(new, jnp.asarray(eos_ids, jnp.int32)) if eos_ids else jnp.zeros_like(new, bool)
  eos_at = jnp.min(jnp.where(is_eos & (j <= n_out[:, None]), j, d + 1), axis=1)   # [B]
  generated = state.length - state.prompt_len
  room_new = state.max_new - generated
  room_cache = s - state.length
  n_emit = jnp.minimum(jnp.minimum(n_out + 1, eos_at + 1), jnp.minimum(room_new, room_cache))
  n_emit = jnp.where(live, jnp.maximum(n_emit, 0), 0)
  slots = jnp.where(j < n_emit[:, None], state.length[:, None] + j, s)           # s = dropped
  tokens = state.tokens.at[rows[:, None], slots].set(new, mode="drop")
  length = state.length + n_emit
  hit_eos = live & (eos_at < n_emit)
  finish = jnp.where(
      ~live, state.finish,
      jnp.where(hit_eos, STOP_EOS,
                jnp.where(length - state.prompt_len >= state.max_new, STOP_LENGTH,
                          jnp.where(length >= s, STOP_CACHE_FULL, RUNNING))))
  m = state.metrics
  live_i = live.astype(jnp.int32)
  forwards = jnp.where(n_more > 0, jnp.maximum(n_emit, 1), 1)     # target forwards that counted
  i = jnp.arange(d)[None, :]
  offered = (i < draft_len[:, None]) & (i <= n_acc[:, None])
  metrics = Metrics(
      rounds=m.rounds + live_i * forwards, drafted=m.drafted + live_i * draft_len,
      accepted=m.accepted + live_i * n_acc, emitted=m.emitted + n_emit,
      accepted_at=m.accepted_at + live_i[:, None] * (i < n_acc[:, None]),
      offered_at=m.offered_at + live_i[:, None] * offered)
  state = dataclasses.replace(
      state, tokens=tokens, length=length, finish=finish, round=step,
      cache=out_cache.with_lengths(jnp.maximum(length - 1, 0)), drafter_state=dstate,
      hidden=hidden, metrics=metrics)
  ctx = dataclasses.replace(state.context(sampling, n_emit), extra_argmax=extra_argmax)
  dstate = drafter.commit(drafter_params, state.drafter_state, ctx)
  return dataclasses.replace(state, drafter_state=dstate)


def _policy_round(model, drafter: WidthPolicy, drafter_params, state: SpecState, ctx, sampling,
                  live, remaining, step, draft_keys, verify_keys):
  """Draft, choose the width and verify it, for a width policy (jspec.adaptive, jspec.confidence).
  A serial drafter is asked for only the drafts the chosen width verifies (one more in some
  rounds); otherwise the choice sees this round's draft. The branches of the switch leave the
  target cache alone (a branch returning a written cache makes XLA copy all of it every round) and
  return the block's K/V, padded to D + 1, written once here. A plain round (width 0) goes on for
  plain_block - 1 more target steps, so that the round's fixed work is paid once per plain_block
  tokens. Returns (n_acc, n_more, new, cache, hidden, extra_argmax, draft_len, drafter state)."""
  b, d = state.tokens.shape[0], drafter.num_draft
  fixed = drafter.fixed_index
  dstate = drafter.prepare(drafter_params, state.drafter_state, ctx)
  if fixed is not None:
    k = jnp.int32(fixed)
  elif drafter.choose_before_drafting:
    k = drafter.choose(drafter_params, dstate, jnp.full((b,), d, jnp.int32), live, remaining)
  if drafter.choose_before_drafting:
    widths = drafter.row_widths(drafter_params, dstate, jnp.full((b,), d, jnp.int32), live, k)
    num = drafter.num_to_draft(k, step, widths)
    draft, dstate = drafter.propose(drafter_params, dstate, ctx, draft_keys, num=num)
  else:
    draft, dstate = drafter.propose(drafter_params, dstate, ctx, draft_keys)
  draft_len = draft.length if draft.length is not None else jnp.full((b,), d, jnp.int32)
  if fixed is None and not drafter.choose_before_drafting:
    k = drafter.choose(drafter_params, dstate, draft_len, live, remaining)
  if not drafter.choose_before_drafting:
    widths = drafter.row_widths(drafter_params, dstate, draft_len, live, k)
  verify_at = [functools.partial(_verify_width, model, drafter, width=drafter.block_width(i, b),
                                 packed=drafter.packed_tokens(i, b))
               for i in range(len(drafter.lengths))]
  if fixed is not None:       # one width, known when traced: the cache is written in place
    n_acc, new, out_cache, hidden, extra_argmax = verify_at[fixed](
        state, draft, draft_len, sampling, verify_keys, row_width=widths)
  else:
    n_acc, new, new_kv, hidden, extra_argmax = jax.lax.switch(
        k, [functools.partial(f, write=False) for f in verify_at],
        state, draft, draft_len, sampling, verify_keys, widths)
    out_cache = state.cache.write_block(*new_kv)
  dstate = drafter.observe(drafter_params, dstate, k, widths, n_acc, new, draft.tokens, draft_len,
                           live)
  draft_len = jnp.minimum(draft_len, widths)
  n_more = jnp.zeros((), jnp.int32)
  if drafter.plain_block > 1 and draft.extra is None and fixed in (None, 0):
    n_more = jnp.where(k == 0, drafter.plain_block - 1, 0)
    new, out_cache, hidden = _plain_steps(model, drafter, state, out_cache, new, hidden, n_more,
                                          sampling, verify_keys)
  return n_acc, n_more, new, out_cache, hidden, extra_argmax, draft_len, dstate


def _plain_steps(model, drafter, state: SpecState, cache, new, hidden, n_more, sampling, keys):
  """n_more [] plain decode steps after a plain round's first token (new[:, 0]): step i feeds
  new[:, i - 1] at position length - 1 + i, writing the cache in place, and samples new[:, i] from
  the target exactly as a width-0 verify does (keys folded with i); the taps fill hidden[:, i]."""
  b = new.shape[0]
  no_draft = jnp.zeros((b, 0), jnp.int32)

  def body(carry):
    i, cache, new, hidden = carry
    tok = jax.lax.dynamic_slice_in_dim(new, i - 1, 1, axis=1)                     # [B, 1]
    out = model(tok, cache.with_lengths(state.length - 1 + i), taps=drafter.target_taps)
    step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, i)
    _, t = verify(step_keys, out.logits, sampling, no_draft, None, jnp.zeros((b,), jnp.int32))
    new = jax.lax.dynamic_update_slice_in_dim(new, t[:, :1].astype(new.dtype), i, axis=1)
    hidden = tuple(jax.lax.dynamic_update_slice_in_dim(h, x.astype(h.dtype), i, axis=1)
                   for h, x in zip(hidden, out.hidden))
    return i + 1, out.cache, new, hidden

  _, cache, new, hidden = jax.lax.while_loop(lambda c: c[0] <= n_more, body,
                                             (jnp.int32(1), cache, new, hidden))
  return new, cache, hidden


def _verify_width(model, drafter, state: SpecState, draft, draft_len, sampling, keys,
                  row_width=None, *, width: int, write: bool = True, packed: int | None = None):
  """Verifies the first `width` drafts, or row b's first row_width[b] <= width ([B], a width
  policy's per-row widths); `packed`: the verify runs only the rows' 1 + row_width[b] tokens,
  padded to that many (`pack_index`). Returns (n_acc [B], tokens [B, D+1] (the first n_acc + 1
  are the round's output), the target cache (write=False: the block's K/V instead, L x [B, D+1+E,
  KVH, Dh] for k and for v, zero past the block), the block's taps [B, D+1, H], extra argmax)."""
  b, d = draft.tokens.shape
  rows = jnp.arange(b)
  last = state.tokens[rows, state.length - 1]
  block = jnp.concatenate([last[:, None], draft.tokens[:, :width]], axis=1)       # [B, W+1]
  limit = width if row_width is None else jnp.minimum(row_width, width)
  pack = None if packed is None else pack_index(limit + 1, width + 1, packed)
  if draft.extra is None:
    out = model(block, state.cache, taps=drafter.target_taps, write_cache=write,
                pack=pack)                                                        # [B, W+1, V]
    extra_argmax = None
  else:
    out, extra_argmax = verify_with_extras(model, drafter, state, block, draft.extra, write)
  q = None if draft.q is None else draft.q[:, :width]
  n_acc, new = verify(keys, out.logits[:, :width + 1], sampling, draft.tokens[:, :width], q,
                      jnp.minimum(draft_len, limit))
  pad = d - width
  new = jnp.pad(new, ((0, 0), (0, pad)))
  hidden = tuple(jnp.pad(h[:, :width + 1].astype(jnp.float32), ((0, 0), (0, pad), (0, 0)))
                 for h in out.hidden)
  if write:
    return n_acc, new, out.cache, hidden, extra_argmax
  kv = tuple(tuple(jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in xs) for xs in out.new_kv)
  return n_acc, new, kv, hidden, extra_argmax


def pack_index(counts: jax.Array, width: int, total: int) -> jax.Array:
  """[total] indices into a flattened [B, width] block: row b's first counts[b] positions, in
  order, then positions past the rows' counts to fill `total` (sum(counts) <= total <= B x width;
  the forward's work on those is discarded)."""
  kept = jnp.arange(width)[None, :] < counts[:, None]
  return jnp.argsort(~kept.reshape(-1), stable=True)[:total].astype(jnp.int32)


def _verify_tree(model, drafter, state: SpecState, draft, num_nodes, sampling, keys):
  """Verifies a tree draft (jspec.tree) in one forward over [last committed, nodes] at positions
  prefix + depth under the ancestor mask, accepts a root-to-node path, and compacts: the forward writes
  the block at slots length-1 .., then the path's K/V moves to the contiguous slots from length-1,
  and the block's taps are gathered along the path. Returns (n_acc, emitted [B, N+1], cache, taps)."""
  b, n = draft.tokens.shape
  last = state.tokens[jnp.arange(b), state.length - 1]
  block = jnp.concatenate([last[:, None], draft.tokens], axis=1)                 # [B, N+1]
  # a node whose block slot falls past the cache is never accepted (nor are its descendants)
  num_nodes = jnp.minimum(num_nodes, state.tokens.shape[1] - state.length)
  mask = tree.ancestor_mask(draft.parent)
  positions = (state.length - 1)[:, None] + tree.depths(mask)
  out = model(block, state.cache, positions=positions, tree_mask=mask, taps=drafter.target_taps)
  n_acc, path, new = tree.verify(keys, out.logits, sampling, draft.tokens, draft.parent, draft.q,
                                 num_nodes)
  cache = tree.compact(out.cache, state.length - 1, path)
  hidden = tuple(jnp.take_along_axis(h, path[:, :, None], axis=1).astype(jnp.float32)
                 for h in out.hidden)
  return n_acc, new, cache, hidden


def verify_with_extras(model, drafter, state: SpecState, block: jax.Array, extra,
                       write: bool = True):
  """The verify forward over [block, extras]: the chain stays causal and never sees the extras;
  each extra sees the last committed token (block index 0) and the extras its mask allows.
  Returns the forward (logits [B, D+1, V]) and the argmax after the extras named by
  extra.outputs [B, K]."""
  b, t = block.shape                                       # t = D + 1
  e = extra.tokens.shape[1]
  tokens = jnp.concatenate([block, extra.tokens], axis=1)                        # [B, T+E]
  base = (state.length - 1)[:, None]
  positions = base + jnp.concatenate(
      [jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)), extra.positions], axis=1)
  chain = jnp.concatenate([jnp.tril(jnp.ones((t, t), bool)), jnp.zeros((t, e), bool)], axis=1)
  sees_last = jnp.zeros((b, e, t), bool).at[:, :, 0].set(True)
  mask = jnp.concatenate([jnp.broadcast_to(chain, (b, t, t + e)),
                          jnp.concatenate([sees_last, extra.mask], axis=2)], axis=1)  # [B, T+E, T+E]
  k = extra.outputs.shape[1]
  idx = jnp.concatenate([jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)),
                         t + extra.outputs.astype(jnp.int32)], axis=1)            # [B, T+K]
  out = model(tokens, state.cache, positions=positions, tree_mask=mask, logit_indices=idx,
              taps=drafter.target_taps, write_cache=write)
  return out, jnp.argmax(out.logits[:, t:t + k], axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "drafter", "eos_ids"), donate_argnums=(4,))
def spec_round(graphdef, weights, drafter, drafter_params, state: SpecState,
               sampling: SamplingParams, *, eos_ids: tuple[int, ...]) -> SpecState:
  """One jitted round, for host-driven loops (streaming)."""
  return round_step(nnx.merge(graphdef, weights), drafter, drafter_params, state, sampling,
                    eos_ids)


def next_width(drafter: WidthPolicy, drafter_params, state: SpecState,
               sampling: SamplingParams) -> jax.Array:
  """[] the index into drafter.lengths that the next round would choose, from the committed state
  (what `_policy_round` chooses at its start: the same estimates, regimes and, for a drafter that
  chooses after drafting, the proposal counts of the draft the round will make with its keys)."""
  b, d = state.tokens.shape[0], drafter.num_draft
  ctx = state.context(sampling)
  live = ~state.done
  remaining = state.max_new - (state.length - state.prompt_len)
  dstate = drafter.prepare(drafter_params, state.drafter_state, ctx)
  draft_len = jnp.full((b,), d, jnp.int32)
  if not drafter.choose_before_drafting:
    draft, _ = drafter.propose(drafter_params, dstate, ctx,
                               _step_keys(state.keys, state.round + 1, 1))
    if draft.length is not None:
      draft_len = draft.length
  return drafter.choose(drafter_params, dstate, draft_len, live, remaining)


@functools.partial(jax.jit, static_argnames=("drafter",))
def spec_choose(drafter, drafter_params, state: SpecState, sampling: SamplingParams) -> jax.Array:
  """The first round's width index, for a host-chosen loop (`spec_rounds_at`)."""
  return next_width(drafter, drafter_params, state, sampling)


@functools.partial(jax.jit, static_argnames=("graphdef", "drafter", "eos_ids"), donate_argnums=(4,))
def spec_rounds_at(graphdef, weights, drafter, drafter_params, state: SpecState,
                   sampling: SamplingParams, *, eos_ids: tuple[int, ...]):
  """Rounds of a width policy fixed at k = `drafter.fixed_index` (one program per width, no
  switch), on device for as long as the choice after each round stays k and a row is live (the
  first round runs: the host chose k). Returns (state, the next round's width index [], any row
  live []): the host goes on with that width's program."""
  model = nnx.merge(graphdef, weights)
  k = drafter.fixed_index

  def body(carry):
    state, _ = carry
    state = round_step(model, drafter, drafter_params, state, sampling, eos_ids)
    return state, next_width(drafter, drafter_params, state, sampling)

  state, nxt = jax.lax.while_loop(lambda c: (c[1] == k) & ~jnp.all(c[0].done), body,
                                  (state, jnp.int32(k)))
  return state, nxt, ~jnp.all(state.done)


@functools.partial(jax.jit, static_argnames=("graphdef", "drafter", "eos_ids"), donate_argnums=(4,))
def spec_generate(graphdef, weights, drafter, drafter_params, state: SpecState,
                  sampling: SamplingParams, *, eos_ids: tuple[int, ...]) -> SpecState:
  """Rounds until every row is done, on device."""
  model = nnx.merge(graphdef, weights)
  return jax.lax.while_loop(
      lambda s: ~jnp.all(s.done),
      lambda s: round_step(model, drafter, drafter_params, s, sampling, eos_ids), state)
