"""Grouped GEMM timing, Pallas kernel vs lax.ragged_dot, on GPU in bf16 (quick=True: tiny shapes,
interpret mode off-GPU). `run` returns records that pallas_kernels/bench.py files under "gmm".
"""

from __future__ import annotations

import dataclasses
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.moe_gemm import kernel_gpu as kernel
from pallas_kernels.moe_gemm.reference import gmm_reference
from pallas_kernels.timing import call_ms

SIZES = [(8, 4096, 2048, 2048), (8, 16384, 2048, 2048), (64, 16384, 2048, 2048)]   # (E, M, K, N)
TILINGS = [kernel.Tiling(128, 128, 64, num_warps=4, num_stages=3),
           kernel.Tiling(128, 256, 64, num_warps=8, num_stages=3)]
QUICK_SIZES = [(4, 48, 32, 32)]
QUICK_TILINGS = [kernel.Tiling(16, 16, 16, num_warps=4, num_stages=1)]


def _median_ms(fn, args, repeats: int) -> tuple[float, float, float]:
  """(median, min, max) wall ms of fn(*args) after two warm-up calls."""
  times = call_ms(fn, *args, repeats=repeats)
  return statistics.median(times), min(times), max(times)


def _problem(e: int, m: int, k: int, n: int, dtype, seed: int = 0):
  """Random lhs [M, K], rhs [E, K, N] and multinomial group sizes summing to M (some may be 0)."""
  rng = np.random.default_rng(seed)
  sizes = rng.multinomial(m, rng.dirichlet(np.full(e, 2.0)))
  lhs = jnp.asarray(rng.standard_normal((m, k), np.float32), dtype)
  rhs = jnp.asarray(rng.standard_normal((e, k, n), np.float32) / np.sqrt(k), dtype)
  return lhs, rhs, jnp.asarray(sizes, jnp.int32)


def _rel_err(a, b) -> float:
  """max |a - b| / max |b|, worst over the leaves of two matching pytrees."""
  def one(x, y):
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    return float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30))
  return max(jax.tree.leaves(jax.tree.map(one, a, b)))


def _record(base: dict, kind: str, tiling, run_kernel, run_ref, args, flops: float,
            repeats: int) -> dict:
  rec = dict(base, kind=kind, tiling=dataclasses.asdict(tiling))
  try:
    rec["max_rel_err"] = _rel_err(run_kernel(*args), run_ref(*args))
    k_ms, k_lo, k_hi = _median_ms(run_kernel, args, repeats)
    r_ms, r_lo, r_hi = _median_ms(run_ref, args, repeats)
  except Exception as err:   # one failing config (e.g. a lowering error) must not lose the others
    rec["error"] = f"{type(err).__name__}: {err}"[:2000]
    return rec
  rec.update(kernel_ms=k_ms, kernel_ms_range=[k_lo, k_hi], ragged_dot_ms=r_ms,
             ragged_dot_ms_range=[r_lo, r_hi], kernel_tflops=flops / k_ms / 1e9,
             ragged_dot_tflops=flops / r_ms / 1e9, speedup_vs_ragged_dot=r_ms / k_ms)
  return rec


def run(quick: bool = False) -> list[dict]:
  """Times each (size, tiling) forward and, for the first size, forward+backward; see module doc."""
  on_gpu = jax.default_backend() == "gpu"
  interpret = not on_gpu
  dtype = jnp.bfloat16 if on_gpu else jnp.float32   # bf16 matmuls are slow on XLA:CPU
  sizes, tilings = (QUICK_SIZES, QUICK_TILINGS) if quick else (SIZES, TILINGS)
  repeats = 3 if quick or not on_gpu else 20
  records = []
  for i, (e, m, k, n) in enumerate(sizes):
    lhs, rhs, group_sizes = _problem(e, m, k, n, dtype)
    base = dict(E=e, M=m, K=k, N=n, dtype=jnp.dtype(dtype).name, backend=jax.default_backend(),
                device=jax.devices()[0].device_kind, interpret=interpret,
                jax_version=jax.__version__)
    flops = 2.0 * m * k * n
    ref_fwd = jax.jit(gmm_reference)
    for tiling in tilings:
      fwd = jax.jit(lambda a, b, g, t=tiling: kernel.gmm(a, b, g, tiling=t, interpret=interpret))
      records.append(_record(base, "fwd", tiling, fwd, ref_fwd, (lhs, rhs, group_sizes), flops,
                             repeats))
    if i == 0:
      cot = jnp.asarray(np.random.default_rng(1).standard_normal((m, n), np.float32), dtype)

      def fwd_bwd(matmul):
        loss = lambda a, b, g: jnp.vdot(matmul(a, b, g).astype(jnp.float32),
                                        cot.astype(jnp.float32))
        return jax.jit(jax.grad(loss, argnums=(0, 1)))
      kernel_grad = fwd_bwd(lambda a, b, g: kernel.gmm(a, b, g, tiling=tilings[0],
                                                       interpret=interpret))
      records.append(_record(base, "fwd_bwd", tilings[0], kernel_grad, fwd_bwd(gmm_reference),
                             (lhs, rhs, group_sizes), 3 * flops, repeats))
  return records


if __name__ == "__main__":
  import json
  import sys
  print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
