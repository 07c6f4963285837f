"""Verification cost of the target: one forward over T tokens against a half-full cache, as a
multiple of a T=1 decode step, per batch size and attention implementation (JSON out).

The cost model's T(1+D)/T(1); on a GPU it shows how far verification is "free" (random weights of
the default model's shape: the cost does not depend on the values).
  python -m jspec.bench.verify_cost --json OUT.json [--batch-sizes 1,16] [--tokens 1,2,4,8,16]
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

from jspec.io import atomic_write_text, check_writable
from models.config import LlamaConfig
from models.kv_cache import KVCache
from models.llama import Llama


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("cache",))
def _forward(graphdef, weights, cache, tokens):
  out = nnx.merge(graphdef, weights)(tokens, cache)
  return out.logits, out.cache


def measure(model: Llama, batch: int, t: int, context: int, max_len: int, repeats: int) -> float:
  graphdef, weights = nnx.split(model)
  dtype = jax.tree_util.tree_leaves(weights)[0].dtype
  cache = KVCache.init(model.config, batch, max_len, dtype=dtype).with_lengths(
      jnp.full((batch,), context, jnp.int32))
  tokens = jnp.ones((batch, t), jnp.int32)
  times = []
  for i in range(repeats + 2):       # two warm-up calls (the first compiles)
    start = time.perf_counter()
    logits, cache = _forward(graphdef, weights, cache, tokens)
    logits.block_until_ready()
    cache = cache.with_lengths(jnp.full((batch,), context, jnp.int32))
    if i >= 2:
      times.append(time.perf_counter() - start)
  return statistics.median(times)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", required=True)
  p.add_argument("--batch-sizes", default="1,16")
  p.add_argument("--tokens", default="1,2,4,8,16")
  p.add_argument("--impls", default="reference,pallas")
  p.add_argument("--context", type=int, default=1024, help="committed tokens in the cache")
  p.add_argument("--max-len", type=int, default=2048, help="cache length")
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--budget-s", type=float, default=120.0, help="start no point after this")
  args = p.parse_args(argv)
  try:
    check_writable(args.json)
  except ValueError as e:
    p.error(str(e))
  ints = lambda s: [int(x) for x in s.split(",")]
  cfg = LlamaConfig.smollm2_135m()
  dtype = jnp.dtype(args.dtype)
  start = time.perf_counter()
  rows = []
  for impl in args.impls.split(","):
    model = Llama(cfg, dtype=dtype, rngs=nnx.Rngs(0), attention_impl=impl)
    for b in ints(args.batch_sizes):
      base = None
      for t in ints(args.tokens):
        if time.perf_counter() - start > args.budget_s:
          print(f"skipped {impl} B={b} T={t}: over the time budget", flush=True)
          continue
        s = measure(model, b, t, args.context, args.max_len, args.repeats)
        base = s if t == 1 else base
        rows.append(dict(impl=impl, batch_size=b, tokens=t, ms=1e3 * s,
                         relative_to_t1=None if base is None else s / base))
        print(json.dumps(rows[-1]), flush=True)
  report = dict(model_shape="smollm2-135m", dtype=args.dtype, context=args.context,
                max_len=args.max_len, backend=jax.default_backend(), device=str(jax.devices()[0]),
                jax_version=jax.__version__, results=rows)
  atomic_write_text(args.json, json.dumps(report, indent=2))


if __name__ == "__main__":
  main()
