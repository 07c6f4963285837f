"""Timing primitives that the benchmarks and the planner share: the parts of a speculative round
timed alone on a real post-prefill state, one target forward against a filled cache, and the read
bandwidth of the device."""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jspec.decode import row_keys
from jspec.engine import verify_with_extras
from models.config import LlamaConfig
from models.kv_cache import KVCache, storage_dtype


def measure_bandwidth(n_bytes: int = 1 << 29, repeats: int = 7) -> float:
  """Bytes/s that XLA reads on this backend (median of `repeats` full reductions)."""
  x = jnp.ones((n_bytes // 4,), jnp.float32)
  f = jax.jit(lambda a: jnp.sum(a))
  f(x).block_until_ready()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    f(x).block_until_ready()
    times.append(time.perf_counter() - t)
  return n_bytes / statistics.median(times)


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("cache",))
def _forward(graphdef, weights, cache, tokens):
  out = nnx.merge(graphdef, weights)(tokens, cache)
  return out.logits, out.cache


class Point:
  """One (impl, matmul impl, B, T) forward, compiled and warmed up, with its own cache."""

  def __init__(self, graphdef, weights, config: LlamaConfig, impl: str, matmul: str, batch: int,
               t: int, context: int, max_len: int):
    self.key = dict(impl=impl, matmul_impl=matmul, batch_size=batch, tokens=t)
    self.graphdef, self.weights = graphdef, weights
    dtype = storage_dtype(nnx.merge(graphdef, weights).cache_dtype)
    self.lengths = lambda: jnp.full((batch,), context, jnp.int32)   # fresh: the cache is donated
    self.cache = KVCache.init(config, batch, max_len, dtype=dtype).with_lengths(self.lengths())
    self.tokens = jnp.ones((batch, t), jnp.int32)
    self.times: list[float] = []
    for _ in range(2):          # the first call compiles
      self.call()

  def call(self) -> float:
    start = time.perf_counter()
    logits, cache = _forward(self.graphdef, self.weights, self.cache, self.tokens)
    logits.block_until_ready()
    elapsed = time.perf_counter() - start
    self.cache = cache.with_lengths(self.lengths())
    return elapsed


@functools.partial(jax.jit, static_argnames=("graphdef", "taps"), donate_argnames=("cache",))
def _verify(graphdef, weights, cache, block, taps):
  out = nnx.merge(graphdef, weights)(block, cache, taps=taps)
  return out.logits, out.cache, out.hidden


@functools.partial(jax.jit, static_argnames=("drafter",), donate_argnames=("dstate",))
def _draft(drafter, drafter_params, dstate, ctx, keys):
  draft, dstate = drafter.propose(drafter_params, dstate, ctx, keys)
  if draft.extra is not None:   # stand-ins of the right shape for the target's outputs there
    ctx = dataclasses.replace(ctx, extra_argmax=jnp.take_along_axis(
        draft.extra.tokens, draft.extra.outputs, axis=1))
  return draft, drafter.commit(drafter_params, dstate, ctx)


def _median_time(fn, repeats: int) -> float:
  jax.block_until_ready(fn())            # compile and warm up
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return statistics.median(times)


@functools.partial(jax.jit, static_argnames=("graphdef", "drafter"), donate_argnames=("cache",))
def _verify_extras(graphdef, weights, drafter, cache, state, block, extra):
  state = dataclasses.replace(state, cache=cache)
  out, _ = verify_with_extras(nnx.merge(graphdef, weights), drafter, state, block, extra)
  return out.logits, out.cache


def time_verify(spec, state, repeats: int = 5, sampling=None) -> float:
  """Median seconds of the target's pass over 1+D tokens at `state` (its cache is consumed), plus
  the unverified tokens a drafter adds to it (lookahead's window; `sampling` needed then).

  The cache is donated and fed back, so that no call pays for a copy the real round never makes."""
  if spec.drafter.num_extra:
    return _time_verify_extras(spec, state, sampling, repeats)
  d = spec.num_draft
  slots = jnp.clip(state.length[:, None] - 1 + jnp.arange(d + 1)[None, :], 0,
                   state.tokens.shape[1] - 1)
  block = jnp.take_along_axis(state.tokens, slots, axis=1)                      # [B, 1+D]
  lengths = np.asarray(state.cache.lengths)      # host copy: the device one is donated
  box = {"cache": state.cache}

  def verify():
    logits, cache, _ = _verify(spec.graphdef, spec.weights, box["cache"], block,
                               spec.drafter.target_taps)
    box["cache"] = cache.with_lengths(jnp.asarray(lengths))
    return logits

  return _median_time(verify, repeats)


def time_draft(spec, state, sampling, repeats: int = 5) -> float:
  """Median seconds of the drafter's propose + commit at `state` (its drafter state is consumed);
  commit sees a round that committed every drafted token."""
  b = state.tokens.shape[0]
  ctx = state.context(sampling, jnp.full((b,), spec.num_draft + 1, jnp.int32))
  keys = row_keys(0, state.tokens.shape[0])
  box = {"dstate": state.drafter_state}

  def draft():
    out, box["dstate"] = _draft(spec.drafter, spec.drafter_params, box["dstate"], ctx, keys)
    return out

  return _median_time(draft, repeats)


def _time_verify_extras(spec, state, sampling, repeats: int) -> float:
  """The verify forward with the drafter's extra tokens, as the round runs it (the drafter state
  is read, not consumed)."""
  b = state.length.shape[0]
  draft, _ = jax.jit(spec.drafter.propose)(spec.drafter_params, state.drafter_state,
                                           state.context(sampling), row_keys(0, b))
  block = jnp.concatenate([state.tokens[jnp.arange(b), state.length - 1][:, None], draft.tokens],
                          axis=1)                                               # [B, 1+D]
  lengths = np.asarray(state.cache.lengths)
  light = dataclasses.replace(state, cache=None)
  box = {"cache": state.cache}

  def verify():
    logits, cache = _verify_extras(spec.graphdef, spec.weights, spec.drafter, box["cache"], light,
                                   block, draft.extra)
    box["cache"] = cache.with_lengths(jnp.asarray(lengths))
    return logits

  return _median_time(verify, repeats)
