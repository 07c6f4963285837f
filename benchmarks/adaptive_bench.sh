#!/usr/bin/env bash
# The co-design planner and the adaptive draft length (issue 11) on the CPU: the commands behind the
# REPORT rows. Greedy, SmolLM2-135M-Instruct fp32, quiet machine (nothing else running).
#
# 1. the plan: verify / draft costs on this machine, calibration acceptance (held-out Magpie prompts)
# 2. per category of the suite, B in {1, 4}: fixed D in {1, 3, 5} vs "auto" (with the plan's cost
#    table) vs plain, n-gram and EAGLE-3 (the fixed-D rows are also the planner's validation points)
# 3. the adversarial set: random tokens, replies that never repeat
# 4. (STEPS=repeats3) the table of 2 with 3 runs of every batch, medians (seventh measurement), and
#    the plan's validation against it
# STEPS picks which run (default: plan,suite,adversarial); SKIP_PLAN=1 drops the plan. TAG names
# the files of 3 and 4 (default r3; the eighth measurement, auto choosing by rounds it timed
# itself: STEPS=adversarial,repeats3 TAG=timed; the tenth, every record with its per-run speedups
# for the goals' intervals: STEPS=adversarial,repeats3 TAG=final ADV_REPEATS=3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CATS=coding,code_editing,summarization,rag_qa,math,writing,multi_turn
STEPS=${STEPS:-plan,suite,adversarial}
TAG=${TAG:-r3}
ADV=benchmarks/adaptive_adversarial_cpu.json
[[ "$TAG" != r3 ]] && ADV=benchmarks/adaptive_adversarial_${TAG}_cpu.json
VAL=benchmarks/plan_validation_cpu.md
[[ "$TAG" != r3 ]] && VAL=benchmarks/plan_validation_${TAG}_cpu.md
[[ "${SKIP_PLAN:-0}" == 1 ]] && STEPS=${STEPS//plan/}
step() { [[ ",$STEPS," == *",$1,"* ]]; }

if step plan; then
  $PY -m jspec.cli plan --drafters ngram,eagle3 --batch-sizes 1,4 --num-draft 1,2,3,5,7 \
    --calibration benchmarks/prompts/calibration.jsonl --calibration-prompts 16 --max-new-tokens 64 \
    --context 128,512 --json benchmarks/plan_cpu.json --plot benchmarks/plots/plan_pareto_cpu.png
fi

if step suite; then
  $PY -m jspec.cli bench --prompts benchmarks/prompts/suite.jsonl --categories $CATS \
    --per-category 2 --max-new-tokens 64 --drafters ngram,eagle3 --num-draft 1,3,5,auto \
    --batch-size 1,4 --temperature 0 --plan benchmarks/plan_cpu.json \
    --json benchmarks/adaptive_bench_cpu.json --no-progress
  $PY -m jspec.plan.validate --plan benchmarks/plan_cpu.json --bench benchmarks/adaptive_bench_cpu.json \
    > benchmarks/plan_validation_cpu.md
fi

if step adversarial; then
  $PY -m jspec.cli bench --prompts benchmarks/prompts/adversarial.jsonl --max-new-tokens 64 \
    --drafters ngram --num-draft 1,3,auto --batch-size 1,4 --repeats ${ADV_REPEATS:-1} \
    --temperature 0 --plan benchmarks/plan_cpu.json --json $ADV --no-progress
fi

if step repeats3; then
  $PY -m jspec.cli bench --prompts benchmarks/prompts/suite.jsonl --categories $CATS \
    --per-category 2 --max-new-tokens 64 --drafters ngram --num-draft 1,3,5,auto \
    --batch-size 1,4 --repeats 3 --temperature 0 --plan benchmarks/plan_cpu.json \
    --json benchmarks/adaptive_bench_${TAG}_ngram_cpu.json --no-progress
  $PY -m jspec.cli bench --prompts benchmarks/prompts/suite.jsonl --categories $CATS \
    --per-category 2 --max-new-tokens 64 --drafters eagle3 --num-draft 1,3,auto \
    --batch-size 1,4 --repeats 3 --temperature 0 --plan benchmarks/plan_cpu.json \
    --json benchmarks/adaptive_bench_${TAG}_eagle3_cpu.json --no-progress
  for d in ngram eagle3; do
    $PY -m jspec.plan.validate --plan benchmarks/plan_cpu.json \
      --bench benchmarks/adaptive_bench_${TAG}_${d}_cpu.json
    echo
  done > $VAL
fi
