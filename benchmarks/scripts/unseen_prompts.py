"""Prompts of the training families that no head trained on: the first N per family of the prompt
corpus whose ids are absent from a `jspec train data` (or snapshot) folder, written as a prompt
suite (JSON Lines with categories) for `jspec train replay` / `jspec bench`. Replayed beside the
suite, they measure the distribution gap (issue 37: the suite's AL against the training
distribution's at equal settings).

.venv/bin/python benchmarks/scripts/unseen_prompts.py /root/jspec-data/snap-11 \
  --families coding,code_edit,summarization,rag_qa,math,writing --per-family 16 \
  --out benchmarks/prompts/unseen_families.jsonl
"""
import argparse
import glob
import gzip
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "benchmarks", "prompts", "corpus.jsonl.gz")


def used_ids(data: str) -> set[str]:
  shards = sorted(glob.glob(os.path.join(data, "shard_*.npz")))
  if not shards:
    sys.exit(f"{data} holds no shard_*.npz: pass a `jspec train data` or snapshot folder")
  return {str(i) for path in shards for i in np.load(path)["prompt_ids"].tolist()}


def unseen(corpus: str, used: set[str], families: list[str], per_family: int) -> list[dict]:
  """The first `per_family` prompts of each family (corpus order) whose id is not in `used`."""
  picked = {f: [] for f in families}
  with gzip.open(corpus, "rt") as f:
    for line in f:
      row = json.loads(line)
      fam = row.get("category")
      if fam in picked and len(picked[fam]) < per_family and row["id"] not in used:
        picked[fam].append(row)
  short = [f"{f} ({len(r)})" for f, r in picked.items() if len(r) < per_family]
  if short:
    sys.exit(f"too few unseen prompts in {corpus}: {', '.join(short)}")
  return [r for f in families for r in picked[f]]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("data", help="the training data folder (its prompt ids are excluded)")
  ap.add_argument("--corpus", default=CORPUS)
  ap.add_argument("--families", required=True, help="comma-separated corpus categories")
  ap.add_argument("--per-family", type=int, default=16)
  ap.add_argument("--out", required=True)
  args = ap.parse_args(argv)
  rows = unseen(args.corpus, used_ids(args.data), args.families.split(","), args.per_family)
  with open(args.out, "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  print(f"{len(rows)} prompts -> {args.out}")


if __name__ == "__main__":
  main()
