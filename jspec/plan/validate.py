"""Predicted vs measured speedup: a `jspec plan` report against a `jspec bench` report.

For every fixed-D bench record of the pooled category ("all") whose drafter and B the plan covers:
  predicted (plan)      the plan's own prediction (calibration-prompt acceptance, plan's costs)
  predicted (bench AL)  the plan's forward costs (T_verif + T_draft) with the acceptance the bench
                        measured: isolates the cost model's error from the calibration acceptance's
  predicted (round)     the same with the plan's measured whole-round costs (the adaptive round
                        forced to D, which the adaptive choice uses)
  predicted (batch)     the round costs with the batch's acceptance (`batch_acceptance`): at B > 1
                        a batch runs until its last row is done, fewer tokens per batch round than
                        the rows' mean AL
  measured              the bench's median speedup
  python -m jspec.plan.validate --plan benchmarks/results/plan/cpu.json --bench benchmarks/results/X/cpu.json
"""

from __future__ import annotations

import argparse
import json

from jspec.costs import CostTable


def batch_acceptance(r: dict) -> float:
  """A bench record's tokens per row per batch round over plain decoding's tokens per row per
  step (the batch's own AL: its speedup is this over the round cost; the record's AL at B = 1).
  The rounds follow from the record: verify_time_share = rounds x verify_ms / decode time, and
  plain steps = plain decode time / t1_ms."""
  if r["batch_size"] == 1:
    return r["acceptance_length"]
  tokens = r["generated_tokens"]
  rounds = r["verify_time_share"] * tokens / r["tokens_per_s"] / (r["verify_ms"] / 1e3)
  steps = tokens / r["baseline_tokens_per_s"] / (r["t1_ms"] / 1e3)
  return steps / rounds


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
                    predicted_batch=None if rcost is None else batch_acceptance(r) / rcost,
                    measured=r["speedup"], plan_al=planned["acceptance_length"],
                    bench_al=r["acceptance_length"], batch_al=batch_acceptance(r)))
  return out


def markdown(table: list[dict]) -> str:
  lines = ["| drafter | D | B | AL plan / bench / batch | predicted (plan) | predicted (bench AL) | "
           "predicted (round) | predicted (batch) | measured | error (bench AL) | error (round) | "
           "error (batch) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  pair = lambda p, m: ("—", "—") if p is None else (f"{p:.2f}", f"{100 * (p / m - 1):+.0f}%")
  for r in table:
    m = r["measured"]
    (bpred, berr), (rpred, rerr), (cpred, cerr) = (
        pair(r[k], m) for k in ("predicted_bench_al", "predicted_round", "predicted_batch"))
    lines.append(f"| {r['drafter']} | {r['num_draft']} | {r['batch_size']} | {r['plan_al']:.2f} / "
                 f"{r['bench_al']:.2f} / {r['batch_al']:.2f} | {r['predicted_plan']:.2f} | "
                 f"{bpred} | {rpred} | {cpred} | {m:.2f} | {berr} | {rerr} | {cerr} |")
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
