"""The prompt-corpus builder on a synthetic site-packages folder: 13-gram decontamination (a shared
13-gram drops, a 12-gram does not), exact and near duplicates, determinism, the record schema,
no standard-library text, solvable math and puzzles (checked by independent oracles), CLI errors."""

import datetime
import gzip
import hashlib
import itertools
import json
import os
import textwrap
from fractions import Fraction

import numpy as np
import pytest

from jspec import prompt_suite
from jspec.cli import main
from jspec.train.prompts import build, dedup, mathgen, puzzles, sources
from jspec.train.prompts.common import PASSAGE_CAP, Uses

VOCAB = ("array axis buffer cache channel column config counter dataset device element encoder "
         "field filter frame graph handler index kernel layer matrix model node offset option "
         "packet parser queue record region sample schema shard signal socket stream table "
         "tensor token value vector window worker compute return convert create build check "
         "apply load store merge split sort scale shift encode decode").split()


def _sentence(rng, lo=9, hi=16) -> str:
  words = [str(w) for w in rng.choice(VOCAB, int(rng.integers(lo, hi)))]
  return " ".join(words).capitalize() + "."


def _paragraph(rng, n=4) -> str:
  return " ".join(_sentence(rng) for _ in range(n))


def _function(rng, i: int) -> str:
  doc = "\n\n".join([_sentence(rng), textwrap.fill(_paragraph(rng), 72),
                     "Parameters\n----------\nx : int\n    " + _sentence(rng)
                     + "\nscale : float, optional\n    " + _sentence(rng),
                     "Returns\n-------\nout : list\n    " + _sentence(rng)])
  body = "\n".join(f"    y{k} = x * {k + 3} + scale" for k in range(int(rng.integers(3, 9))))
  return (f"def {str(rng.choice(VOCAB))}_{i}(x, scale=1.5):\n"
          f'    """{textwrap.indent(doc, "    ").strip()}\n    """\n{body}\n    return y0\n')


def _long_function(rng, i: int) -> str:
  body = "\n".join(f"    v{k} = x.get_{rng.choice(VOCAB)}({k}) + {rng.choice(VOCAB)}_{k}"
                   for k in range(140))
  return f"def long_{i}(x):\n{body}\n    return v0\n"


def fake_site(root, copy_of_stdlib: str = "") -> str:
  """A site-packages folder with one distribution, `fakepkg` (MIT), plus a vendored folder and
  a test suite that the scanner must skip."""
  rng = np.random.default_rng(7)
  files = {"fakepkg/__init__.py": f'"""{textwrap.fill(_paragraph(rng, 6), 72)}"""\n'}
  for m in range(4):
    module_doc = "\n\n".join(textwrap.fill(_paragraph(rng, 5), 72) for _ in range(3))
    funcs = [_function(rng, 10 * m + k) for k in range(12)] + [_long_function(rng, m)]
    files[f"fakepkg/mod{m}.py"] = f'"""{module_doc}"""\n\n\n' + "\n\n".join(funcs)
  files["fakepkg/stdcopy.py"] = copy_of_stdlib
  files["fakepkg/_vendor/vendored.py"] = "def vendored_marker():\n    return 1\n"
  files["fakepkg/tests/test_mod.py"] = "def test_marker():\n    assert True\n"
  readme = "\n\n".join(textwrap.fill(_paragraph(rng, 5), 72) for _ in range(12))
  files["fakepkg-1.0.dist-info/METADATA"] = (
      "Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\nLicense-Expression: MIT\n\n" + readme)
  files["fakepkg-1.0.dist-info/RECORD"] = "".join(f"{f},,\n" for f in sorted(files)) + \
      "fakepkg-1.0.dist-info/RECORD,,\n"
  for rel, text in files.items():
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)
  return str(root)


def _build(tmp_path, name="c.jsonl.gz", **kw):
  site = fake_site(tmp_path / "site") if not (tmp_path / "site").exists() else \
      str(tmp_path / "site")
  kw.setdefault("num", 240)
  kw.setdefault("stdlib_check", False)
  out = str(tmp_path / name)
  manifest = build.build_corpus(out, roots=[site], progress=False, **kw)
  with gzip.open(out, "rt", encoding="utf-8") as f:
    return [json.loads(line) for line in f], manifest, out


def _text(r) -> str:
  return "\n".join(m["content"] for m in r["messages"])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  return _build(tmp_path_factory.mktemp("base"))


# Filters ----------------------------------------------------------------------------------------

def test_contaminated_needs_13_words():
  ref = ["zero one two three four five six seven eight nine ten eleven twelve thirteen"]
  shares13 = "before ZERO one two three four five six seven eight nine ten eleven twelve after"
  shares12 = "before zero one two three four five six seven eight nine ten eleven after"
  assert dedup.contaminated([shares13, shares12], ref).tolist() == [True, False]


def test_exclude_file_drops_13_gram_keeps_12_gram(base, tmp_path):
  records, _, _ = base
  victim = next(r for r in records if r["category"] == "math")
  words = dedup.WORD.findall(_text(victim).lower())
  for n, dropped in ((13, True), (12, False)):
    ref = tmp_path / f"ref{n}.txt"
    ref.write_text("unrelated words first " + " ".join(words[3:3 + n]) + " and more")
    again, manifest, _ = _build(tmp_path, f"x{n}.jsonl.gz", exclude=[str(ref)])
    assert (victim["messages"] not in [r["messages"] for r in again]) == dropped
    assert (manifest["dropped"]["contamination"][str(ref)] >= 1) == dropped


def test_exact_duplicates_normalise_case_and_space():
  keys = ["Write a poem", "write  a\npoem", "Write a song", "WRITE A POEM "]
  assert dedup.exact_duplicates(keys).tolist() == [False, True, False, True]


def test_near_duplicates():
  rng = np.random.default_rng(0)
  doc = " ".join(str(w) for w in rng.choice(VOCAB, 300))
  edited = doc.split()
  edited[40], edited[200] = "changed", "edited"
  other = " ".join(str(w) for w in rng.choice(VOCAB, 300))
  texts = [doc, " ".join(edited), other,
           f"Summarize this.\n{doc}", f"List the values.\n{doc}", f"list the VALUES.\n{doc}"]
  passages = ["", "", "", "p", "p", "p"]
  requests = ["", "", "", "Summarize this.", "List the values.", "list the VALUES."]
  drop = dedup.near_duplicates(texts, passages, requests)
  # the edited copy goes, the other text stays; the plain `doc` (no passage key) makes the three
  # prompts quoting it near duplicates
  assert drop.tolist() == [False, True, False, True, True, True]
  # among themselves, the same passage with a different request stays (the passage cap limits
  # those), with the same request (up to case) it goes
  only_passages = dedup.near_duplicates(texts[3:], passages[3:], requests[3:])
  assert only_passages.tolist() == [False, False, True]


def test_passage_cap():
  uses = Uses()
  items = [f"k{i}" for i in range(4)]
  rng = np.random.default_rng(0)
  taken = [k for _ in range(10) for k in uses.take(rng, items, 3, key=str)]
  assert len(taken) == 4 * PASSAGE_CAP
  assert all(taken.count(k) == PASSAGE_CAP for k in items)


# The corpus -------------------------------------------------------------------------------------

def test_schema_and_families(base):
  records, manifest, out = base
  assert {r["category"] for r in records} == set(build.FAMILIES)
  for r in records:
    assert set(r) == {"id", "category", "messages", "source"}
    assert r["messages"][-1]["role"] == "user" and r["source"]
  with gzip.open(out, "rt", encoding="utf-8") as f:    # the suite's loader accepts the file
    assert len(prompt_suite.parse(f, out)) == len(records) == manifest["prompts"]
  assert sum(manifest["quotas"].values()) == 240


def test_deterministic(base, tmp_path):
  _, m1, out1 = base
  _, m2, out2 = _build(tmp_path)
  assert open(out1, "rb").read() == open(out2, "rb").read()
  assert m1["sha256"] == m2["sha256"]


def test_no_stdlib_or_skipped_text(base, tmp_path):
  records, manifest, _ = base
  std = sources.stdlib_dir()
  for r in records:
    assert std not in r["source"] and "cpython" not in r["source"].lower()
    assert "vendored_marker" not in _text(r) and "test_marker" not in _text(r)
  assert set(manifest["packages"]) == {"fakepkg"}
  assert manifest["packages"]["fakepkg"]["licence"] == "MIT"
  with pytest.raises(ValueError, match="standard library"):
    sources.scan([std], seed=0)


def test_stdlib_copy_is_dropped(tmp_path):
  """A package that ships a copy of a stdlib module: no prompt quotes any of it."""
  with open(os.path.join(sources.stdlib_dir(), "textwrap.py")) as f:
    copied = f.read()
  site = fake_site(tmp_path / "site", copy_of_stdlib=copied)
  assert any(u.qualname == "dedent" for u in sources.scan([site], seed=0).code)
  records, manifest, _ = _build(tmp_path, num=240, stdlib_check=True)
  assert manifest["dropped"]["contamination"]["python standard library"] >= 1
  assert not dedup.contaminated([_text(r) for r in records], [copied]).any()


def test_include_merged_deduplicated_decontaminated(tmp_path):
  with open(build.EVAL_FILES[0]) as f:
    suite_text = json.loads(f.readline())["messages"][-1]["content"]
  mine = "Tell me three facts about otters that most people do not know, for a quiz night."
  lines = [dict(id="m1", category="magpie", prompt=mine),
           dict(id="m2", category="magpie", prompt=mine.upper()),
           dict(id="m3", category="magpie", prompt="Please help: " + suite_text)]
  inc = tmp_path / "inc.jsonl"
  inc.write_text("".join(json.dumps(x) + "\n" for x in lines))
  records, manifest, _ = _build(tmp_path, include=[str(inc)], num=120)
  got = [r for r in records if r["category"] == "magpie"]
  assert [r["id"] for r in got] == ["m1"]
  assert manifest["dropped"]["exact_duplicate"] >= 1
  only, manifest, _ = _build(tmp_path, name="only.jsonl.gz", include=[str(inc)], num=0)
  assert [r["id"] for r in only] == ["m1"] and manifest["candidates"] == {}   # no templates


@pytest.mark.parametrize("name", ["corpus", "magpie"])
def test_committed_prompt_files_match_their_manifests(name):
  folder = os.path.join(build.REPO, "benchmarks", "prompts")
  with open(os.path.join(folder, f"{name}.manifest.json")) as f:
    manifest = json.load(f)
  path = os.path.join(folder, manifest["file"])
  blob = open(path, "rb").read()
  assert len(blob) == manifest["bytes"] and \
      hashlib.sha256(blob).hexdigest() == manifest["sha256"]
  records = [json.loads(line) for line in gzip.decompress(blob).splitlines()]
  assert len(records) == manifest["prompts"] == len({r["id"] for r in records})
  total = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
              if f.endswith(".jsonl.gz"))
  assert total <= 10_000_000                    # committed prompt files stay within 10 MB


# Math and puzzles -------------------------------------------------------------------------------

ORACLES = {   # independent recomputations from the drawn values
    "shopping": lambda v: v["bill"] - v["a"] * v["pa"] - v["b"] * v["pb"],
    "two_legs": lambda v: v["v"] * v["t"] + v["w"] * v["s"],
    "ages": lambda v: Fraction(v["k"] * (v["total"] - 2 * v["n"]), v["k"] + 1),
    "discount_tax": lambda v: Fraction(v["p"] * (100 - v["d"]) * (100 + v["t"]), 10000),
    "tank_fraction": lambda v: Fraction(v["cap"] * v["num"] - v["used"] * v["den"],
                                        v["cap"] * v["den"]),
    "garden_path": lambda v: 2 * v["w"] * (v["length"] + v["width"]) + 4 * v["w"] ** 2,
    "recipe_packages": lambda v: -(-v["g"] * v["n"] // (1000 * v["pack"])),
    "work_together": lambda v: 1 / (Fraction(1, v["x"]) + Fraction(1, v["y"])),
    "simple_interest": lambda v: Fraction(v["p"] * v["r"] * v["t"], 100),
    "compound_interest": lambda v: v["p"] * Fraction(100 + v["r"], 100) ** v["t"],
    "needed_score": lambda v: v["target"] * (v["n"] + 1) - sum(v["_scores"]),
    "ratio_share": lambda v: Fraction(v["total"] * max(v["a"], v["b"], v["c"]),
                                      v["a"] + v["b"] + v["c"]),
    "inventory": lambda v: Fraction((v["start"] - v["sold"] + v["received"]) * (100 - v["pct"]),
                                    100),
    "schedule_end": lambda v: 60 * v["_h"] + v["_m"] + sum(v["_tasks"]) + 2 * v["brk"],
    "trains_meet": lambda v: Fraction(v["d"], v["v1"] + v["v2"]),
    "fence_cost": lambda v: (2 * v["length"] + 2 * v["width"] - v["gate"]) * v["cost"],
    "cubes_in_box": lambda v: Fraction(np.prod(v["_dims"]), v["s"] ** 3),
    "overtime_pay": lambda v: v["rate"] * (40 + Fraction(3, 2) * (v["hours"] - 40)),
    "unit_price": lambda v: v["n1"] * v["n2"] * abs(Fraction(v["p1"], v["n1"])
                                                    - Fraction(v["p2"], v["n2"])),
    "ladder": lambda v: Fraction(int(round((v["c"] ** 2 - v["a"] ** 2) ** 0.5))),
    "fuel_cost": lambda v: Fraction(v["per100"] * v["dist"], 100) * v["_price"],
    "growth": lambda v: v["pop"] * Fraction(100 + v["pct"], 100) ** 2,
    "marbles": lambda v: Fraction(v["r"] * (v["r"] - 1), (v["r"] + v["b"] + v["g"])
                                  * (v["r"] + v["b"] + v["g"] - 1)),
    "mixture": lambda v: Fraction(v["a"] * v["x"] + v["b"] * v["y"], v["a"] + v["b"]),
}


def test_math_answers():
  assert set(ORACLES) == set(mathgen.TEMPLATES)
  rng = np.random.default_rng(1)
  for name in sorted(mathgen.TEMPLATES):
    for _ in range(25):
      p = mathgen.problem(rng, name)
      assert p.answer == ORACLES[name](p.values), (name, p.text)
      assert p.answer > 0, (name, p.text)
      for k, v in p.values.items():   # the problem states its numbers
        assert k.startswith("_") or str(v) in p.text, (name, k, p.text)
  for name in ("ladder", "ratio_share", "inventory", "growth", "cubes_in_box", "recipe_packages",
               "needed_score", "ages"):     # whole-number stories
    assert all(mathgen.problem(rng, name).answer.denominator == 1 for _ in range(25)), name


def _holds(clue, order):
  kind, a, b = clue
  i = order.index(a)
  return {"before": lambda: i < order.index(b), "right_before": lambda: i + 1 == order.index(b),
          "at": lambda: i == b, "not_at": lambda: i != b,
          "apart": lambda: abs(i - order.index(b)) > 1}[kind]()


def _models(premises, conclusion):
  """All 2^8 models of three sets (which of the 8 regions are non-empty): is the conclusion true
  wherever the premises are?"""
  regions = list(itertools.product([0, 1], repeat=3))    # membership in (A, B, C)
  idx = {"A": 0, "B": 1, "C": 2}

  def true(stmt, live):
    q, x, y = stmt
    both = [r for r in live if r[idx[x]] and r[idx[y]]]
    x_not_y = [r for r in live if r[idx[x]] and not r[idx[y]]]
    return {"all": not x_not_y, "no": not both, "some": bool(both), "some_not": bool(x_not_y)}[q]

  for mask in range(256):
    live = [r for k, r in enumerate(regions) if mask >> k & 1]
    if all(true(p, live) for p in premises) and not true(conclusion, live):
      return False
  return True


def _parse(sentence):
  s = sentence.strip(". ").replace("{", "").replace("}", "")
  words = s.split()
  q = words[0].lower()
  if "not" in words:
    return ("some_not", words[1], words[-1])
  return (q, words[1], words[-1])


def test_puzzles_have_unique_checked_answers():
  rng = np.random.default_rng(2)
  for p1, p2, concl, valid in puzzles.SYLLOGISMS:
    assert _models([_parse(p1), _parse(p2)], _parse(concl)) == valid, (p1, p2, concl)
  for _ in range(30):
    p = puzzles.ordering(rng)
    sols = [o for o in itertools.permutations(p.data["people"])
            if all(_holds(c, list(o)) for c in p.data["clues"])]
    assert [", ".join(s) for s in sols] == [p.answer]
    p = puzzles.knights(rng)
    assert len(puzzles.knights_solutions(p.data["statements"])) == 1
    p = puzzles.zebra(rng)
    assert p.data["worlds"] == 1 and p.answer in p.text
    p = puzzles.calendar(rng)
    if "days?" in p.text:
      assert p.answer == puzzles.WEEKDAYS[(p.data["start"] + p.data["days"]) % 7]
    else:
      assert p.answer == f"{datetime.date.fromisoformat(p.data['end']):%A}"
    p = puzzles.scheduling(rng)
    finish, order = puzzles.earliest_finish(**p.data)
    assert p.answer == f"{finish // 60}:{finish % 60:02d}"
    assert finish >= p.data["start"] + sum(p.data["durations"].values())


def test_knights_truth_table():
  # A: "B is a knave", B: "A and I are the same type" -> A knave? brute force by hand:
  # (A, B) = (T, F): A true ok; B says same(F vs T)=False, B knave ok -> consistent.
  # (F, T): A's claim "B knave" false, A knave ok; B claims same=False but B knight -> no.
  # (T, T): A claims B knave, false but A knight -> no. (F, F): A claim true but knave -> no.
  assert puzzles.knights_solutions([("knave", 1), ("same", 0)]) == [(True, False)]


# CLI --------------------------------------------------------------------------------------------

def _cli_error(capsys, *argv) -> str:
  with pytest.raises(SystemExit) as e:
    main(["train", "prompts", *argv])
  return str(e.value.code) + capsys.readouterr().err


def test_cli_errors(tmp_path, capsys):
  out = str(tmp_path / "c.jsonl.gz")
  msg = _cli_error(capsys, out, "--exclude", str(tmp_path / "missing.jsonl"))
  assert "--exclude file" in msg and "does not exist" in msg and "Traceback" not in msg
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "ok"}\n{not json\n')
  msg = _cli_error(capsys, out, "--exclude", str(bad))
  assert f"{bad}:2" in msg and "not valid JSON" in msg
  msg = _cli_error(capsys, out, "--num", "5")
  assert "--num must be at least" in msg
  msg = _cli_error(capsys, out, "--num", "0")
  assert "--include" in msg
  msg = _cli_error(capsys, str(tmp_path / "c.txt"))
  assert ".jsonl or .jsonl.gz" in msg
  assert not os.path.exists(out)



def test_magpie_cli_errors_before_loading_anything(tmp_path, capsys):
  from jspec.train.prompts import magpie
  with pytest.raises(ValueError, match="unknown families"):
    magpie.synthesize_families(None, None, str(tmp_path), per_family=3, families=["poetry"])
  with pytest.raises(ValueError, match="per-family"):
    magpie.synthesize_families(None, None, str(tmp_path), per_family=0)
  assert len({magpie.family_seed(0, f) for f in magpie.STEERED}) == len(magpie.STEERED)
