"""Prompt-suite loading and validation, and the committed suite and training corpus themselves."""

import json
import os

import pytest

from jspec import prompt_suite

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
SUITE = os.path.join(ROOT, "benchmarks", "prompts", "suite.jsonl")
TRAIN = os.path.join(ROOT, "benchmarks", "prompts", "train.jsonl")
CATEGORIES = {"coding", "code_editing", "summarization", "rag_qa", "math", "writing", "multi_turn",
              "long_input"}


def _line(**obj):
  return json.dumps(obj)


GOOD = _line(id="a", category="x", messages=[{"role": "user", "content": "hi"}], source="s")


def test_parse_accepts_messages_and_plain_prompt():
  got = prompt_suite.parse([GOOD, "", _line(id="b", category="y", prompt="hello")], "f.jsonl")
  assert [p.id for p in got] == ["a", "b"]
  assert got[1].messages == ({"role": "user", "content": "hello"},)
  assert got[1].source == ""


@pytest.mark.parametrize("bad, message", [
    ("{not json", "f.jsonl:2: not valid JSON"),
    ("[1, 2]", "f.jsonl:2: each line must be a JSON object"),
    (_line(id="b", category="x", messages=[{"role": "robot", "content": "hi"}]),
     "f.jsonl:2: message 0 has unknown role 'robot'"),
    (_line(id="b", category="x", messages=[{"role": "user", "content": "  "}]),
     "f.jsonl:2: message 0 (user) has empty content"),
    (_line(id="b", category="x", messages=[]), "f.jsonl:2: \"messages\" must be a non-empty list"),
    (_line(id="b", category="x", messages=[{"role": "user", "content": "q"},
                                           {"role": "assistant", "content": "a"}]),
     "f.jsonl:2: the last message must be the user's"),
    (_line(id="b", category="x", prompt="p", messages=[{"role": "user", "content": "q"}]),
     "f.jsonl:2: give exactly one of"),
    (_line(id="a", category="x", prompt="p"), "f.jsonl:2: id 'a' already used on line 1"),
    (_line(id="b", prompt="p"), "f.jsonl:2: missing or empty \"category\""),
    (_line(id="b", category="x", prompt="p", extra=1), "f.jsonl:2: unknown field(s) ['extra']"),
    (_line(id="b", category="x", messages=[{"role": "user"}]),
     "f.jsonl:2: message 0 must be an object with exactly \"role\" and \"content\""),
])
def test_parse_errors_name_the_line(bad, message):
  with pytest.raises(prompt_suite.SuiteError) as e:
    prompt_suite.parse([GOOD, bad], "f.jsonl")
  assert str(e.value).startswith(message), str(e.value)


def test_load_and_select_errors(tmp_path):
  with pytest.raises(prompt_suite.SuiteError, match="cannot read the prompt file"):
    prompt_suite.load(str(tmp_path / "missing.jsonl"))
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n\n")
  with pytest.raises(prompt_suite.SuiteError, match="no prompts"):
    prompt_suite.load(str(empty))
  prompts = prompt_suite.parse([GOOD, _line(id="b", category="x", prompt="p"),
                         _line(id="c", category="y", prompt="p")])
  assert [p.id for p in prompt_suite.select(prompts, per_category=1)] == ["a", "c"]
  assert [p.id for p in prompt_suite.select(prompts, ["y"])] == ["c"]
  with pytest.raises(prompt_suite.SuiteError, match=r"no prompts of category \['z'\]"):
    prompt_suite.select(prompts, ["z"])


def test_committed_suite_covers_every_category():
  prompts = prompt_suite.load(SUITE)
  counts = {c: sum(p.category == c for p in prompts) for c in CATEGORIES}
  assert set(p.category for p in prompts) == CATEGORIES
  assert min(counts.values()) >= 15, counts
  assert all(p.source for p in prompts)


def test_training_corpus_is_disjoint_from_the_suite():
  test = prompt_suite.load(SUITE)
  train = prompt_suite.load(TRAIN)
  assert len(train) >= 400
  users = lambda ps: {m["content"].strip().lower() for p in ps for m in p.messages
                      if m["role"] == "user"}
  assert not users(test) & users(train)
  assert not {p.id for p in test} & {p.id for p in train}


def test_long_inputs_are_long_and_the_rest_affordable(smollm):
  tok = smollm.tokenizer
  for p in prompt_suite.load(SUITE):
    n = len(tok.encode(tok.apply_chat_template(list(p.messages))))
    if p.category == "long_input":
      assert 2000 <= n <= 3000, (p.id, n)
    else:
      assert n <= 700, (p.id, n)
