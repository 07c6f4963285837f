"""The REPORT's "auto vs the best fixed D vs plain" tables from `jspec bench` JSON (adaptive_bench.sh):
python benchmarks/adaptive_table.py benchmarks/adaptive_bench_cpu.json [more.json ...]"""
import json
import sys

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


for path in sys.argv[1:]:
  rows(json.load(open(path))["results"])
  print()
