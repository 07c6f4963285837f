"""The REPORT's "auto vs the best fixed D vs plain" tables from `jspec bench` JSON (adaptive_bench.sh),
and per batch size > 1 how many of the batch's row-rounds were live (the straggler table):
.venv/bin/python benchmarks/adaptive_table.py benchmarks/adaptive_bench_cpu.json [more.json ...]"""
import json
import sys

from jspec.plan.validate import batch_acceptance

LENGTHS = (0, 1, 2, 3, 5, 7)


def rows(results):
  by = {}
  for r in results:
    by.setdefault((r["drafter"], r["batch_size"], r["category"]), {})[str(r["num_draft"])] = r
  print("| drafter | B | category | auto | best fixed | auto vs best | auto vs plain | fixed D "
        "| auto rounds at D (0/1/2/3/5/7) |")
  print("|---|---|---|---|---|---|---|---|---|")
  for (drafter, b, cat), runs in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                     kv[0][2] == "all", kv[0][2])):
    auto = runs.get("auto")
    fixed = {int(d): r["speedup"] for d, r in runs.items() if d != "auto"}
    if auto is None or not fixed:
      continue
    best = max(fixed, key=fixed.get)
    vl = auto.get("verified_lengths") or {}
    counts = "/".join(str(vl.get(str(d), vl.get(d, 0))) for d in LENGTHS)
    name = f"**{cat}**" if cat == "all" else cat
    a = auto["speedup"]
    print(f"| {drafter} | {b} | {name} | {a:.2f} | {fixed[best]:.2f} (D={best}) | "
          f"{100 * (a / fixed[best] - 1):+.0f}% | {100 * (a - 1):+.0f}% | "
          f"{', '.join(f'{fixed[d]:.2f}' for d in sorted(fixed))} | {counts} |")


def stragglers(results):
  """A batch runs until its last row is done: at B > 1 its own AL (tokens per row per batch round
  over plain decoding's per step, `jspec.plan.validate.batch_acceptance`) is below the rows' mean."""
  print("| drafter | D | B | AL (rows' mean) | batch AL | batch / rows |")
  print("|---|---|---|---|---|---|")
  for r in results:
    if r["batch_size"] == 1 or r["category"] != "all" or r["num_draft"] == "auto":
      continue      # (auto: a plain round counts its steps as row-rounds, one batch round)
    al, batch = r["acceptance_length"], batch_acceptance(r)
    print(f"| {r['drafter']} | {r['num_draft']} | {r['batch_size']} | {al:.2f} | {batch:.2f} | "
          f"{batch / al:.2f} |")


for path in sys.argv[1:]:
  results = json.load(open(path))["results"]
  rows(results)
  print()
  stragglers(results)
  print()
