"""`jspec bench` end to end on a tiny random model: the record schema, pooled statistics, and
properties the numbers must have (a self-draft accepts everything; greedy equals plain)."""

import json
import math
import os

import numpy as np
import pytest

from jspec import cli, cli_args, prompt_suite
from jspec.bench import plots, speedup


@pytest.fixture(scope="module")
def loaded(tiny_loaded_factory):
  return tiny_loaded_factory(3)


PROMPTS = prompt_suite.parse([json.dumps(dict(id=f"{c}{i}", category=c, prompt=text * (i + 1)))
                       for c, text in (("echo", "abc "), ("chat", "sky? "))
                       for i in range(5, 8)])        # 37..52 tokens: one padded shape
MAX_NEW = 12


@pytest.fixture(scope="module")
def report(loaded):
  return speedup.run(loaded, PROMPTS, drafters=("ngram", "draft-model"), num_draft=(1, 3),
                     batch_sizes=(1, 2), max_new_tokens=MAX_NEW, ignore_eos=True, progress=False)


def test_every_record_follows_the_schema(report):
  rows = report["results"]
  assert len(rows) == 2 * 2 * 2 * 3            # drafters x D x B x (2 categories + "all")
  for r in rows:
    speedup.check_record(r)
    assert r["speedup_min"] <= r["speedup_p25"] <= r["speedup"] <= r["speedup_p75"] \
        <= r["speedup_max"]
    assert len(r["per_position_acceptance"]) == r["num_draft"]
    # a draft position is accepted only if every earlier one is: the curve cannot rise
    ppa = r["per_position_acceptance"]
    assert all(a >= b for a, b in zip(ppa, ppa[1:]))
    assert r["same_as_plain"] is True           # greedy: lossless means identical
    assert len(r["speedup_runs"]) == r["num_runs"]
    assert r["speedup"] == pytest.approx(np.median(r["speedup_runs"]), rel=1e-12)
  # "all" pools the categories' runs in one order, the same in every configuration (paired)
  for r in rows:
    if r["category"] == "all":
      parts = [q["speedup_runs"] for q in rows if q["category"] != "all" and
               (q["drafter"], q["num_draft"], q["batch_size"]) ==
               (r["drafter"], r["num_draft"], r["batch_size"])]
      assert r["speedup_runs"] == [x for p in parts for x in p]
  json.loads(json.dumps(report))
  assert report["schema"] == speedup.SCHEMA


def test_runs_and_pooling(report):
  for r in report["results"]:
    b, cat = r["batch_size"], r["category"]
    per_cat = math.ceil(3 / b)
    assert r["num_runs"] == (2 * per_cat if cat == "all" else per_cat)
    assert r["num_prompts"] == (6 if cat == "all" else 3)
    assert r["generated_tokens"] == r["num_runs"] * b * (MAX_NEW - 1)


def test_self_draft_accepts_every_token(report):
  """The target drafting for itself (greedy): every position accepted, and rounds of D+1 tokens
  until the last, which max_new_tokens truncates."""
  for r in report["results"]:
    if r["drafter"] == "draft-model":
      d = r["num_draft"]
      assert r["per_position_acceptance"] == [1.0] * d
      assert r["acceptance_length"] == pytest.approx((MAX_NEW - 1) / math.ceil((MAX_NEW - 1) / (d + 1)))


def test_cost_model_fields_are_consistent(report):
  for r in report["results"]:
    expect = r["acceptance_length"] * r["t1_ms"] / (r["verify_ms"] + r["draft_ms"])
    assert r["predicted_speedup"] == pytest.approx(expect)
    assert r["verify_ms"] > 0 and r["draft_ms"] >= 0 and r["t1_ms"] > 0


def test_sampled_runs_report_no_identity(loaded):
  rep = speedup.run(loaded, PROMPTS[:3], drafters=("ngram",), num_draft=(2,), batch_sizes=(2,),
                    temperature=0.8, max_new_tokens=8, progress=False)
  assert {r["same_as_plain"] for r in rep["results"]} == {None}
  for r in rep["results"]:
    speedup.check_record(r)


def test_check_record_rejects_drift(report):
  rec = dict(report["results"][0])
  del rec["speedup_p25"]
  with pytest.raises(ValueError, match="missing \\['speedup_p25'\\]"):
    speedup.check_record(rec)
  rec = dict(report["results"][0], num_draft=1.0)
  with pytest.raises(ValueError, match="num_draft"):
    speedup.check_record(rec)


def test_markdown_and_plots(report, tmp_path):
  table = speedup.markdown(report).splitlines()
  assert len(table) == 2 + len(report["results"])
  assert len(speedup.markdown(report, categories=False).splitlines()) == 2 + 8
  import matplotlib.image
  paths = plots.save_all(report, str(tmp_path))
  assert sorted(os.path.basename(p) for p in paths) == [
      "acceptance_length_vs_d.png", "cost_model.png", "per_position_acceptance.png",
      "speedup_vs_d.png"]
  for p in paths:
    assert matplotlib.image.imread(p).shape[0] > 200


@pytest.mark.parametrize("argv, message", [
    (["--num-draft", "0"], "--num-draft values must be >= 1"),
    (["--batch-size", "a"], "--batch-size takes comma-separated integers"),
    (["--drafters", "eagle9"], "method"),
    (["--temperature", "-1"], "temperature"),
    (["--categories", "nope"], "no prompts of category ['nope']"),
])
def test_cli_rejects_bad_input_before_loading(argv, message, tmp_path, monkeypatch):
  f = tmp_path / "p.jsonl"
  f.write_text(json.dumps(dict(id="a", category="x", prompt="p")) + "\n")
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: pytest.fail("loaded a model"))
  with pytest.raises(SystemExit) as e:
    cli.main(["bench", "--prompts", str(f)] + argv)
  assert message in str(e.value)


def test_cli_names_the_bad_line(tmp_path, monkeypatch):
  f = tmp_path / "p.jsonl"
  f.write_text(json.dumps(dict(id="a", category="x", prompt="p")) + "\n{oops\n")
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: pytest.fail("loaded a model"))
  with pytest.raises(SystemExit) as e:
    cli.main(["bench", "--prompts", str(f)])
  assert f"{f}:2: not valid JSON" in str(e.value)


def test_padding_prompts_to_a_shared_shape_changes_no_token(loaded):
  from jspec import Decoder, SpecDecoder
  ids = [[5, 6, 7, 8, 9, 10, 11], [3, 4, 5]]
  plain, spec = Decoder(loaded.model), SpecDecoder(loaded.model, {"method": "ngram",
                                                                  "num_speculative_tokens": 2})
  for dec in (plain, spec):
    a = dec.generate(ids, max_new_tokens=6, temperature=0.7, seed=3)
    b = dec.generate(ids, max_new_tokens=6, temperature=0.7, seed=3, pad_to=64)
    assert a.token_ids == b.token_ids


def test_auto_draft_length_records(loaded, tmp_path):
  """'auto' records: schema, pooled round counts per verified length, and the round costs the
  decoder timed at warm-up and chose by (ms per round at every compiled length)."""
  rep = speedup.run(loaded, PROMPTS[::2], drafters=("draft-model",), num_draft=("auto",),
                    batch_sizes=(2,), max_new_tokens=MAX_NEW, ignore_eos=True, progress=False)
  auto = rep["results"]
  assert len(auto) == 3
  for r in auto:
    speedup.check_record(r)
    assert len(r["per_position_acceptance"]) == 7
  pooled = next(r for r in auto if r["category"] == "all")
  counts = {int(k): v for k, v in pooled["verified_lengths"].items()}
  assert sum(counts.values()) == sum(sum(r["verified_lengths"].values()) for r in auto
                                     if r["category"] != "all")
  assert sorted(counts) == [0, 1, 2, 3, 5, 7] and pooled["predicted_speedup"] is None
  for r in auto:
    assert sorted(int(d) for d in r["round_ms"]) == sorted(counts)
    assert all(ms > 0 for ms in r["round_ms"].values())
  assert "| auto |" in speedup.markdown(rep)
  plots.save_all(rep, str(tmp_path))


def test_cli_auto_beside_fixed_lengths_builds_every_config(tmp_path, monkeypatch, loaded):
  seen = {}
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: loaded)
  monkeypatch.setattr(speedup, "run", lambda *a, **k: seen.update(k) or {"results": []})
  monkeypatch.setattr(speedup, "markdown", lambda report: "")
  f = tmp_path / "p.jsonl"
  f.write_text(PROMPTS and json.dumps(dict(id="a", category="x", prompt="p")) + "\n")
  cli.main(["bench", "--prompts", str(f), "--drafters", "ngram", "--num-draft", "1,auto"])
  assert seen["num_draft"] == (1, "auto") and seen["drafter_options"] == {"ngram": {
      "prompt_lookup_min": 1, "prompt_lookup_max": 4}}


def test_drafter_variants(tmp_path, monkeypatch, loaded):
  assert cli_args.parse_drafter("eagle3:tree_top_k=3:tree_depth=4:head=/x") == (
      "eagle3", {"tree_top_k": 3, "tree_depth": 4, "head": "/x"})
  assert speedup.spec_config("ngram:prompt_lookup_max=2", 3).options.prompt_lookup_max == 2
  seen = {}
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: loaded)
  monkeypatch.setattr(speedup, "run", lambda *a, **k: seen.update(k) or {"results": []})
  monkeypatch.setattr(speedup, "markdown", lambda report: "")
  f = tmp_path / "p.jsonl"
  f.write_text(json.dumps(dict(id="a", category="x", prompt="p")) + "\n")
  cli.main(["bench", "--prompts", str(f), "--drafters", "ngram,ngram:prompt_lookup_max=2"])
  assert seen["drafter_options"]["ngram:prompt_lookup_max=2"]["prompt_lookup_max"] == 2
  assert seen["drafter_options"]["ngram"]["prompt_lookup_max"] == 4
  for bad, message in (("ngram:oops", "method:key=value"), ("ngram:nope=1", "unknown")):
    with pytest.raises(SystemExit) as e:
      cli.main(["bench", "--prompts", str(f), "--drafters", bad])
    assert message in str(e.value)
