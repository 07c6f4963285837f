"""Plain (non-speculative) decoding: jitted prefill and an on-device `lax.while_loop` generate loop
for a batch of ragged prompts, with per-row sampling parameters, EOS and max_new_tokens.

This is the baseline every speculative speedup is measured against, and it shares prefill and the
sampling path with the speculative engine.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jspec import sharding
from jspec.sampling import SamplingParams, sample
from models.kv_cache import KVCache, storage_dtype
from models.llama import Llama


def bucket(n: int, minimum: int = 16) -> int:
  """Power-of-two padding so that nearby prompt lengths share one compiled program."""
  return max(minimum, 1 << max(0, n - 1).bit_length())


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("cache",))
def prefill(graphdef, weights, cache: KVCache, tokens: jax.Array, prompt_lens: jax.Array):
  """tokens [B, P] right-padded; returns (last-position logits [B, V], cache with lengths=prompt_lens).
  The cache is donated (updated in place, no copy of it per call)."""
  model = nnx.merge(graphdef, weights)
  out = model.prefill(tokens, cache, prompt_lens)
  return out.logits[:, 0], out.cache


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
  tokens: jax.Array          # [B, N] generated tokens (N = buffer size)
  margins: jax.Array         # [B, N] top-2 raw-logit gap at each step (near-tie detection)
  num_generated: jax.Array   # [B]
  done: jax.Array            # [B] bool
  cache: KVCache
  keys: jax.Array            # [B] per-row PRNG keys
  step: jax.Array            # [] int32


def top2_gap(logits: jax.Array) -> jax.Array:
  """[B, V] -> [B] gap between the two largest logits (two max passes: lax.top_k inside a
  while loop costs ~40 ms per step on XLA:CPU at B=4)."""
  best = jnp.argmax(logits, axis=-1)
  first = jnp.take_along_axis(logits, best[:, None], axis=-1)[:, 0]
  rest = jnp.where(jnp.arange(logits.shape[-1])[None, :] == best[:, None], -jnp.inf, logits)
  return first - jnp.max(rest, axis=-1)


def _emit(state: DecodeState, logits: jax.Array, new: jax.Array, max_new: jax.Array,
          eos_ids: tuple[int, ...]):
  live = ~state.done
  rows = jnp.arange(new.shape[0])
  slot = jnp.where(live, state.num_generated, state.tokens.shape[1])  # finished rows write nowhere
  tokens = state.tokens.at[rows, slot].set(new, mode="drop")
  margins = state.margins.at[rows, slot].set(top2_gap(logits), mode="drop")
  n = state.num_generated + live.astype(jnp.int32)
  is_eos = jnp.isin(new, jnp.asarray(eos_ids, jnp.int32)) if eos_ids else jnp.zeros_like(live)
  done = state.done | (live & is_eos) | (n >= max_new)
  return dataclasses.replace(state, tokens=tokens, margins=margins, num_generated=n, done=done)


@functools.partial(jax.jit, static_argnames=("graphdef", "buffer_len", "eos_ids"),
                   donate_argnames=("cache",))
def decode(graphdef, weights, cache: KVCache, first_logits: jax.Array, params: SamplingParams,
           keys: jax.Array, max_new: jax.Array, *, buffer_len: int, eos_ids: tuple[int, ...]):
  """Samples from the prefill logits, then one token per step until every row is done."""
  model = nnx.merge(graphdef, weights)
  b = first_logits.shape[0]
  state = DecodeState(tokens=jnp.zeros((b, buffer_len), jnp.int32),
                      margins=jnp.zeros((b, buffer_len), jnp.float32),
                      num_generated=jnp.zeros((b,), jnp.int32), done=max_new <= 0, cache=cache,
                      keys=keys, step=jnp.zeros((), jnp.int32))
  step_keys = jax.vmap(jax.random.fold_in, (0, None))(keys, 0)
  state = _emit(state, first_logits, sample(step_keys, first_logits, params), max_new, eos_ids)

  def cond(s: DecodeState):
    return ~jnp.all(s.done)

  def body(s: DecodeState):
    last = s.tokens[jnp.arange(b), jnp.maximum(s.num_generated - 1, 0)]
    out = model(last[:, None], s.cache, num_new=(~s.done).astype(jnp.int32))
    step = s.step + 1
    ks = jax.vmap(jax.random.fold_in, (0, None))(s.keys, step)
    s = dataclasses.replace(s, cache=out.cache, step=step)
    logits = out.logits[:, 0]
    return _emit(s, logits, sample(ks, logits, params), max_new, eos_ids)

  return jax.lax.while_loop(cond, body, state)


@dataclasses.dataclass
class DecodeOutput:
  token_ids: list[list[int]]     # generated tokens per row (EOS included when it stopped there)
  finish_reason: list[str]       # "stop" (EOS) or "length"
  prefill_s: float
  decode_s: float
  compile_s: float = 0.0         # ahead-of-time compilation, 0 when the shapes were seen before
  margins: list[list[float]] = dataclasses.field(default_factory=list)
  # per generated token, the gap between the two largest raw logits it was chosen from

  @property
  def num_tokens(self) -> int:
    return sum(len(t) for t in self.token_ids)

  @property
  def tokens_per_s(self) -> float:
    """Generated tokens per second of prefill + decode (compilation excluded)."""
    return self.num_tokens / max(self.prefill_s + self.decode_s, 1e-9)

  @property
  def decode_tokens_per_s(self) -> float:
    """Tokens per second of the decode loop alone (each row's first token comes from the prefill)."""
    after_first = sum(max(len(t) - 1, 0) for t in self.token_ids)
    return after_first / max(self.decode_s, 1e-9)


def _is_int(x) -> bool:
  """An integer scalar: Python, numpy, or a 0-d integer array (jax included); never bool/float."""
  if isinstance(x, (bool, np.bool_)):
    return False
  return isinstance(x, (int, np.integer)) or (
      np.ndim(x) == 0 and np.issubdtype(getattr(x, "dtype", np.float64), np.integer))


def _ndim(x) -> int | None:
  try:
    return np.ndim(x)
  except ValueError:   # ragged nesting
    return None


_ROWS = ("prompts must be a list of token-id lists, one per row (e.g. [[1, 2, 3]]): wrap a "
         "single prompt in a list, and encode text with the tokenizer first")


def pad_prompts(prompts: Sequence[Sequence[int]], max_context: int, vocab_size: int,
                pad_to: int = 0):
  """Validates token-id prompts and right-pads them to a bucketed length (at least `pad_to`, so
  that callers can share one compiled shape across batches)."""
  if isinstance(prompts, (str, bytes)):
    raise ValueError(f"{_ROWS}; got a {type(prompts).__name__}")
  if not len(prompts):
    raise ValueError("no prompts given")
  lens = []
  for i, p in enumerate(prompts):
    if isinstance(p, (str, bytes)) or _ndim(p) != 1:
      raise ValueError(f"{_ROWS}; prompt {i} is {p!r:.40} ({type(p).__name__})")
    if len(p) == 0:
      raise ValueError(f"prompt {i} is empty; give at least one token")
    if len(p) > max_context:
      raise ValueError(f"prompt {i} has {len(p)} tokens, more than the model's context of "
                       f"{max_context}; shorten it")
    arr = np.asarray(p)
    if arr.dtype.kind not in "iu" and not all(_is_int(x) for x in p):
      bad = next(x for x in p if not _is_int(x))   # floats and bools are never truncated to ids
      raise ValueError(f"prompt {i} has a non-integer token id {bad!r}; token ids must be ints")
    if arr.min() < 0 or arr.max() >= vocab_size:
      raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size})")
    lens.append(len(p))
  width = max(bucket(max(lens)), pad_to)
  tokens = np.zeros((len(prompts), width), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, :len(p)] = p
  return tokens, np.asarray(lens, np.int32)


def validate_request(prompts, max_new_tokens, config, pad_to: int = 0):
  """Checks prompts and per-row limits against the model; returns (padded tokens, lengths,
  max_new [B]). Everything a user can get wrong fails here, before any compilation; limits are
  compared as Python ints, so no value wraps around in int32."""
  tokens, lens = pad_prompts(prompts, config.max_position, config.vocab_size, pad_to)
  b = len(prompts)
  per_row = [max_new_tokens] * b if np.ndim(max_new_tokens) == 0 else list(max_new_tokens)
  if len(per_row) != b or not all(_is_int(m) for m in per_row):
    raise ValueError(f"max_new_tokens must be an integer, or a list of {b} integers (one per "
                     f"row), got {max_new_tokens!r}")
  per_row = [int(m) for m in per_row]
  if min(per_row) < 1:
    raise ValueError(f"max_new_tokens must be >= 1 per row, got {max_new_tokens!r}")
  for i, (n, m) in enumerate(zip(lens.tolist(), per_row)):
    if n + m > config.max_position:
      raise ValueError(f"prompt {i} ({n} tokens) + max_new_tokens ({m}) exceeds the model's "
                       f"context of {config.max_position}; lower max_new_tokens to at most "
                       f"{config.max_position - n}")
  return tokens, lens, np.asarray(per_row, np.int32)


def row_keys(seed: int | Sequence[int], batch_size: int) -> jax.Array:
  """Per-row keys: an int seed gives row b the key fold_in(seed, b); a list gives one seed per row."""
  if np.ndim(seed) == 0:
    base = jax.random.key(int(seed))
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(batch_size))
  if len(seed) != batch_size:
    raise ValueError(f"{len(seed)} seeds for a batch of {batch_size} rows")
  return jax.vmap(jax.random.key)(jnp.asarray(seed, jnp.uint32))


class Decoder:
  """Plain decoding of one model. `generate` takes token-id prompts; shapes are bucketed so that
  repeated calls with similar prompts reuse one compiled program."""

  def __init__(self, model: Llama, *, eos_ids: Sequence[int] = (), mesh=None):
    """mesh: a `jax.sharding.Mesh` or a spec such as "data=2,model=4" (`jspec.sharding`): the
    weights are placed on it and every program runs under it."""
    self.config = model.config
    self.activation_dtype = model.activation_dtype
    self.cache_dtype = model.cache_dtype
    self.graphdef, self.weights = nnx.split(model)
    self.mesh = sharding.as_mesh(mesh)
    if self.mesh is not None:
      self.weights = sharding.shard_weights(self.weights, self.config, self.mesh)
    self.eos_ids = tuple(sorted(set(int(i) for i in eos_ids)))
    self._programs = {}   # (B, prompt bucket, buffer, eos) -> compiled (prefill, decode)

  def clear_compiled(self) -> None:
    """Drops the compiled programs (each shape's executables stay in memory until then)."""
    self._programs.clear()

  def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int | Sequence[int] = 128,
               temperature=0.0, top_k=0, top_p=1.0, seed: int | Sequence[int] = 0,
               eos: bool = True, pad_to: int = 0) -> DecodeOutput:
    with sharding.on_mesh(self.mesh):
      return self._generate(prompts, max_new_tokens, temperature, top_k, top_p, seed, eos, pad_to)

  def _generate(self, prompts, max_new_tokens, temperature, top_k, top_p, seed, eos, pad_to):
    tokens, lens, max_new = validate_request(prompts, max_new_tokens, self.config, pad_to)
    b = len(prompts)
    params = SamplingParams.make(b, temperature, top_k, top_p)
    buffer_len = int(max_new.max())
    cache = KVCache.init(self.config, b, tokens.shape[1] + buffer_len,
                         dtype=storage_dtype(self.cache_dtype))
    args_pre = (self.weights, cache, jnp.asarray(tokens), jnp.asarray(lens))
    eos_ids = self.eos_ids if eos else ()
    key = (b, tokens.shape[1], buffer_len, eos_ids)
    t0 = time.perf_counter()
    if key not in self._programs:  # compile ahead of time so that timings never include it
      lowered = prefill.lower(self.graphdef, *args_pre)
      run_prefill = lowered.compile()
      # The decode loop is compiled for the prefill's outputs as they come (on a mesh: as placed).
      logits_shape, cache_shape = sharding.output_specs(lowered, run_prefill)
      self._programs[key] = (
          run_prefill,
          decode.lower(self.graphdef, self.weights, cache_shape, logits_shape, params,
                       row_keys(0, b), jnp.asarray(max_new), buffer_len=buffer_len,
                       eos_ids=eos_ids).compile())
    run_prefill, run_decode = self._programs[key]
    t1 = time.perf_counter()
    logits, cache = run_prefill(*args_pre)
    logits.block_until_ready()
    t2 = time.perf_counter()
    state = run_decode(self.weights, cache, logits, params, row_keys(seed, b), jnp.asarray(max_new))
    out_tokens = sharding.to_host(state.tokens)
    margins = sharding.to_host(state.margins)
    n = sharding.to_host(state.num_generated)
    t3 = time.perf_counter()
    rows = [out_tokens[i, :n[i]].tolist() for i in range(b)]
    reasons = ["stop" if r and r[-1] in eos_ids else "length" for r in rows]
    return DecodeOutput(token_ids=rows, finish_reason=reasons, prefill_s=t2 - t1, decode_s=t3 - t2,
                        compile_s=t1 - t0, margins=[margins[i, :n[i]].tolist() for i in range(b)])

  @property
  def weights_dtype(self):
    """The dtype of activations (float32 for weights in a stored format)."""
    return self.activation_dtype
