"""Batched plain decoding with slot refill: a fixed set of rows ("slots") decodes on device, and
whenever enough rows have finished, the host prefills the next requests into their slots. A batch
never waits on its longest row, and rows of any prompt and reply length share the same compiled
programs, so throughput stays at the batch size's rate over a whole stream of requests (batch
inference, training-data regeneration).

Each request's tokens depend only on the request (its prompt, limits, sampling parameters and
seed): a sampled row draws token j with the key fold_in(key(seed), j), whichever slot it runs in
and whatever runs beside it. Optionally the target's hidden states are captured for every token of
every sequence while it is generated (`taps`): the prompt's from the prefill, each reply token's
from the step that feeds it back, so that training features need no second forward pass.

Programs (compiled once per prompt-width bucket): `admit` prefills up to `admit_width` prompts in
a small cache of their own and copies it into the chosen slots; `run` steps every slot until at
least `want` slots are free; `harvest` gathers finished slots' tokens (and features).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from typing import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jspec.decode import bucket
from jspec.sampling import SamplingParams, sample
from models.kv_cache import KVCache, set_rows, storage_dtype
from models.llama import Llama

MIN_PROMPT_WIDTH = 64     # smallest prompt-width bucket of `admit` (fewer compiled programs)


@dataclasses.dataclass(frozen=True)
class Request:
  """One prompt to answer. temperature 0 = greedy; seed keys the sampled draws."""
  prompt: Sequence[int]
  max_new_tokens: int
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0


@dataclasses.dataclass
class Result:
  index: object                    # the request's position (generate) or tag (stream)
  token_ids: list[int]             # generated tokens (EOS included when it stopped there)
  finish_reason: str               # "stop" (EOS) or "length"
  features: np.ndarray | None = None
  # with taps: bfloat16 [len(prompt) + len(token_ids), K + 1, H]: for each token of prompt + reply,
  # the K taps and the final normed hidden state of the forward that read it


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SlotState:
  tokens: jax.Array          # [B, N] generated tokens per slot
  num_generated: jax.Array   # [B]
  max_new: jax.Array         # [B]
  ended: jax.Array           # [B] bool: no more tokens (EOS or max_new)
  free: jax.Array            # [B] bool: ended and, with taps, its last token's features taken
  seeds: jax.Array           # [B] uint32
  params: SamplingParams     # [B] per slot
  feats: jax.Array           # [B, N, K + 1, H] bfloat16 (N = 0 without taps)
  cache: KVCache


def _features(model: Llama, hidden: Sequence[jax.Array]) -> jax.Array:
  """taps (the last one being the final layer's output) -> bfloat16 [B, T, K + 1, H], the final
  hidden state normed."""
  out = list(hidden[:-1]) + [model.norm(hidden[-1])]
  return jnp.stack(out, axis=2).astype(jnp.bfloat16)


def _draw(state: SlotState, logits: jax.Array, rows_live: jax.Array, eos_ids: tuple[int, ...]):
  """Samples the next token of every row in rows_live (per-row key fold_in(seed, n))."""
  b = logits.shape[0]
  keys = jax.vmap(lambda s, n: jax.random.fold_in(jax.random.key(s), n))(
      state.seeds, state.num_generated)
  new = sample(keys, logits, state.params)
  slot = jnp.where(rows_live, state.num_generated, state.tokens.shape[1])
  tokens = state.tokens.at[jnp.arange(b), slot].set(new, mode="drop")
  n = state.num_generated + rows_live.astype(jnp.int32)
  is_eos = jnp.isin(new, jnp.asarray(eos_ids, jnp.int32)) if eos_ids else jnp.zeros_like(rows_live)
  ended = state.ended | (rows_live & (is_eos | (n >= state.max_new)))
  return dataclasses.replace(state, tokens=tokens, num_generated=n, ended=ended)


@functools.partial(jax.jit, static_argnames=("graphdef", "taps", "eos_ids"),
                   donate_argnames=("state",))
def _admit(graphdef, weights, state: SlotState, slots, tokens, lens, max_new, seeds, params,
           *, taps: tuple[int, ...], eos_ids: tuple[int, ...]):
  """Prefills tokens [A, P] (row a holds lens[a] tokens; rows with slots[a] >= B are padding) into
  the given slots and draws each one's first token. Returns (state, prompt features [A, P, K+1, H]
  or None)."""
  model = nnx.merge(graphdef, weights)
  a, p = tokens.shape
  b = state.tokens.shape[0]
  small = KVCache.init(model.config, a, p, dtype=state.cache.k[0].dtype)
  out = model.prefill(tokens, small, lens, taps=taps)
  rows, cols = slots[:, None], jnp.arange(p)[None, :]
  put = lambda big, new: set_rows(big, rows, cols, new)
  cache = KVCache(k=tuple(put(x, y) for x, y in zip(state.cache.k, out.cache.k)),
                  v=tuple(put(x, y) for x, y in zip(state.cache.v, out.cache.v)),
                  lengths=state.cache.lengths.at[slots].set(lens, mode="drop"))
  at = lambda x, y: x.at[slots].set(y, mode="drop")
  state = SlotState(
      tokens=at(state.tokens, jnp.zeros((a,) + state.tokens.shape[1:], jnp.int32)),
      num_generated=at(state.num_generated, 0), max_new=at(state.max_new, max_new),
      ended=at(state.ended, False), free=at(state.free, False), seeds=at(state.seeds, seeds),
      params=jax.tree.map(at, state.params, params), feats=state.feats, cache=cache)
  admitted = jnp.zeros((b,), bool).at[slots].set(True, mode="drop")
  first = jnp.zeros((b, out.logits.shape[-1]), jnp.float32).at[slots].set(
      out.logits[:, 0], mode="drop")
  state = _draw(state, first, admitted, eos_ids)
  if not taps:
    return dataclasses.replace(state, free=state.ended), None
  return state, _features(model, out.hidden)


@functools.partial(jax.jit, static_argnames=("graphdef", "taps", "eos_ids"),
                   donate_argnames=("state",))
def _run(graphdef, weights, state: SlotState, want, *, taps: tuple[int, ...],
         eos_ids: tuple[int, ...]):
  """Steps every busy slot until at least `want` slots are free (or all are)."""
  model = nnx.merge(graphdef, weights)
  b = state.tokens.shape[0]

  def cond(s: SlotState):
    n_free = jnp.sum(s.free)
    return (n_free < want) & (n_free < b)

  def body(s: SlotState):
    last = s.tokens[jnp.arange(b), jnp.maximum(s.num_generated - 1, 0)]
    out = model(last[:, None], s.cache, num_new=(~s.ended).astype(jnp.int32), taps=taps)
    ended_before = s.ended
    s = dataclasses.replace(s, cache=out.cache)
    if taps:
      # the features of each busy row's last token (its final one too: hence one more step)
      slot = jnp.where(s.free, s.feats.shape[1], s.num_generated - 1)
      feats = s.feats.at[jnp.arange(b), slot].set(_features(model, out.hidden)[:, 0], mode="drop")
      s = dataclasses.replace(s, feats=feats)
    s = _draw(s, out.logits[:, 0], ~s.ended, eos_ids)
    return dataclasses.replace(s, free=s.free | (ended_before if taps else s.ended))

  return jax.lax.while_loop(cond, body, state)


@functools.partial(jax.jit, static_argnames=("with_feats",))
def _harvest(state: SlotState, slots, *, with_feats: bool):
  got = (state.tokens[slots], state.num_generated[slots])
  return got + ((state.feats[slots],) if with_feats else ())


class SlotDecoder:
  """Plain decoding of a stream of requests over `slots` rows with refill.

  slots: rows decoded together (the batch size); max_len: cache length per slot (every request's
  prompt + max_new_tokens must fit); admit_width: prompts prefilled per refill (the host refills
  once that many slots are free, so smaller means less idle time, larger means fewer calls);
  max_new_tokens: the largest reply any request may ask for (the per-slot token buffer);
  taps: hidden-state taps to capture (`Llama` convention; the final normed hidden state is added),
  () for none."""

  def __init__(self, model: Llama, *, eos_ids: Sequence[int] = (), slots: int = 64,
               max_len: int = 1024, max_new_tokens: int = 512, admit_width: int | None = None,
               taps: Sequence[int] = ()):
    cfg = model.config
    admit_width = max(1, slots // 8) if admit_width is None else admit_width
    if slots < 1 or not 1 <= admit_width <= slots:
      raise ValueError(f"need slots >= 1 and 1 <= admit_width <= slots, got slots={slots}, "
                       f"admit_width={admit_width}")
    if not 1 <= max_new_tokens < max_len <= cfg.max_position:
      raise ValueError(f"need 1 <= max_new_tokens < max_len <= the model's context "
                       f"({cfg.max_position}), got max_new_tokens={max_new_tokens}, "
                       f"max_len={max_len}")
    for tap in taps:
      if not 0 <= tap < cfg.num_layers:
        raise ValueError(f"tap {tap} out of range [0, {cfg.num_layers}) (the final hidden state "
                         "is always captured with taps)")
    self.config = cfg
    self.cache_dtype = model.cache_dtype
    self.graphdef, self.weights = nnx.split(model)
    self.eos_ids = tuple(sorted(set(int(i) for i in eos_ids)))
    self.slots, self.max_len, self.admit_width = slots, max_len, admit_width
    self.max_new_tokens = max_new_tokens
    self.taps = tuple(int(t) for t in taps) + ((cfg.num_layers,) if taps else ())
    self.stats = dict(admits=0, runs=0, prefill_tokens=0, generated_tokens=0, seconds=0.0,
                      admit_s=0.0, run_s=0.0)

  def _init_state(self) -> SlotState:
    b, n, cfg = self.slots, self.max_new_tokens, self.config
    dtype = storage_dtype(self.cache_dtype)
    k = len(self.taps)
    return SlotState(
        tokens=jnp.zeros((b, n), jnp.int32), num_generated=jnp.zeros((b,), jnp.int32),
        max_new=jnp.zeros((b,), jnp.int32), ended=jnp.ones((b,), bool),
        free=jnp.ones((b,), bool), seeds=jnp.zeros((b,), jnp.uint32),
        params=SamplingParams.make(b), cache=KVCache.init(cfg, b, self.max_len, dtype=dtype),
        feats=jnp.zeros((b, n if k else 0, k, cfg.hidden_size), jnp.bfloat16))

  def check(self, r: Request, where: str = "request") -> None:
    """Raises ValueError (saying what to change) unless this decoder can answer r."""
    if not isinstance(r, Request):
      raise ValueError(f"{where} is a {type(r).__name__}; pass jspec.slots.Request objects")
    n = len(r.prompt)
    if n == 0:
      raise ValueError(f"{where} has an empty prompt; give at least one token")
    if not 1 <= r.max_new_tokens <= self.max_new_tokens:
      raise ValueError(f"{where} asks for max_new_tokens={r.max_new_tokens}; this decoder "
                       f"allows 1..{self.max_new_tokens} (raise its max_new_tokens)")
    if n + r.max_new_tokens > self.max_len:
      raise ValueError(f"{where}: prompt ({n} tokens) + max_new_tokens ({r.max_new_tokens}) "
                       f"exceeds the slot length {self.max_len}; shorten it or raise max_len")
    lo, hi = min(r.prompt), max(r.prompt)
    if lo < 0 or hi >= self.config.vocab_size:
      raise ValueError(f"{where} has token ids outside [0, {self.config.vocab_size})")
    SamplingParams.make(1, r.temperature, r.top_k, r.top_p)     # validates them

  def generate(self, requests: Sequence[Request], *,
               progress: Callable[[Result], None] | None = None) -> list[Result]:
    """Answers every request; results in request order. Requests are validated before any work,
    then admitted longest prompt first (fewer prompt-width buckets per refill)."""
    requests = list(requests)
    for i, r in enumerate(requests):
      self.check(r, f"request {i}")
    out: list[Result | None] = [None] * len(requests)
    order = sorted(range(len(requests)), key=lambda i: (-len(requests[i].prompt), i))
    for res in self.stream(collections.deque((i, requests[i]) for i in order)):
      out[res.index] = res
      if progress is not None:
        progress(res)
    return out

  def stream(self, queue: collections.deque) -> Iterator[Result]:
    """Answers the (tag, Request) pairs of `queue` in its order, yielding each Result (its `index`
    = the tag) as soon as the request ends. The caller may append to the queue while iterating
    (e.g. a follow-up turn of a finished conversation); the stream ends when the queue is empty
    and every slot is free."""
    b, a = self.slots, self.admit_width
    state = self._init_state()
    owner: list = [None] * b                  # tag per slot (None: empty)
    prompt_feats: dict = {}
    t0 = time.perf_counter()
    while True:
      free = np.asarray(state.free)
      done = [s for s in range(b) if free[s] and owner[s] is not None]
      if done:
        yield from self._harvest(state, done, owner, prompt_feats)
      empty = [s for s in range(b) if owner[s] is None]
      while queue and len(empty) >= min(a, len(queue)):
        group = [queue.popleft() for _ in range(min(a, len(empty), len(queue)))]
        for tag, r in group:
          self.check(r, f"request {tag!r}")
        state, feats = self._admit(state, group, empty[:len(group)])
        for j, (s, (tag, r)) in enumerate(zip(empty, group)):
          owner[s] = tag
          if feats is not None:
            prompt_feats[tag] = feats[j, :len(r.prompt)]
        empty = empty[len(group):]
      if all(o is None for o in owner):
        break
      # with nothing queued, return each time admit_width more rows end (their results may
      # queue follow-ups) rather than once every slot is free
      want = min(a, len(queue)) if queue else min(b, len(empty) + a)
      t = time.perf_counter()
      state = _run(self.graphdef, self.weights, state, jnp.int32(want), taps=self.taps,
                   eos_ids=self.eos_ids)
      state.free.block_until_ready()
      self.stats["runs"] += 1
      self.stats["run_s"] += time.perf_counter() - t
    self.stats["seconds"] += time.perf_counter() - t0

  def _admit(self, state, group, slots):
    a = self.admit_width
    width = min(max(MIN_PROMPT_WIDTH, bucket(max(len(r.prompt) for _, r in group))), self.max_len)
    tokens = np.zeros((a, width), np.int32)
    lens = np.ones((a,), np.int32)
    max_new = np.ones((a,), np.int32)
    seeds = np.zeros((a,), np.uint32)
    idx = np.full((a,), self.slots, np.int32)         # padding rows write nowhere
    for j, ((_, r), s) in enumerate(zip(group, slots)):
      tokens[j, :len(r.prompt)] = r.prompt
      lens[j], max_new[j], seeds[j], idx[j] = len(r.prompt), r.max_new_tokens, r.seed, s
    pad = a - len(group)
    pick = lambda f: [f(r) for _, r in group] + [f(group[-1][1])] * pad
    params = SamplingParams.make(a, pick(lambda r: r.temperature), pick(lambda r: r.top_k),
                                 pick(lambda r: r.top_p))
    t = time.perf_counter()
    state, feats = _admit(self.graphdef, self.weights, state, jnp.asarray(idx),
                          jnp.asarray(tokens), jnp.asarray(lens), jnp.asarray(max_new),
                          jnp.asarray(seeds), params, taps=self.taps, eos_ids=self.eos_ids)
    state.free.block_until_ready()
    self.stats["admits"] += 1
    self.stats["admit_s"] += time.perf_counter() - t
    self.stats["prefill_tokens"] += int(sum(len(r.prompt) for _, r in group))
    return state, (None if feats is None else np.asarray(feats))

  def _harvest(self, state, done, owner, prompt_feats) -> Iterator[Result]:
    a = self.admit_width
    for lo in range(0, len(done), a):        # gathered admit_width slots at a time: one program
      part = done[lo:lo + a]
      got = _harvest(state, jnp.asarray(part + [part[-1]] * (a - len(part)), jnp.int32),
                     with_feats=bool(self.taps))
      tokens, n = np.asarray(got[0]), np.asarray(got[1])
      feats = np.asarray(got[2]) if self.taps else None
      for j, s in enumerate(part):
        tag = owner[s]
        owner[s] = None
        row = tokens[j, :n[j]].tolist()
        self.stats["generated_tokens"] += len(row)
        reason = "stop" if row and row[-1] in self.eos_ids else "length"
        f = None
        if feats is not None:
          f = np.concatenate([prompt_feats.pop(tag), feats[j, :n[j]]], axis=0)
        yield Result(index=tag, token_ids=row, finish_reason=reason, features=f)
