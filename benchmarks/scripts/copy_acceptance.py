"""How far n-gram prompt lookup's draft runs along the target's own replies, by the length of the
suffix n-gram that matched: the measurement behind the hybrid drafter's `prompt_lookup_min`
(docs/drafters.md). Reads the token shards of a `jspec train data` folder (reply positions are its
loss mask) and applies the n-gram drafter's rule at every reply position: the longest suffix
n-gram (max_n down to 1) that occurred earlier, its earliest occurrence, the up-to-D tokens after
it; a draft token counts while it equals the reply's next token.

.venv/bin/python benchmarks/scripts/copy_acceptance.py /root/jspec-data/snap-11 --shards 10 \
  --num-draft 3 --json benchmarks/results/copy_acceptance/cpu.json
"""
import argparse
import glob
import json
import os
import sys

import numpy as np


def drafts(tokens, max_n: int, d: int):
  """For every position p >= 1 of `tokens`: (longest matched n or 0, the draft after tokens[:p]),
  by the n-gram drafter's rule, in one pass with the earliest start of every n-gram."""
  first = [dict() for _ in range(max_n + 1)]
  out = []
  for p in range(1, len(tokens)):
    for n in range(1, max_n + 1):        # n-grams ending before p - 1, i.e. strictly before
      s = p - 1 - n                      # the suffix tokens[p - n:p] itself
      if s >= 0:
        first[n].setdefault(tuple(tokens[s:s + n]), s)
    best = (0, [])
    for n in range(1, max_n + 1):
      if p >= n + 1:
        s = first[n].get(tuple(tokens[p - n:p]))
        if s is not None:
          start = s + n
          best = (n, list(tokens[start:min(start + d, p)]))
    out.append(best)
  return out


def measure(shards, max_n: int, d: int) -> dict:
  counts = np.zeros((max_n + 1, 3), np.int64)     # per n: positions, first accepted, accepted
  for path in shards:
    z = np.load(path)
    toks, off, mask = z["tokens"], z["offsets"], z["loss_mask"]
    for c in range(len(off) - 1):
      t = toks[off[c]:off[c + 1]].tolist()
      m = mask[off[c]:off[c + 1]]
      for p, (n, draft) in enumerate(drafts(t, max_n, d), start=1):
        if not m[p]:
          continue
        acc = 0
        for i, x in enumerate(draft):
          if p + i < len(t) and m[p + i] and t[p + i] == x:
            acc += 1
          else:
            break
        counts[n] += (1, acc > 0, acc)
  total = int(counts[:, 0].sum())
  rows = {str(n): dict(positions=int(counts[n, 0]), share=float(counts[n, 0] / max(total, 1)),
                       first_accepted=float(counts[n, 1] / max(counts[n, 0], 1)),
                       mean_accepted=float(counts[n, 2] / max(counts[n, 0], 1)))
          for n in range(max_n + 1)}
  return dict(reply_positions=total, num_draft=d, by_matched_n=rows)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("data", help="a `jspec train data` (or snapshot) folder")
  ap.add_argument("--shards", default="10", help="comma-separated shard indices (default 10)")
  ap.add_argument("--num-draft", type=int, default=3)
  ap.add_argument("--max-n", type=int, default=4)
  ap.add_argument("--json", default=None)
  args = ap.parse_args(argv)
  paths = []
  for i in args.shards.split(","):
    found = glob.glob(os.path.join(args.data, f"shard_{int(i):05d}.npz"))
    if not found:
      sys.exit(f"no shard {i} in {args.data} (shard_{int(i):05d}.npz)")
    paths += found
  out = dict(data=os.path.abspath(args.data), shards=args.shards,
             **measure(paths, args.max_n, args.num_draft))
  print(f"{out['reply_positions']} reply positions, D = {args.num_draft}")
  print("| longest matched n-gram | share of positions | first draft accepted | tokens accepted |")
  print("|---|---|---|---|")
  for n, r in out["by_matched_n"].items():
    label = "none" if n == "0" else n
    print(f"| {label} | {r['share']:.3f} | {r['first_accepted']:.3f} | {r['mean_accepted']:.2f} |")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
