"""The training-step benchmark runs end to end on a tiny model: both heads, both compute dtypes,
interleaved step times, and clear errors for bad flags."""

from __future__ import annotations

import json

import pytest

from jspec.bench import train_step


def test_train_step_writes_every_variant(tmp_path):
  out = tmp_path / "ts.json"
  train_step.main(["--json", str(out), "--tiny", "--batch-size", "2", "--seq-len", "32",
                   "--steps", "2"])
  report = json.loads(out.read_text())
  assert {(r["head"], r["compute_dtype"]) for r in report["results"]} == {
      (h, d) for h in train_step.HEADS for d in train_step.DTYPES}
  for r in report["results"]:
    assert len(r["times_s"]) == 2 and r["step_s"] > 0
    assert r["positions_per_s"] == pytest.approx(64 / r["step_s"])


@pytest.mark.parametrize("argv, message", [
    (["--heads", "medusa"], "--heads takes a comma list of eagle3, mtp"),
    (["--steps", "0"], "must be >= 1"),
])
def test_bad_flags_name_the_fix(tmp_path, argv, message):
  with pytest.raises(SystemExit) as e:
    train_step.main(["--json", str(tmp_path / "x.json"), "--tiny", *argv])
  assert message in str(e.value)
