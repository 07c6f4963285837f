"""The weight-format benchmark refuses bad input before it loads anything."""

import pytest

from jspec.bench import weights


@pytest.mark.parametrize("argv, message", [
    (["--formats", "f32,q4_k"], "unknown format(s) ['q4_k']"),
    (["--batch-sizes", "1,0"], "must be >= 1"),
    (["--spec-draft", "0"], "must be >= 1"),
    (["--json", "/nonexistent-folder/w.json"], "does not exist"),
])
def test_bad_input_fails_before_the_model_loads(argv, message, monkeypatch, capsys, tmp_path):
  monkeypatch.setattr(weights, "resident_mb", lambda f: pytest.fail("measured before checking"))
  monkeypatch.setattr(weights.models, "load", lambda *a, **k: pytest.fail("loaded a model"))
  base = ["--json", str(tmp_path / "w.json"), "--no-llama-cpp"]
  with pytest.raises(SystemExit) as e:
    weights.main(base + argv)
  assert e.value.code == 2 and message in capsys.readouterr().err
