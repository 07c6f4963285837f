#!/usr/bin/env bash
# Every GPU check and benchmark of jspec in one call, within 8 minutes on one H200, JSON out:
#   OUT=/path/to/folder benchmarks/scripts/run_all.sh      (default OUT: bench_out/gpu, git-ignored)
# Each step runs under its own time limit; OUT/steps.jsonl records each step's exit status and
# seconds, OUT/<step>.log its output. Random weights of the default model's shapes throughout (the
# 98 MB GGUF does not travel to a lent device); acceptance comes from the CPU runs, through the
# cost model (benchmarks/REPORT.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench_out/gpu}
mkdir -p "$OUT"
: > "$OUT/steps.jsonl"

step() {   # step NAME SECONDS COMMAND...
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  echo "== $name (limit ${limit}s)"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - start))}" >> "$OUT/steps.jsonl"
  tail -n 3 "$OUT/$name.log"
}

python -c "import jax; print(jax.__version__, jax.devices())" | tee "$OUT/device.txt"
# 1. the kernels compiled for real (interpret mode only for the TPU kernels), regression tests too
step kernel_tests 100 python -m pytest -q -x -p no:cacheprovider \
  tests/pallas_kernels/test_verify_attention.py tests/pallas_kernels/test_moe_gemm.py
# 2. verification attention: wall and device time per call (profiler, rotated K/V, 3 runs)
step kernels 130 python -m pallas_kernels.bench --json "$OUT/kernels.json" --device-time \
  --ts 1,4,16 --groups 1,8 --kv-lens 4096,32768 --no-gmm --attention-budget-s 90
# 3. per-step latency and launches: XLA's default command buffers, none, and control flow too
step step_latency 60 python -m jspec.bench.step_latency --json "$OUT/step_latency.json" --calls 20
step step_latency_nocmdbuf 60 env XLA_FLAGS="--xla_gpu_enable_command_buffer=" \
  python -m jspec.bench.step_latency --json "$OUT/step_latency_nocmdbuf.json" --calls 20
step step_latency_graphs 60 env \
  XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,WHILE,CONDITIONAL" \
  python -m jspec.bench.step_latency --json "$OUT/step_latency_graphs.json" --calls 20
# 4. the target's verify cost T(1+D)/T(1) (cost model input) and an MoE layer's (guideline 1)
step verify_cost 50 python -m jspec.bench.verify_cost --json "$OUT/verify_cost.json" \
  --batch-sizes 1,16 --tokens 1,2,4,8,16 --impls reference,pallas --repeats 5
step moe_verify 40 python -m jspec.bench.moe_verify --json "$OUT/moe_verify.json" --repeats 5
cat "$OUT/steps.jsonl"
