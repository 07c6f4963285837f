"""The long-context benchmark script runs end to end on a tiny model and writes its JSON: every
point it was asked for, verify ratios against the decode step of the same context, prefill rates,
and the goals judged from them."""

from __future__ import annotations

import json

import pytest

from jspec.bench import long_context


def test_long_context_writes_every_point(tmp_path):
  out = tmp_path / "lc.json"
  long_context.main(["--json", str(out), "--tiny", "--contexts", "16,64", "--batch-sizes", "1,2",
                     "--draft", "3", "--prefill", "1x16,1x64", "--calls", "1", "--repeats", "1",
                     "--no-padded"])
  report = json.loads(out.read_text())
  assert {(r["batch_size"], r["context"]) for r in report["decode"]} == {
      (1, 16), (1, 64), (2, 16), (2, 64)}
  assert all(r["buffer"] == r["context"] + long_context.NEW_TOKENS for r in report["decode"])
  step = {r["context"]: r["ms"] for r in report["decode"] if r["batch_size"] == 1}
  for r in report["verify"]:
    assert r["tokens"] == 4
    assert r["vs_decode"] == pytest.approx(r["ms"] / step[r["context"]], rel=0.02)
  assert [(r["batch_size"], r["prompt_tokens"]) for r in report["prefill"]] == [(1, 16), (1, 64)]
  assert all(r["tokens_per_s"] > 0 for r in report["prefill"])
  small, large = report["prefill"]
  assert large["cache_mb"] > small["cache_mb"] > 0 and large["temp_mb"] > 0
  assert "verify_T4_ratio_2048_minus_64" not in report["goals"]   # 2048 was not measured
  assert report["llama_cpp"] is None and report["padded"] is None


def test_long_context_rejects_contexts_past_the_model(tmp_path, capsys):
  with pytest.raises(SystemExit):
    long_context.main(["--json", str(tmp_path / "x.json"), "--tiny", "--contexts", "600",
                       "--no-padded"])
  assert "must fit the model's context of 512" in capsys.readouterr().err
