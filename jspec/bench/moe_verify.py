"""Cost of verifying D drafts through an MoE layer: T_verif(B·(1+D)) / T_verif(B), per batch size B
and draft length D (co-design guideline 1: drafts push the expert GEMMs from memory- toward
compute-bound, and every extra token may wake experts the batch did not touch), JSON out.

One MoE layer (router, top-k, SwiGLU experts through `pallas_kernels.moe_gemm.gmm`), random weights
of the given shape. Every point is compiled and warmed up, then the points are timed round-robin
(medians over rounds). Beside each point: how many distinct experts the tokens route to (the expert
weights a GPU must read), and the FLOPs of the routed rows. --check-kernels runs the GPU and TPU
Pallas kernels (interpret mode off their device) against lax.ragged_dot on the smallest points.
  python -m jspec.bench.moe_verify --json OUT.json [--experts 64 --top-k 8 --hidden 1024
      --ffn 256 --batch-sizes 1,8,64 --draft 0,1,3,7,15 --impl auto --repeats 5 --check-kernels]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jspec.io import atomic_write_text, check_writable
from pallas_kernels.moe_gemm import ep


def _ints(text: str, flag: str) -> list[int]:
  try:
    values = [int(x) for x in text.split(",")]
  except ValueError:
    raise SystemExit(f"moe_verify: {flag} takes comma-separated integers, got {text!r}") from None
  if any(v < 0 for v in values):
    raise SystemExit(f"moe_verify: {flag} values must be >= 0, got {text!r}")
  return values


def _layer(impl: str, top_k: int):
  return jax.jit(functools.partial(ep.moe_reference, top_k=top_k, impl=impl))


def check_kernels(params, top_k: int, tokens: list[int], hidden: int) -> list[dict]:
  """Max |kernel - ragged_dot| of the whole layer for each Pallas backend (interpret mode off its
  device), relative to the output's scale."""
  rows = []
  for t in tokens:
    x = jax.random.normal(jax.random.key(t), (t, hidden), jnp.float32)
    want = _layer("reference", top_k)(params, x)
    for impl in ("pallas_gpu", "pallas_tpu"):
      got = _layer(impl, top_k)(params, x)
      rows.append(dict(impl=impl, tokens=t, max_rel_err=float(
          jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))))
      print(json.dumps(rows[-1]), flush=True)
  return rows


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", required=True)
  p.add_argument("--experts", type=int, default=64)
  p.add_argument("--top-k", type=int, default=8)
  p.add_argument("--hidden", type=int, default=1024)
  p.add_argument("--ffn", type=int, default=256, help="each expert's intermediate size")
  p.add_argument("--batch-sizes", default="1,8,64")
  p.add_argument("--draft", default="0,1,3,7,15", help="draft lengths D (0: a plain step)")
  p.add_argument("--impl", default="auto", help="the grouped GEMM (pallas_kernels.moe_gemm.gmm)")
  p.add_argument("--repeats", type=int, default=5, help="timing rounds over all points")
  p.add_argument("--check-kernels", action="store_true",
                 help="also compare the Pallas kernels (interpret mode off-device) with ragged_dot")
  args = p.parse_args(argv)
  try:
    check_writable(args.json)
  except ValueError as e:
    p.error(str(e))
  batches, drafts = _ints(args.batch_sizes, "--batch-sizes"), _ints(args.draft, "--draft")
  if not 1 <= args.top_k <= args.experts:
    p.error(f"--top-k must be in [1, --experts={args.experts}], got {args.top_k}")
  if 0 not in drafts:
    p.error("--draft must include 0: every ratio is against a plain step (D = 0)")
  dtype = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
  params = ep.init_moe_params(jax.random.key(0), args.hidden, args.ffn, args.experts, dtype)
  layer = _layer(args.impl, args.top_k)
  points = []
  for b in batches:
    for d in drafts:
      t = b * (1 + d)
      x = jax.random.normal(jax.random.key(t), (t, args.hidden), jnp.float32).astype(dtype)
      experts, _ = ep.route(params.router, x, args.top_k)
      points.append(dict(batch_size=b, draft=d, tokens=t, x=x, times=[],
                         experts_touched=int(np.unique(np.asarray(experts)).size)))
      jax.block_until_ready(layer(params, x))    # compile + warm up
      jax.block_until_ready(layer(params, x))
      print(f"compiled B={b} D={d} (T={t})", flush=True)
  for r in range(args.repeats):
    for pt in points:
      start = time.perf_counter()
      jax.block_until_ready(layer(params, pt["x"]))
      pt["times"].append(time.perf_counter() - start)
    print(f"round {r + 1}/{args.repeats}", flush=True)
  rows = []
  routed_flops = lambda t: 2 * 3 * t * args.top_k * args.hidden * args.ffn
  for pt in points:
    ms = 1e3 * statistics.median(pt["times"])
    base = next(q for q in points if q["batch_size"] == pt["batch_size"] and q["draft"] == 0)
    rows.append(dict(batch_size=pt["batch_size"], draft=pt["draft"], tokens=pt["tokens"], ms=ms,
                     relative_to_d0=ms / (1e3 * statistics.median(base["times"])),
                     experts_touched=pt["experts_touched"],
                     routed_gflop=routed_flops(pt["tokens"]) / 1e9))
    print(json.dumps(rows[-1]), flush=True)
  report = dict(experts=args.experts, top_k=args.top_k, hidden=args.hidden, ffn=args.ffn,
                impl=args.impl, dtype=jnp.dtype(dtype).name, backend=jax.default_backend(),
                device=str(jax.devices()[0]), jax_version=jax.__version__,
                repeats=args.repeats, results=rows)
  if args.check_kernels:
    small = sorted({pt["tokens"] for pt in points})[:2]
    report["kernel_check"] = check_kernels(params, args.top_k, small, args.hidden)
  atomic_write_text(args.json, json.dumps(report, indent=2))
  print(table(report))


def table(report: dict) -> str:
  """Markdown: one row per B, T(B(1+D))/T(B) per D, with the experts touched."""
  drafts = sorted({r["draft"] for r in report["results"]})
  lines = ["| B | " + " | ".join(f"D={d}" for d in drafts) + " | D=0 ms |",
           "|---|" + "---|" * (len(drafts) + 1)]
  for b in sorted({r["batch_size"] for r in report["results"]}):
    cells = {r["draft"]: r for r in report["results"] if r["batch_size"] == b}
    lines.append(f"| {b} | " + " | ".join(
        f"{cells[d]['relative_to_d0']:.2f}x ({cells[d]['experts_touched']} exp.)" for d in drafts)
        + f" | {cells[0]['ms']:.1f} |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
