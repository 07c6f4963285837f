"""Predicted vs measured speedup: a `jspec plan` report against a `jspec bench` report.

For every fixed-D bench record of the pooled category ("all") whose drafter and B the plan covers:
  predicted (plan)      the plan's own prediction (calibration-prompt acceptance, plan's costs)
  predicted (bench AL)  the plan's forward costs (T_verif + T_draft) with the acceptance the bench
                        measured: isolates the cost model's error from the calibration acceptance's
  predicted (round)     the same with the plan's measured whole-round costs (the adaptive round
                        forced to D, which the adaptive choice uses)
  measured              the bench's median speedup
  python -m jspec.plan.validate --plan benchmarks/plan_cpu.json --bench benchmarks/X.json
"""

from __future__ import annotations

import argparse
import json

from jspec.adaptive import CostTable


def rows(plan: dict, bench: dict) -> list[dict]:
  out = []
  for r in bench["results"]:
    d, b = r["num_draft"], str(r["batch_size"])
    name = r["drafter"].replace("-", "_")
    if r["category"] != "all" or not isinstance(d, int) or b not in plan["ranking"]:
      continue
    planned = next((x for x in plan["ranking"][b] if x["drafter"] == name and
                    x["num_draft"] == d), None)
    if planned is None or name not in plan["cost_tables"]:
      continue
    table = CostTable.from_dict(plan["cost_tables"][name])
    cost = table.verify_cost(int(b), 1 + d) + table.draft_cost(int(b), d)
    rcost = table.round_costs(int(b), (d,), d)[0] if table.round else None
    out.append(dict(drafter=r["drafter"], num_draft=d, batch_size=int(b),
                    predicted_plan=planned["speedup"],
                    predicted_bench_al=r["acceptance_length"] / cost,
                    predicted_round=None if rcost is None else r["acceptance_length"] / rcost,
                    measured=r["speedup"], plan_al=planned["acceptance_length"],
                    bench_al=r["acceptance_length"]))
  return out


def markdown(table: list[dict]) -> str:
  lines = ["| drafter | D | B | AL plan / bench | predicted (plan) | predicted (bench AL) | "
           "predicted (round) | measured | error (bench AL) | error (round) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in table:
    err = r["predicted_bench_al"] / r["measured"] - 1
    rp = r.get("predicted_round")
    rpred, rerr = ("—", "—") if rp is None else (
        f"{rp:.2f}", f"{100 * (rp / r['measured'] - 1):+.0f}%")
    lines.append(f"| {r['drafter']} | {r['num_draft']} | {r['batch_size']} | {r['plan_al']:.2f} / "
                 f"{r['bench_al']:.2f} | {r['predicted_plan']:.2f} | "
                 f"{r['predicted_bench_al']:.2f} | {rpred} | {r['measured']:.2f} | "
                 f"{100 * err:+.0f}% | {rerr} |")
  return "\n".join(lines)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--plan", required=True)
  p.add_argument("--bench", required=True)
  args = p.parse_args(argv)
  try:
    with open(args.plan) as f:
      plan = json.load(f)
    with open(args.bench) as f:
      bench = json.load(f)
    table = rows(plan, bench)
  except (OSError, ValueError, KeyError) as e:
    p.error(f"cannot compare these reports ({e}): pass a `jspec plan --json` and a "
            "`jspec bench --json` report")
  print(markdown(table))


if __name__ == "__main__":
  main()
