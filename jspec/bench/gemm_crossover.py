"""Where the CPU small-M kernel (`models.cpu_gemm`, impl "ffi") stops beating XLA's dot: the
default model's weight products of one forward (every layer's projections and the tied LM head)
at M rows, both impls, interleaved; JSON out. `models.cpu_gemm.MAX_ROWS` is set from it.

  python -m jspec.bench.gemm_crossover --json benchmarks/results/gemm_crossover/cpu.json
      [--rows 1,4,8,16,24,32,48,64,128] [--calls 10]
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys

import jax
import jax.numpy as jnp

from jspec.bench.step_latency import wall_us
from jspec.io import atomic_write_text, check_writable
from models import cpu_gemm
from models.config import LlamaConfig


def forward_products(cfg: LlamaConfig) -> list[tuple[int, int, bool, int]]:
  """(K, N, transposed weight, count per forward) of a dense Llama forward's weight products."""
  h, q, kv, f = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, \
      cfg.intermediate_size
  per_layer = [(h, q, False, 1), (h, kv, False, 2), (q, h, False, 1), (h, f, False, 2),
               (f, h, False, 1)]
  out = [(k, n, t, c * cfg.num_layers) for k, n, t, c in per_layer]
  return out + [(h, cfg.vocab_size, True, 1)]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m jspec.bench.gemm_crossover",
                               description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", required=True)
  ap.add_argument("--rows", default="1,4,8,16,24,32,48,64,128")
  ap.add_argument("--calls", type=int, default=10)
  args = ap.parse_args(argv)
  try:
    check_writable(args.json)
    rows = [int(x) for x in args.rows.split(",") if x]
    if not rows or min(rows) < 1 or args.calls < 1:
      raise ValueError("--rows values and --calls must be >= 1")
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if not cpu_gemm.available():
    print("error: the CPU kernel is unavailable here (no compiler, JSPEC_CPU_GEMM=0 or not a "
          "CPU backend)", file=sys.stderr)
    return 2
  import models
  cfg = models.load(models.DEFAULT_MODEL, quiet=True).model.config
  products = forward_products(cfg)
  ms = {}
  for m in rows:
    total = {"ffi": 0.0, "xla": 0.0}
    for k, n, t, count in products:
      x = jnp.ones((m, k), jnp.float32)
      w = jnp.ones((n, k) if t else (k, n), jnp.float32)
      for impl in total:       # interleaved per product
        f = jax.jit(functools.partial(cpu_gemm.matmul, transpose_w=t, impl=impl))
        total[impl] += wall_us(lambda: f(x, w), args.calls) * count / 1e3
    ms[m] = {impl: round(v, 2) for impl, v in total.items()}
    print(f"M={m}: ffi {ms[m]['ffi']:.1f} ms, xla {ms[m]['xla']:.1f} ms", file=sys.stderr)
  faster = [m for m in rows if ms[m]["ffi"] <= ms[m]["xla"]]
  result = dict(command="python -m jspec.bench.gemm_crossover " + " ".join(argv or sys.argv[1:]),
                machine=platform.processor() or platform.machine(),
                what="ms of one forward's weight products at M rows (fp32), median of calls",
                ms_per_forward=ms, ffi_faster_at=faster, max_rows_in_use=cpu_gemm.MAX_ROWS)
  atomic_write_text(args.json, json.dumps(result, indent=1) + "\n")
  print(json.dumps(result, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
