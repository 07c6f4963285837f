"""Kernel benchmark on the local device into one JSON: verification attention (Pallas kernel vs the
XLA reference, with achieved HBM bandwidth) and the MoE grouped GEMM when that op ships a benchmark.
Wall time per call includes Python dispatch; --device-time adds the device's own time per call from
a profiler trace (`timing.device_time`: K/V rotated over copies larger than twice the L2, three
runs, median and spread), and the bandwidth it implies.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import itertools
import json
import statistics
import time
import warnings

import jax
import jax.numpy as jnp

from pallas_kernels.timing import call_ms, device_time, rotation
from pallas_kernels.verify_attention import api

# KV cache of kv_len slots holding kv_len - T committed tokens plus the T new ones.
FULL = dict(ts=(1, 2, 4, 8, 16), groups=(1, 4, 8), kv_lens=(4096, 32768), batch=1, kv_heads=8,
            head_dim=128, dtype=jnp.bfloat16, repeats=20)
QUICK = dict(ts=(1, 3), groups=(4,), kv_lens=(64,), batch=1, kv_heads=2, head_dim=16,
             dtype=jnp.float32, repeats=3)
# Extra kernel points per kv_len: (T, G, num_splits), to show what split-KV buys.
UNSPLIT = ((1, 1, 1), (4, 8, 1))


def median_ms(fn, *args, repeats: int) -> tuple[float, float]:
  """(median, min) wall milliseconds of fn(*args) after two warm-up calls."""
  times = call_ms(fn, *args, repeats=repeats)
  return statistics.median(times), min(times)


def run_attention(quick: bool = False, budget_s: float = 150.0, device: bool = False,
                  grid: dict | None = None) -> list[dict]:
  """One row per (kv_len, G, T, impl): median/min ms, K/V bytes read per ms as GB/s, error vs the
  reference, and the kernel's tiling; with `device`, the device time per call too. Points not
  started within budget_s seconds are skipped (each point compiles a kernel), so the command stays
  inside its time limit. grid: overrides of ts / groups / kv_lens."""
  shape = dict(QUICK if quick else FULL, **(grid or {}))
  deadline = time.monotonic() + budget_s
  b, kvh, dh, dtype = shape["batch"], shape["kv_heads"], shape["head_dim"], shape["dtype"]
  backend = jax.default_backend()
  interpret = backend not in ("gpu", "tpu")   # "pallas": the backend's kernel (TPU: Mosaic)
  rows = []
  kv = {}
  for kv_len in shape["kv_lens"]:
    kk, kv_ = jax.random.split(jax.random.PRNGKey(kv_len))
    kv[kv_len] = tuple(jax.random.normal(key, (b, kv_len, kvh, dh), jnp.float32).astype(dtype)
                       for key in (kk, kv_))                          # k, v [B, S, KVH, Dh]
  # Both KV lengths for each (G, T) before the next, so a spent budget cuts both alike.
  points = [(t, g, None) for g in shape["groups"] for t in shape["ts"]]
  points += [p for p in UNSPLIT if not quick]
  for (t, g, num_splits), kv_len in itertools.product(points, shape["kv_lens"]):
    if time.monotonic() > deadline:
      print(f"attention: budget of {budget_s} s spent, skipping kv_len={kv_len} T={t} G={g}",
            flush=True)
      continue
    k, v = kv[kv_len]
    q = jax.random.normal(jax.random.PRNGKey(t * 100 + g), (b, t, g * kvh, dh),
                          jnp.float32).astype(dtype)                    # [B, T, Hq, Dh]
    lengths = jnp.full((b,), kv_len - t, jnp.int32)
    kv_bytes = 2 * b * kv_len * kvh * dh * jnp.dtype(dtype).itemsize
    want = None
    impls = ("reference", "pallas") if num_splits is None else ("pallas",)
    for impl in impls:
      if impl == "reference":
        options = {}
      elif backend == "tpu":
        options = dict(num_splits=num_splits or 1, interpret=False)
      else:
        options = api.kernel_options(q, kvh, kv_len, None, None, num_splits, 2, interpret)
      fn = jax.jit(functools.partial(api.verify_attention, impl=impl, **options))
      out = fn(q, k, v, lengths).astype(jnp.float32)
      if want is None:
        want = out if impl == "reference" else api.verify_attention(
            q, k, v, lengths, impl="reference").astype(jnp.float32)
      med, best = median_ms(fn, q, k, v, lengths, repeats=shape["repeats"])
      rows.append(dict(
          impl=impl, t=t, group=g, kv_len=kv_len, batch=b, kv_heads=kvh, head_dim=dh,
          dtype=jnp.dtype(dtype).name, median_ms=med, min_ms=best,
          hbm_gb_per_s=kv_bytes / (med * 1e-3) / 1e9,
          max_abs_err=float(jnp.abs(out - want).max()),
          **{key: options[key] for key in ("block_q", "block_k", "num_splits", "interpret")
             if key in options}))
      if device:
        def fresh(i, q=q, k=k, v=v, lengths=lengths):   # copies: every call reads cold K/V
          return q, k + 0 * i, v + 0 * i, lengths
        stats = device_time(fn, rotation(fresh, kv_bytes), match="verify_attention"
                            if impl == "pallas" else None)
        rows[-1]["device"] = stats
        if stats is not None:
          us = stats.get("kernel_us") or stats["device_us"]
          rows[-1]["device_hbm_gb_per_s"] = kv_bytes / (us * 1e-6) / 1e9
      print(json.dumps(rows[-1]), flush=True)
  return rows


def run_gmm(quick: bool) -> list[dict]:
  """The MoE grouped-GEMM benchmark rows, if that op ships one."""
  try:
    from pallas_kernels.moe_gemm import bench as gmm_bench
  except ImportError:
    return []
  if "quick" in inspect.signature(gmm_bench.run).parameters:
    return gmm_bench.run(quick=quick)
  return gmm_bench.run()


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(
      description="python -m pallas_kernels.bench --json OUT.json [--quick]: medians after warm-up "
                  "of calls synchronised with jax.block_until_ready; --quick runs tiny shapes "
                  "(interpret mode off the GPU) as a smoke test.")
  parser.add_argument("--json", required=True, help="output path")
  parser.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test")
  parser.add_argument("--attention-budget-s", type=float, default=150.0,
                      help="start no attention point after this many seconds")
  parser.add_argument("--device-time", action="store_true",
                      help="also the device's own time per call, from a profiler trace")
  parser.add_argument("--ts", default=None, help="comma-separated T values (default: the grid's)")
  parser.add_argument("--groups", default=None, help="comma-separated G values")
  parser.add_argument("--kv-lens", default=None, help="comma-separated KV lengths")
  parser.add_argument("--no-gmm", action="store_true", help="skip the grouped-GEMM benchmark")
  args = parser.parse_args(argv)
  grid = {}
  for key, text in (("ts", args.ts), ("groups", args.groups), ("kv_lens", args.kv_lens)):
    if text:
      try:
        grid[key] = tuple(int(x) for x in text.split(","))
      except ValueError:
        parser.error(f"--{key.replace('_', '-')} takes comma-separated integers, got {text!r}")
  with warnings.catch_warnings():
    # jax >= 0.11 deprecates Pallas' Triton backend; the kernel still uses it on purpose.
    warnings.simplefilter("ignore", DeprecationWarning)
    report = dict(device=jax.devices()[0].device_kind, backend=jax.default_backend(),
                  jax_version=jax.__version__, quick=args.quick,
                  attention=run_attention(args.quick, args.attention_budget_s,
                                          args.device_time, grid),
                  gmm=[] if args.no_gmm else run_gmm(args.quick))
  with open(args.json, "w") as f:
    json.dump(report, f, indent=1)


if __name__ == "__main__":
  main()
