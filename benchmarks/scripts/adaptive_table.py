"""The REPORT's "auto vs the best fixed D vs plain" tables from `jspec bench` JSON (adaptive_bench.sh),
where the records have their per-run speedups the issue's two goals judged with 90% intervals (the
best fixed D picked without the run it is compared on), and per batch size > 1 how many of the
batch's row-rounds were live (the straggler table):
.venv/bin/python benchmarks/scripts/adaptive_table.py benchmarks/results/adaptive_ngram/cpu.json [more.json ...]"""
import json
import sys

import numpy as np

from jspec.bench import stats
from jspec.plan.validate import batch_acceptance

LENGTHS = (0, 1, 2, 3, 5, 7)


def _by_row(results):
  by = {}
  for r in results:
    by.setdefault((r["drafter"], r["batch_size"], r["category"]), {})[str(r["num_draft"])] = r
  return sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] == "all", kv[0][2]))


def rows(results):
  print("| drafter | B | category | auto | best fixed | auto vs best | auto vs plain | fixed D "
        "| auto rounds at D (0/1/2/3/5/7) |")
  print("|---|---|---|---|---|---|---|---|---|")
  for (drafter, b, cat), runs in _by_row(results):
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


def _cell(xs, threshold):
  if len(xs) < 3:
    return f"{100 * (stats.quantile(xs, 0.5) - 1):+.0f}% | n/a"
  iv = stats.median_interval(xs)
  return (f"{100 * (stats.quantile(xs, 0.5) - 1):+.0f}% [{100 * (iv[0] - 1):+.0f}, "
          f"{100 * (iv[1] - 1):+.0f}] | {stats.verdict(iv, threshold)}")


def repeat_noise(runs, repeats):
  """The timing noise of one run: the standard deviation of log(speedup) between repeats of the same
  batch (runs are ordered batch by batch, `repeats` each), pooled over the batches."""
  x = np.log(np.asarray(runs, np.float64)).reshape(-1, repeats)
  return float(np.sqrt(np.sum((x - x.mean(axis=1, keepdims=True)) ** 2) / (x.size - len(x))))


def goals(results, repeats):
  """Goal 1: auto at most 3% slower than plain; goal 2: within 5% of the best fixed D. Medians of
  the paired per-run ratios with 90% bootstrap intervals; a goal 'holds' when the whole interval
  clears it, 'fails' when none of it does, else the runs cannot tell ('open'); no verdict on fewer
  than 3 runs. The noise per run is `repeat_noise` of auto's speedups."""
  print("| drafter | B | category | runs | auto vs plain [90%] | >= -3% | auto vs best fixed, "
        "held out [90%] | within 5% | noise per run |")
  print("|---|---|---|---|---|---|---|---|---|")
  for (drafter, b, cat), runs in _by_row(results):
    auto = runs.get("auto")
    fixed = {d: r["speedup_runs"] for d, r in runs.items() if d != "auto"}
    if auto is None or not fixed or "speedup_runs" not in auto:
      continue
    a = auto["speedup_runs"]
    name = f"**{cat}**" if cat == "all" else cat
    vs_best = _cell(stats.held_out_ratios(a, fixed), 0.95) if len(a) >= 2 else "n/a | n/a"
    noise = f"{100 * repeat_noise(a, repeats):.0f}%" if repeats > 1 else "n/a"
    print(f"| {drafter} | {b} | {name} | {len(a)} | {_cell(a, 0.97)} | {vs_best} | {noise} |")


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
  report = json.load(open(path))
  results = report["results"]
  rows(results)
  print()
  if any("speedup_runs" in r for r in results):
    goals(results, report["settings"]["repeats"])
    print()
  stragglers(results)
  print()
