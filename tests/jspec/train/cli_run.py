"""`jspec train METHOD` run through the CLI on a tiny target, and its training log: shared by the
tests of each method's command-line flags."""

from __future__ import annotations

import json
import os
import types


def cli_train(method: str, target, data: str, monkeypatch, *argv, lr: str = "3e-3") -> None:
  """`jspec train METHOD --data DATA ...` with models.load returning `target`."""
  import models
  from jspec.cli import main
  monkeypatch.setattr(models, "load", lambda name, **k: types.SimpleNamespace(model=target,
                                                                              name="tiny"))
  main(["train", method, "--data", data, "--batch-size", "8", "--seq-len", "64", "--lr", lr,
        "--warmup", "5", "--save-every", "20", "--eval-every", "20", "--holdout", "8",
        "--no-progress", "--dtype", "fp32", *argv])


def train_log(folder: str) -> list[dict]:
  """The rows of folder/train_log.jsonl."""
  with open(os.path.join(folder, "train_log.jsonl")) as f:
    return [json.loads(line) for line in f]


def assert_refused(run, out: str, message: str) -> None:
  """run(out) (a `jspec train` call writing to `out`) exits with an error containing `message`
  before writing anything."""
  import pytest

  with pytest.raises(SystemExit) as e:
    run(out)
  assert message in str(e.value)
  assert not os.path.exists(out)        # refused before anything was written


def assert_init_refused(run, tmp_path, head: str, argv, message: str) -> None:
  """run(out, *flags) trains into `out`: with `--init head` and `argv` it is refused with
  `message`, and with `--init` of a missing folder it names that folder; nothing is written."""
  assert_refused(lambda out: run(out, "--init", head, *argv), str(tmp_path / "c"), message)
  missing = str(tmp_path / "nothing")
  assert_refused(lambda out: run(out, "--init", missing), str(tmp_path / "d"), missing)
