#!/usr/bin/env bash
# Model-free drafters (issue 15) beside n-gram on the CPU: the commands behind the REPORT rows.
# Greedy, SmolLM2-135M-Instruct fp32, interleaved spec/plain runs of the same batches (as jspec bench).
#
#   benchmarks/scripts/model_free_bench.sh            the real run, quiet machine; writes
#       benchmarks/results/{model_free,suffix_repeat,prediction}/cpu.json
#   SMOKE=1 benchmarks/scripts/model_free_bench.sh    1 prompt per category, 8 new tokens, output in a temp dir
#
# 1. per category, B in {1, 4}: suffix and lookahead beside n-gram, D = 3 (every category but
#    long_input, as the earlier reports).
# 2. repeated requests: per category the same prompts run twice through one decoder (suffix
#    decoding's global cache); goal at B = 1: suffix / n-gram speedup >= 1.3 in pass 2.
# 3. predicted outputs on code_editing: the prompt's original code (its fenced block) is the
#    prediction; goal at B = 1: speedup >= 2.5 (report AL too).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
SUITE=benchmarks/prompts/suite.jsonl
CATS=coding,code_editing,summarization,rag_qa,math,writing,multi_turn
if [[ "${SMOKE:-0}" == 1 ]]; then
  OUT=$(mktemp -d)
  CAT_SIZE=(--per-category 1 --max-new-tokens 8)
  EDIT_SIZE=(--per-category 1 --max-new-tokens 8)
else
  OUT=benchmarks/results
  CAT_SIZE=(--per-category 2 --max-new-tokens 64)
  EDIT_SIZE=(--per-category 6 --max-new-tokens 128)
fi
echo "writing into $OUT" >&2
mkdir -p $OUT/model_free $OUT/suffix_repeat $OUT/prediction

# 1. per category
$PY -m jspec.cli bench --prompts $SUITE --categories $CATS "${CAT_SIZE[@]}" \
  --drafters ngram,suffix,lookahead --num-draft 3 --batch-size 1,4 --temperature 0 \
  --json $OUT/model_free/cpu.json

# 2. repeated requests (pass 1, then the same prompts again: pass 2)
$PY -m jspec.bench.model_free repeat --prompts $SUITE --categories $CATS "${CAT_SIZE[@]}" \
  --drafters ngram,suffix --num-draft 3 --batch-size 1,4 --temperature 0 \
  --json $OUT/suffix_repeat/cpu.json

# 3. predicted outputs on code_editing (n-gram runs the same prompts without the prediction)
$PY -m jspec.bench.model_free prediction --prompts $SUITE --categories code_editing \
  "${EDIT_SIZE[@]}" --drafters ngram,prediction --num-draft 3,7,15 --batch-size 1,4 \
  --temperature 0 --json $OUT/prediction/cpu.json
