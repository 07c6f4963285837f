"""Wall-clock timing of jitted calls for the kernel benchmarks: warm up twice, then time each call
to completion (jax.block_until_ready)."""

from __future__ import annotations

import time

import jax


def call_ms(fn, *args, repeats: int) -> list[float]:
  """Milliseconds of each of `repeats` calls fn(*args), after two warm-up calls."""
  for _ in range(2):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append((time.perf_counter() - start) * 1e3)
  return times
