"""Per-step latency of the target on the current device: a plain decode step (one jitted forward of
one token per row against the cache) and a speculative round (`engine.spec_round`: draft, verify
1+D tokens, accept, commit) for each D, as wall µs per call and, from a profiler trace
(`pallas_kernels.timing.device_time`), device µs and kernel launches per call. JSON out.

Random weights of the default model's shape (bf16 off the CPU): the cost does not depend on the
values, and the 98 MB GGUF need not travel to the device. The weights (270 MB in bf16) exceed
twice an H200's L2, so no rotation is needed. Run it twice, with and without XLA's command buffers
(`XLA_FLAGS=--xla_gpu_enable_command_buffer=...`), to see what fewer launches buy.
  python -m jspec.bench.step_latency --json OUT.json [--batch-size 1] [--draft 1,3,7,15]
      [--calls 50] [--tiny]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from jspec import SpecDecoder, engine
from jspec.io import atomic_write_text, check_writable
from models.config import LlamaConfig
from models.kv_cache import KVCache, storage_dtype
from models.llama import Llama
from pallas_kernels.timing import device_time


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("cache",))
def _step(graphdef, weights, cache, tokens):
  out = nnx.merge(graphdef, weights)(tokens, cache)
  return jnp.argmax(out.logits[:, -1], axis=-1), out.cache


class PlainStep:
  """One decode step per call (a forward of `width` tokens per row: 1 + D for a verify), the cache
  donated and carried, its length held fixed at `context`."""

  def __init__(self, model: Llama, batch: int, context: int, max_len: int, width: int = 1):
    self.graphdef, self.weights = nnx.split(model)
    dtype = storage_dtype(model.cache_dtype)
    self.lengths = lambda: jnp.full((batch,), context, jnp.int32)   # fresh: the cache is donated
    self.cache = KVCache.init(model.config, batch, max_len, dtype=dtype).with_lengths(
        self.lengths())
    self.tokens = jnp.ones((batch, width), jnp.int32)

  def __call__(self):
    token, cache = _step(self.graphdef, self.weights, self.cache, self.tokens)
    self.cache = cache.with_lengths(self.lengths())
    return token


class Round:
  """One speculative round per call (n-gram drafter at a fixed D), the state carried."""

  def __init__(self, model: Llama, d: int, batch: int, context: int, calls: int):
    self.sd = SpecDecoder(model, {"method": "ngram", "num_speculative_tokens": d})
    prompt = [1 + i % 7 for i in range(context)]          # repeats: the drafter finds matches
    room = context + (d + 1) * (calls + 8) * 4 + 16
    self.state, self.sampling = self.sd.prefill([prompt] * batch, max_new_tokens=room - context - 1,
                                                eos=False, max_len=room)

  def __call__(self):
    sd = self.sd
    self.state = engine.spec_round(sd.graphdef, sd.weights, sd.drafter, sd.drafter_params,
                                   self.state, self.sampling, eos_ids=())
    return self.state.length


def wall_us(fn, calls: int) -> float:
  for _ in range(2):
    jax.block_until_ready(fn())
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append((time.perf_counter() - start) * 1e6)
  return statistics.median(times)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", required=True)
  p.add_argument("--batch-size", type=int, default=1)
  p.add_argument("--draft", default="1,3,7,15", help="draft lengths D of the rounds")
  p.add_argument("--context", type=int, default=512, help="committed tokens in the cache")
  p.add_argument("--calls", type=int, default=50, help="timed calls per point (and per trace)")
  p.add_argument("--tiny", action="store_true", help="a tiny random model (a smoke test)")
  args = p.parse_args(argv)
  try:
    check_writable(args.json)
    drafts = [int(x) for x in args.draft.split(",")]
  except ValueError as e:
    p.error(str(e))
  if args.batch_size < 1 or args.calls < 1 or min(drafts) < 1:
    p.error("--batch-size, --calls and every --draft must be >= 1")
  cfg = LlamaConfig.tiny() if args.tiny else LlamaConfig.smollm2_135m()
  context = min(args.context, cfg.max_position // 4)
  dtype = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
  model = Llama(cfg, dtype=dtype, rngs=nnx.Rngs(0))
  rows = []
  points = [("plain", 0, PlainStep(model, args.batch_size, context, context + 64))]
  points += [("round", d, Round(model, d, args.batch_size, context, args.calls)) for d in drafts]
  for kind, d, fn in points:
    row = dict(kind=kind, draft=d, batch_size=args.batch_size, wall_us=wall_us(fn, args.calls),
               device=device_time(fn, [()], calls=args.calls))
    rows.append(row)
    print(json.dumps(row), flush=True)
  plain = rows[0]
  for row in rows[1:]:
    row["wall_vs_plain"] = row["wall_us"] / plain["wall_us"]
    if row["device"] and plain["device"]:
      row["device_vs_plain"] = row["device"]["device_us"] / plain["device"]["device_us"]
  report = dict(model_shape="tiny" if args.tiny else "smollm2-135m", dtype=jnp.dtype(dtype).name,
                context=context, backend=jax.default_backend(), device=str(jax.devices()[0]),
                jax_version=jax.__version__, calls=args.calls, results=rows)
  atomic_write_text(args.json, json.dumps(report, indent=2))


if __name__ == "__main__":
  main()
