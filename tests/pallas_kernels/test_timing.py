"""The device-time measurement (profiler events -> per-call device µs and launches), the rotation of
inputs past the L2, and the GPU scripts on this CPU where their code paths allow: the benchmarks'
smoke runs (device time None without a device stream) and the shell script's syntax."""

from __future__ import annotations

import json
import os
import subprocess

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels import timing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_summarize_counts_stream_kernels_once_per_call():
  events = [("/device:GPU:0", "Stream #14(Compute)", "verify_attention_bq16", 30.0),
            ("/device:GPU:0", "Stream #14(Compute)", "fusion_3", 5.0),
            ("/device:GPU:0", "Stream #14(Compute)", "verify_attention_bq16", 34.0),
            ("/device:GPU:0", "Stream #14(Compute)", "fusion_3", 7.0),
            ("/device:GPU:0", "XLA Ops", "verify_attention_bq16", 30.0),      # derived: not again
            ("/device:GPU:0", "XLA Modules", "jit_fn", 80.0)]
  out = timing.summarize(events, calls=2, match="verify_attention")
  assert out == dict(device_us=38.0, kernels=2.0, kernel_us=32.0)
  assert timing.summarize(events[4:], calls=2) is None                     # no stream: None


def test_rotation_exceeds_twice_the_l2():
  sets = timing.rotation(lambda i: (i,), bytes_per_set=50 * 2**20)
  assert len(sets) == 3 and sets[2] == (2,)          # 150 MiB >= 2 x 60 MiB
  assert len(timing.rotation(lambda i: (i,), bytes_per_set=10**12)) == 1


def test_device_time_off_a_gpu_is_none_and_reads_a_real_trace(tmp_path):
  fn = jax.jit(lambda x: jnp.sin(x) @ x)
  assert timing.device_time(fn, [(jnp.ones((64, 64)),)], calls=3, runs=1) is None
  with jax.profiler.trace(str(tmp_path)):
    jax.block_until_ready(fn(jnp.ones((64, 64))))
  assert timing.device_events(str(tmp_path)) == []   # the CPU trace has host planes only


def test_kernel_bench_with_device_time_runs(tmp_path):
  from pallas_kernels import bench
  path = tmp_path / "k.json"
  bench.main(["--json", str(path), "--quick", "--device-time", "--no-gmm", "--ts", "2"])
  rows = json.loads(path.read_text())["attention"]
  assert {r["t"] for r in rows} == {2} and all(r["device"] is None for r in rows)


def test_step_latency_smoke(tmp_path):
  from jspec.bench import step_latency
  path = tmp_path / "s.json"
  step_latency.main(["--json", str(path), "--tiny", "--draft", "1,3", "--calls", "3",
                     "--context", "32"])
  rows = json.loads(path.read_text())["results"]
  assert [(r["kind"], r["draft"]) for r in rows] == [("plain", 0), ("round", 1), ("round", 3)]
  assert all(r["wall_us"] > 0 for r in rows) and rows[1]["wall_vs_plain"] > 0


@pytest.mark.parametrize("script", ["benchmarks/scripts/run_all.sh"])
def test_gpu_script_parses(script):
  assert subprocess.run(["bash", "-n", os.path.join(ROOT, script)]).returncode == 0
