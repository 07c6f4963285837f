"""The model-free bench cases (jspec.bench.model_free) on a tiny random model: record schema,
pass labels, suffix decoding's second pass drafting from the first, predictions taken from the
prompts' code blocks, and errors before the model loads."""

import json

import pytest

from jspec import prompt_suite
from jspec.bench import model_free, speedup

CODE = "```python\ndef f(x):\n    return x + 1\n```"
PROMPTS = prompt_suite.parse([json.dumps(dict(id=f"{c}{i}", category=c, prompt=text * (i + 4)))
                       for c, text in (("edit", "fix this " + CODE + " "), ("chat", "sky? "))
                       for i in range(2)])
MAX_NEW = 16


@pytest.fixture(scope="module")
def loaded(tiny_loaded_factory):
  return tiny_loaded_factory(4)


@pytest.fixture(scope="module")
def repeat(loaded):
  return model_free.run(loaded, PROMPTS, case="repeat", drafters=("ngram", "suffix"),
                        num_draft=(3,), batch_sizes=(1,), max_new_tokens=MAX_NEW,
                        ignore_eos=True, progress=False)


def test_repeat_case_records(repeat):
  rows = repeat["results"]
  labels = {r["category"] for r in rows}
  assert labels == {f"{c} (pass {n})" for c in ("edit", "chat", "all") for n in (1, 2)}
  assert len(rows) == 2 * 2 * 3                   # drafters x passes x (2 categories + all)
  for r in rows:
    speedup.check_record(r)
    assert r["same_as_plain"] is True
  json.loads(json.dumps(repeat))
  al = {(r["drafter"], r["category"]): r["acceptance_length"] for r in rows}
  # the second pass drafts the first pass's outputs from the global cache
  assert al[("suffix", "all (pass 2)")] > al[("suffix", "all (pass 1)")] + 1.0
  assert al[("ngram", "all (pass 2)")] == al[("ngram", "all (pass 1)")]


def test_prediction_case_uses_code_blocks(loaded):
  assert model_free.original_code(PROMPTS[0]) == CODE
  assert model_free.original_code(PROMPTS[-1]) is None
  report = model_free.run(loaded, PROMPTS, case="prediction", drafters=("prediction",),
                          num_draft=(2,), batch_sizes=(2,), max_new_tokens=8, ignore_eos=True,
                          progress=False)
  assert report["settings"]["categories"] == ["edit"]     # prompts without code are skipped
  for r in report["results"]:
    speedup.check_record(r)
    assert r["same_as_plain"] is True and r["num_prompts"] == 2


@pytest.mark.parametrize("argv, message", [
    (["repeat", "--repeats", "2"], "runs every prompt exactly twice"),
    (["prediction", "--drafters", "nope"], "unknown speculative method 'nope'"),
    (["repeat", "--suffix-cache-tokens", "-1"], "cache_tokens must be 0"),
])
def test_cli_rejects_bad_input_before_loading(argv, message, tmp_path, monkeypatch, capsys):
  from jspec import cli_args
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: pytest.fail("loaded a model"))
  path = tmp_path / "p.jsonl"
  path.write_text("\n".join(json.dumps(dict(id=p.id, category=p.category,
                                            messages=list(p.messages))) for p in PROMPTS))
  if "--drafters" not in argv:
    argv = argv + ["--drafters", "ngram,suffix"]
  with pytest.raises(SystemExit) as e:
    model_free.main(argv[:1] + ["--prompts", str(path)] + argv[1:])
  assert message in str(e.value.code)
