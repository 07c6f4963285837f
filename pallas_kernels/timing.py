"""Timing of jitted calls for the benchmarks.

`call_ms`: wall clock, each call to completion (jax.block_until_ready) after two warm-up calls; it
includes Python dispatch (≈ 50 µs per call on a GPU).
`device_time`: the time the device itself spends, read from a profiler trace
(`jax.profiler.trace` + `jax.profiler.ProfileData`): the kernels each call launches on the device's
streams, summed per call, with the inputs rotated over enough copies to exceed twice the L2 cache,
so no call finds its operands cached by the one before. Off a GPU the trace has no device streams
and the result is None.
"""

from __future__ import annotations

import glob
import math
import os
import statistics
import tempfile
import time
from typing import Callable, Iterable, Sequence

import jax

L2_BYTES = 60 * 2**20   # above the L2 of an H100 / H200 (50 MiB): rotate at least twice this


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


def rotation(make_args: Callable[[int], tuple], bytes_per_set: int,
             min_bytes: int = 2 * L2_BYTES) -> list[tuple]:
  """Enough argument sets (make_args(i) for i = 0, 1, ...) to hold at least min_bytes in all."""
  return [make_args(i) for i in range(max(1, math.ceil(min_bytes / max(bytes_per_set, 1))))]


def device_events(trace_dir: str) -> list[tuple[str, str, str, float]]:
  """(plane, line, event name, µs) for every event of the trace's device planes."""
  out = []
  for path in glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True):
    for plane in jax.profiler.ProfileData.from_file(path).planes:
      if not plane.name.startswith("/device:"):
        continue
      for line in plane.lines:
        for event in line.events:
          out.append((plane.name, line.name, event.name, event.duration_ns / 1e3))
  return out


def summarize(events: Iterable[tuple[str, str, str, float]], calls: int,
              match: str | None = None) -> dict | None:
  """Per call: device_us (every kernel on the device's streams), kernels (how many launched),
  and kernel_us (only the kernels whose name contains `match`). Stream lines are the kernels
  themselves ("Stream #N..."); the derived "XLA Ops" / "XLA Modules" lines would count them twice.
  None when there is no stream event (a CPU trace)."""
  kernels = [(name, us) for _, line, name, us in events if line.startswith("Stream")]
  if not kernels:
    return None
  out = dict(device_us=sum(us for _, us in kernels) / calls, kernels=len(kernels) / calls)
  if match is not None:
    out["kernel_us"] = sum(us for name, us in kernels if match in name) / calls
  return out


def device_time(fn: Callable, arg_sets: Sequence[tuple], *, calls: int = 20, runs: int = 3,
                match: str | None = None) -> dict | None:
  """fn over the rotated argument sets, `calls` calls per traced run, `runs` runs: the median over
  runs of each per-call figure of `summarize`, and its spread (min, max) across the runs."""
  for args in arg_sets[:2]:        # compile and warm up outside the trace
    jax.block_until_ready(fn(*args))
  per_run = []
  for _ in range(runs):
    with tempfile.TemporaryDirectory() as trace_dir:
      with jax.profiler.trace(trace_dir):
        for i in range(calls):
          jax.block_until_ready(fn(*arg_sets[i % len(arg_sets)]))
      stats = summarize(device_events(trace_dir), calls, match)
    if stats is None:
      return None
    per_run.append(stats)
  out = {}
  for key in per_run[0]:
    values = [r[key] for r in per_run]
    out[key] = statistics.median(values)
    out[f"{key}_spread"] = [min(values), max(values)]
  out.update(runs=runs, calls_per_run=calls, rotated_sets=len(arg_sets))
  return out
