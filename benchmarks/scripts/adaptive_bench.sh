#!/usr/bin/env bash
# The co-design planner and the adaptive draft length (issue 11) on the CPU: the commands behind the
# REPORT rows. Greedy, SmolLM2-135M-Instruct fp32, quiet machine (nothing else running).
#
# 1. the plan: verify / draft costs on this machine, calibration acceptance (held-out Magpie prompts)
# 2. per category of the suite, B in {1, 4}: fixed D in {1, 3, 5} vs "auto" (with the plan's cost
#    table) vs plain, n-gram and EAGLE-3 (the fixed-D rows are also the planner's validation points)
# 3. the adversarial set: random tokens, replies that never repeat
# 4. (STEPS=repeats3) the table of 2 with 3 runs of every batch, medians, one file per drafter, and
#    the plan's validation against it
# STEPS picks which run (default: plan,suite,adversarial); SKIP_PLAN=1 drops the plan. The REPORT's
# current results: STEPS=adversarial,repeats3 ADV_REPEATS=3 (every record with its per-run speedups
# for the goals' intervals). Results go to benchmarks/results/<topic>/cpu.json (a rerun replaces
# them; earlier runs are in git history).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
CATS=coding,code_editing,summarization,rag_qa,math,writing,multi_turn
STEPS=${STEPS:-plan,suite,adversarial}
RES=benchmarks/results
PLAN=$RES/plan/cpu.json
ADV=$RES/adaptive_adversarial/cpu.json
VAL=bench_out/plan_validation_cpu.md   # its tables go into REPORT.md
[[ "${SKIP_PLAN:-0}" == 1 ]] && STEPS=${STEPS//plan/}
step() { [[ ",$STEPS," == *",$1,"* ]]; }

if step plan; then
  mkdir -p $RES/plan
  $PY -m jspec.cli plan --drafters ngram,eagle3 --batch-sizes 1,4 --num-draft 1,2,3,5,7 \
    --calibration benchmarks/prompts/calibration.jsonl --calibration-prompts 16 --max-new-tokens 64 \
    --context 128,512 --json $PLAN --plot benchmarks/plots/plan_pareto_cpu.png
fi

if step suite; then
  mkdir -p $RES/adaptive_suite bench_out
  $PY -m jspec.cli bench --prompts benchmarks/prompts/suite.jsonl --categories $CATS \
    --per-category 2 --max-new-tokens 64 --drafters ngram,eagle3 --num-draft 1,3,5,auto \
    --batch-size 1,4 --temperature 0 --plan $PLAN \
    --json $RES/adaptive_suite/cpu.json --no-progress
  $PY -m jspec.plan.validate --plan $PLAN --bench $RES/adaptive_suite/cpu.json > $VAL
fi

if step adversarial; then
  mkdir -p $RES/adaptive_adversarial
  $PY -m jspec.cli bench --prompts benchmarks/prompts/adversarial.jsonl --max-new-tokens 64 \
    --drafters ngram --num-draft 1,3,auto --batch-size 1,4 --repeats ${ADV_REPEATS:-1} \
    --temperature 0 --plan $PLAN --json $ADV --no-progress
fi

if step repeats3; then
  mkdir -p $RES/adaptive_ngram $RES/adaptive_eagle3 bench_out
  $PY -m jspec.cli bench --prompts benchmarks/prompts/suite.jsonl --categories $CATS \
    --per-category 2 --max-new-tokens 64 --drafters ngram --num-draft 1,3,5,auto \
    --batch-size 1,4 --repeats 3 --temperature 0 --plan $PLAN \
    --json $RES/adaptive_ngram/cpu.json --no-progress
  $PY -m jspec.cli bench --prompts benchmarks/prompts/suite.jsonl --categories $CATS \
    --per-category 2 --max-new-tokens 64 --drafters eagle3 --num-draft 1,3,auto \
    --batch-size 1,4 --repeats 3 --temperature 0 --plan $PLAN \
    --json $RES/adaptive_eagle3/cpu.json --no-progress
  for d in ngram eagle3; do
    $PY -m jspec.plan.validate --plan $PLAN --bench $RES/adaptive_${d}/cpu.json
    echo
  done > $VAL
fi
