"""The co-design planner's arithmetic (jspec/plan/model.py) against hand-computed cases, the
schedule's lookup, and `jspec plan` end to end on a tiny model (tests/jspec/test_cli.py style)."""

import pytest

from jspec.costs import CostTable, fit_round_costs
from jspec.plan import model as cm


def test_acceptance_length_and_conditional_acceptance():
  reach = [0.8, 0.4, 0.1]
  assert cm.acceptance_length(reach, 0) == 1.0
  assert cm.acceptance_length(reach, 2) == pytest.approx(2.2)
  assert cm.conditional_acceptance(reach) == pytest.approx([0.8, 0.5, 0.25])
  with pytest.raises(ValueError, match="D <= 3"):
    cm.acceptance_length(reach, 4)
  # counted over the rounds that proposed each position: 30 of 40 offered firsts accepted, 12 of
  # the 30 seconds; the third never offered (takes the second's), the fourth 1 of 4
  assert cm.offered_acceptance([30, 12, 0, 1], [40, 30, 0, 4]) == pytest.approx(
      [0.75, 0.4, 0.4, 0.25])
  assert cm.offered_acceptance([0, 0], [0, 0]) == [0.5, 0.5]


def test_ranking_by_hand():
  verify = {1: {1: 1.0, 2: 1.1, 4: 1.3}, 4: {1: 1.0, 2: 1.5, 4: 2.5}}
  free = cm.DrafterProfile("ngram", (0.5, 0.25, 0.2), {})
  serial = cm.DrafterProfile("eagle3", (0.9, 0.8, 0.7), {1: {1: 0.1, 3: 0.3}, 4: {1: 0.1, 3: 0.3}})
  ranking = cm.rank(verify, [free, serial], [0, 1, 3])
  rows = {(r["drafter"], r["num_draft"]): r for r in ranking[1]}
  # eagle3 D=3 at B=1: AL 1 + .9 + .8 + .7 = 3.4 over verify 1.3 + draft 0.3 = 2.125
  assert rows[("eagle3", 3)]["speedup"] == pytest.approx(3.4 / 1.6)
  assert rows[("ngram", 1)]["speedup"] == pytest.approx(1.5 / 1.1)
  # low-latency form: rho = (1.3 + 0.3 - 1) / 3 = 0.2, so AL(1) / (1 + 0.2) for eagle3 D=1
  assert rows[("eagle3", 1)]["low_latency_speedup"] == pytest.approx(1.9 / 1.2)
  assert rows[(None, 0)]["speedup"] == 1.0
  assert ranking[1][0]["drafter"] == "eagle3" and ranking[1][0]["num_draft"] == 3
  # B=4: ngram D=3 is 1.95 / 2.5 < 1; eagle3 D=1 is 1.9 / 1.6 = 1.19, D=3 is 3.4 / 2.8 = 1.21
  sched = cm.schedule(ranking)
  assert sched[1]["num_draft"] == 3 and sched[4] == dict(drafter="eagle3", num_draft=3,
                                                        predicted_speedup=pytest.approx(3.4 / 2.8))
  assert [r["num_draft"] for r in ranking[4] if r["drafter"] == "ngram"] == [1, 3]
  bad = cm.rank(verify, [cm.DrafterProfile("ngram", (0.05, 0.0, 0.0), {})], [0, 1, 3])
  assert cm.schedule(bad)[4] == dict(drafter=None, num_draft=0, predicted_speedup=1.0)


def test_schedule_lookup_uses_the_largest_planned_batch_at_or_below():
  sched = {"1": dict(drafter="ngram", num_draft=5), "4": dict(drafter="ngram", num_draft=2),
           "16": dict(drafter=None, num_draft=0)}
  assert cm.pick(sched, 1) == ("ngram", 5)
  assert cm.pick(sched, 3) == ("ngram", 5)
  assert cm.pick(sched, 8) == ("ngram", 2)
  assert cm.pick(sched, 64) == (None, 0)


def test_plan_cost_table_is_what_adaptive_decoders_load(tmp_path):
  import json
  table = CostTable({1: {1: 1.0, 2: 1.2}}, {1: {1: 0.05}})
  path = tmp_path / "plan.json"
  path.write_text(json.dumps({"cost_table": CostTable({1: {1: 1.0}}).to_dict(),
                              "cost_tables": {"eagle3": table.to_dict()}}))
  assert CostTable.load(path, "eagle3") == table
  assert CostTable.load(path, "ngram").verify == {1: {1: 1.0}}


def _prompt_file(tmp_path, n=3):
  import json
  f = tmp_path / "calib.jsonl"
  f.write_text("".join(json.dumps(dict(id=f"c{i}", category="x", prompt=f"say {i} {i} {i} again"))
                       + "\n" for i in range(n)))
  return str(f)


@pytest.mark.parametrize("argv, message", [
    (["--batch-sizes", "0"], "--batch-sizes values must be >= 1"),
    (["--num-draft", "1,x"], "--num-draft takes comma-separated integers"),
    (["--drafters", ""], "--drafters is empty"),
    (["--drafters", "nope"], "unknown speculative method 'nope'"),
    (["--calibration", "/nonexistent.jsonl"], "cannot read the prompt file"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--context", "128,0"], "--context values must be >= 1"),
])
def test_plan_bad_input_fails_before_the_model_loads(argv, message, tmp_path, monkeypatch):
  from jspec import cli, cli_args
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: pytest.fail("loaded a model"))
  base = ["plan", "--json", str(tmp_path / "p.json"), "--calibration", _prompt_file(tmp_path)]
  with pytest.raises(SystemExit) as e:
    cli.main(base + argv)
  assert message in str(e.value.code)


def test_plan_end_to_end_on_a_tiny_model(tmp_path, monkeypatch, tiny_loaded_factory, capsys):
  """`jspec plan` writes a report whose schedule `generate --plan` follows and whose cost table
  an adaptive decoder loads."""
  import json

  from jspec import cli, cli_args
  from jspec.spec_decode import SpecDecoder
  loaded = tiny_loaded_factory(0)
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: loaded)
  out, png = tmp_path / "plan.json", tmp_path / "pareto.png"
  cli.main(["plan", "--json", str(out), "--plot", str(png), "--drafters", "ngram",
            "--batch-sizes", "1,2", "--num-draft", "3", "--calibration", _prompt_file(tmp_path),
            "--max-new-tokens", "8", "--repeats", "2", "--context", "32,64"])
  report = json.loads(out.read_text())
  assert png.stat().st_size > 0
  assert set(report["schedule"]) == {"1", "2"} and len(report["guidelines"]) == 5
  rounds = report["cost_tables"]["ngram"]["round"]
  assert set(rounds) == {"1", "2"} and all(set(r) == {"0", "3"} for r in rounds.values())
  # the rounds timed at both paddings; `round` is the larger one's
  at = report["cost_tables"]["ngram"]["round_at"]
  assert report["round_paddings"] == [32, 64] and set(at) == {"32", "64"} and at["64"] == rounds
  for b, rows in report["ranking"].items():
    best = [cm.expected_speedup(r) for r in rows]
    assert best == sorted(best, reverse=True)
    for r in rows:     # each row's speedups are its AL over its costs
      assert r["speedup"] == pytest.approx(r["acceptance_length"] /
                                           (r["verify_cost"] + r["draft_cost"]))
      if r["num_draft"]:     # the measured rounds, fit by a line in D
        fit = fit_round_costs({int(d): c for d, c in rounds[b].items()})
        assert r["round_cost"] == pytest.approx(fit[r["num_draft"]])
        assert r["round_speedup"] == pytest.approx(r["acceptance_length"] / r["round_cost"])
  assert "| B | best |" in capsys.readouterr().out
  sd = SpecDecoder(loaded.model, {"method": "ngram", "num_speculative_tokens": "auto"},
                   cost_table=str(out))
  assert sd.drafter.batch_sizes == (1, 2)
  drafter, d = cm.pick(report["schedule"], 1)
  cli.main(["generate", "hello hello hello", "--raw", "--max-new-tokens", "6", "--json",
            "--plan", str(out)])
  record = json.loads(capsys.readouterr().out)
  assert record["drafter"] == ("none" if d == 0 else drafter.replace("_", "-"))
  # the plan records its weight format; a run with another one is refused before any work
  assert report["weights"] == "f32"
  with pytest.raises(SystemExit) as e:
    cli.main(["generate", "hello", "--raw", "--drafter", "ngram", "--num-draft", "auto",
              "--plan", str(out), "--weights", "gguf"])
  assert "was measured with --weights f32" in str(e.value.code)


def test_validation_rows_by_hand():
  from jspec.plan import validate
  table = CostTable({1: {1: 1.0, 4: 1.6}}, {1: {3: 0.2}})
  plan = {"ranking": {"1": [dict(drafter="eagle3", num_draft=3, speedup=1.5,
                                 acceptance_length=2.7)]},
          "cost_tables": {"eagle3": table.to_dict()}}
  rec = dict(drafter="eagle3", num_draft=3, batch_size=1, category="all", speedup=1.4,
             acceptance_length=2.52)
  bench = {"results": [rec, dict(rec, category="math"), dict(rec, num_draft="auto"),
                       dict(rec, batch_size=4)]}
  rows = validate.rows(plan, bench)
  assert len(rows) == 1
  assert rows[0]["predicted_bench_al"] == pytest.approx(2.52 / 1.8)
  assert rows[0]["predicted_plan"] == 1.5 and rows[0]["measured"] == 1.4
  assert rows[0]["predicted_round"] is None
  assert ("| eagle3 | 3 | 1 | 2.70 / 2.52 / 2.52 | 1.50 | 1.40 | — | — | 1.40 | +0% | — | — |"
          in validate.markdown(rows))
  # with measured round costs: AL over the round's cost at D = 3 (interpolated from 2 and 5)
  plan["cost_tables"]["eagle3"]["round"] = {"1": {"0": 1.1, "2": 1.4, "5": 2.3}}
  rows = validate.rows(plan, bench)
  assert rows[0]["predicted_round"] == rows[0]["predicted_batch"] == pytest.approx(2.52 / 1.7)
  assert "| 1.48 | 1.48 | 1.40 | +0% | +6% | +6% |" in validate.markdown(rows)
  # B = 4: 300 tokens in 100 batch rounds (verify_time_share = 100 x 20 ms / (300 / 50 tok/s))
  # against 200 plain steps (300 / 100 tok/s / 15 ms): 0.75 vs 0.375 tokens per row per round
  rec4 = dict(rec, batch_size=4, generated_tokens=300, tokens_per_s=50.0, verify_ms=20.0,
              verify_time_share=100 * 0.02 / 6.0, baseline_tokens_per_s=100.0, t1_ms=15.0)
  assert validate.batch_acceptance(rec4) == pytest.approx(2.0)
  plan["ranking"]["4"] = plan["ranking"]["1"]
  plan["cost_tables"]["eagle3"]["round"]["4"] = {"2": 1.5, "5": 3.0}
  row = validate.rows(plan, {"results": [rec4]})[0]
  assert row["predicted_batch"] == pytest.approx(2.0 / 2.0)
  assert row["predicted_round"] == pytest.approx(2.52 / 2.0)


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_unreadable_plan_fails_before_the_model_loads(command, tmp_path, monkeypatch):
  from jspec import cli, cli_args
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: pytest.fail("loaded a model"))
  bad = tmp_path / "plan.json"
  bad.write_text("[1, 2]")
  argv = (["generate", "hi", "--drafter", "ngram"] if command == "generate" else
          ["bench", "--prompts", _prompt_file(tmp_path)]) + ["--plan", str(bad)]
  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  assert "is not a cost table or a jspec plan report" in str(e.value.code)
