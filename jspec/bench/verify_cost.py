"""Verification cost of the target: one forward over T tokens against a filled cache, as a multiple
of a T=1 decode step, per batch size, attention and matmul implementation (JSON out).

The cost model's T(1+D)/T(1). Every point is compiled and warmed up first, then the points are
timed round-robin (medians over rounds), so a slow phase of the machine hits all of them alike;
within a round each point runs twice back to back and the second call is timed, as in a decode
loop, where the last-level cache still holds the weights from the step before. Beside each point: the bandwidth roofline, the time one pass over the
weights and the attended K/V takes at the bandwidth measured in the same run (random weights of the
default model's shape: the cost does not depend on the values).
  python -m jspec.bench.verify_cost --json OUT.json [--batch-sizes 1,4] [--tokens 1,2,4,8]
      [--matmul-impls auto,xla] [--impls reference]
"""

from __future__ import annotations

import argparse
import json
import statistics

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.io import atomic_write_text, check_writable
from jspec.timing import Point, measure_bandwidth
from models.config import LlamaConfig
from models.llama import Llama


def step_bytes(model: Llama, batch: int, context: int) -> int:
  """Bytes a forward must read at least: every weight once, plus the K/V it attends over."""
  weights = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(nnx.state(model)))
  cfg = model.config
  kv = 2 * cfg.num_layers * batch * context * cfg.num_kv_heads * cfg.head_dim
  return weights + kv * model.cache_dtype.itemsize


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", required=True)
  p.add_argument("--batch-sizes", default="1,4")
  p.add_argument("--tokens", default="1,2,3,4,6,8,16")
  p.add_argument("--impls", default="reference", help="attention: reference,pallas")
  p.add_argument("--matmul-impls", default="auto", help="auto,xla (see models.cpu_gemm)")
  p.add_argument("--context", type=int, default=512, help="committed tokens in the cache")
  p.add_argument("--max-len", type=int, default=1024, help="cache length")
  p.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 elsewhere")
  p.add_argument("--repeats", type=int, default=15, help="timing rounds over all points")
  args = p.parse_args(argv)
  try:
    check_writable(args.json)
  except ValueError as e:
    p.error(str(e))
  ints = lambda s: [int(x) for x in s.split(",")]
  cfg = LlamaConfig.smollm2_135m()
  dtype = jnp.dtype(args.dtype or ("float32" if jax.default_backend() == "cpu" else "bfloat16"))
  # One set of weights for every point: the CPU's last-level cache holds much of the model, and
  # a real decode loop reuses one set of weights, so separate copies would time cold caches.
  model = Llama(cfg, dtype=dtype, rngs=nnx.Rngs(0))
  weights = nnx.state(model)
  nbytes = {b: step_bytes(model, b, args.context) for b in ints(args.batch_sizes)}
  points = []
  for impl in args.impls.split(","):
    for matmul in args.matmul_impls.split(","):
      graphdef = nnx.graphdef(nnx.eval_shape(
          lambda: Llama(cfg, dtype=dtype, attention_impl=impl, matmul_impl=matmul)))
      for b in ints(args.batch_sizes):
        for t in ints(args.tokens):
          points.append(Point(graphdef, weights, cfg, impl, matmul, b, t, args.context,
                              args.max_len))
          print(f"compiled {points[-1].key}", flush=True)
  # Bandwidth before and after the rounds, not between them: its 512 MB pass would evict the
  # weights from the last-level cache and make the next point pay for a cold start.
  bandwidths = [measure_bandwidth(repeats=3)]
  for r in range(args.repeats):
    for point in points:
      point.call()       # untimed: a decode loop runs steps back to back, so time a warm cache
      point.times.append(point.call())
    print(f"round {r + 1}/{args.repeats}", flush=True)
  bandwidths.append(measure_bandwidth(repeats=3))
  bw = statistics.mean(bandwidths)
  rows = []
  for point in points:
    ms = 1e3 * statistics.median(point.times)
    base = next(q for q in points if q.key == {**point.key, "tokens": 1}) \
        if any(q.key == {**point.key, "tokens": 1} for q in points) else None
    b = point.key["batch_size"]
    rows.append(dict(**point.key, ms=ms,
                     ms_p25=1e3 * statistics.quantiles(point.times, n=4)[0],
                     ms_p75=1e3 * statistics.quantiles(point.times, n=4)[2],
                     relative_to_t1=None if base is None else ms / (1e3 * statistics.median(base.times)),
                     roofline_ms=1e3 * nbytes[b] / bw))
    print(json.dumps(rows[-1]), flush=True)
  report = dict(model_shape="smollm2-135m", dtype=str(dtype), context=args.context,
                max_len=args.max_len, backend=jax.default_backend(), device=str(jax.devices()[0]),
                jax_version=jax.__version__, bandwidth_gb_s=bw / 1e9, repeats=args.repeats,
                results=rows)
  atomic_write_text(args.json, json.dumps(report, indent=2))
  print(table(report))


def table(report: dict) -> str:
  """Markdown: one row per (impl, matmul impl, B), T(T)/T(1) per column, T=1 ms and roofline."""
  groups: dict = {}
  for r in report["results"]:
    groups.setdefault((r["impl"], r["matmul_impl"], r["batch_size"]), []).append(r)
  tokens = sorted({r["tokens"] for r in report["results"]})
  lines = ["| attention | matmul | B | " + " | ".join(f"T={t}" for t in tokens)
           + " | T=1 ms | roofline ms |", "|" + "---|" * (len(tokens) + 5)]
  for (impl, matmul, b), rs in groups.items():
    by_t = {r["tokens"]: r for r in rs}
    cells = [f"{by_t[t]['relative_to_t1']:.2f}" if t in by_t and by_t[t]["relative_to_t1"]
             else "—" for t in tokens]
    t1 = f"{by_t[1]['ms']:.1f}" if 1 in by_t else "—"
    lines.append(f"| {impl} | {matmul} | {b} | " + " | ".join(cells)
                 + f" | {t1} | {rs[0]['roofline_ms']:.1f} |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
