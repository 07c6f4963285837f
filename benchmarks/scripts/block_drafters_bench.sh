#!/usr/bin/env bash
# DFlash and DSpark (issue 13) beside EAGLE-3 and n-gram on the CPU: the commands behind the REPORT
# rows. SmolLM2-135M-Instruct fp32, the shipped heads, interleaved spec/plain runs of the same
# batches (jspec bench), every category of the suite but long_input, 2 prompts each, 64 new tokens,
# equal draft length D = 7 (DFlash's trained block of 8).
#
#   benchmarks/scripts/block_drafters_bench.sh            the real run, quiet machine; writes
#       benchmarks/results/{block_drafters,block_drafters_t1}/cpu.json
#   SMOKE=1 benchmarks/scripts/block_drafters_bench.sh    1 prompt per category, 8 new tokens, temp dir
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
SUITE=benchmarks/prompts/suite.jsonl
CATS=coding,code_editing,summarization,rag_qa,math,writing,multi_turn
DRAFTERS="ngram,eagle3,dflash,dspark,dspark:confidence_schedule=true"
if [[ "${SMOKE:-0}" == 1 ]]; then
  OUT=$(mktemp -d)
  SIZE=(--per-category 1 --max-new-tokens 8)
else
  OUT=benchmarks/results
  SIZE=(--per-category 2 --max-new-tokens 64)
fi
echo "writing into $OUT" >&2
mkdir -p $OUT/block_drafters $OUT/block_drafters_t1

# 1. greedy, B in {1, 4}
$PY -m jspec.cli bench --prompts $SUITE --categories $CATS "${SIZE[@]}" --drafters "$DRAFTERS" \
  --num-draft 7 --batch-size 1,4 --temperature 0 --json $OUT/block_drafters/cpu.json
# 2. sampled, T = 1, B = 1 (DSpark samples its Markov chain with q recorded; DFlash drafts greedily)
$PY -m jspec.cli bench --prompts $SUITE --categories $CATS "${SIZE[@]}" --drafters "$DRAFTERS" \
  --num-draft 7 --batch-size 1 --temperature 1 --json $OUT/block_drafters_t1/cpu.json
