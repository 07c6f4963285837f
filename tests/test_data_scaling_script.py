"""benchmarks/scripts/data_scaling.py: the figure's JSON keeps each replay file's numbers, sorted by
reply tokens, and files replayed with other settings are refused."""
import json

import pytest

from tests.scripts import load_script


def _script():
  return load_script("data_scaling")


def _replay(path, als, num_draft=5):
  cats = {c: {"acceptance_length": a, "rounds": 10, "per_position_acceptance": [a - 1, 0.0]}
          for c, a in als.items()}
  with open(path, "w") as f:
    json.dump(dict(head=str(path), prompts="suite.jsonl", num_draft=num_draft, max_new_tokens=128,
                   per_category=16, categories=cats), f)
  return str(path)


def test_points_keep_the_replayed_numbers_in_token_order(tmp_path):
  big = _replay(tmp_path / "big.json", {"math": 1.8, "writing": 1.4, "all": 1.6})
  small = _replay(tmp_path / "small.json", {"math": 1.5, "writing": 1.2, "all": 1.3})
  base = _replay(tmp_path / "base.json", {"math": 1.6, "writing": 1.3, "all": 1.45})
  out = tmp_path / "out.json"
  _script().main(["--point", f"500000:{big}", "--point", f"100000:{small}",
                  "--baseline", f"shipped:{base}", "--json", str(out)])
  d = json.loads(out.read_text())
  assert [p["reply_tokens"] for p in d["points"]] == [100000, 500000]
  assert d["points"][0]["al"] == {"math": 1.5, "writing": 1.2, "all": 1.3}
  assert d["points"][1]["al"]["math"] == 1.8
  assert d["baselines"][0]["name"] == "shipped" and d["baselines"][0]["al"]["all"] == 1.45


def test_files_replayed_with_other_settings_are_refused(tmp_path):
  a = _replay(tmp_path / "a.json", {"all": 1.3})
  b = _replay(tmp_path / "b.json", {"all": 1.4}, num_draft=3)
  with pytest.raises(SystemExit, match="other settings"):
    _script().main(["--point", f"1:{a}", "--point", f"2:{b}", "--json", str(tmp_path / "o.json")])


@pytest.mark.parametrize("spec", ["abc", "x:file.json"])
def test_a_malformed_point_says_what_it_takes(tmp_path, spec):
  with pytest.raises(SystemExit, match="REPLY_TOKENS:FILE|KEY:FILE"):
    _script().main(["--point", spec, "--json", str(tmp_path / "o.json")])


def test_continued_heads_and_previous_points(tmp_path):
  """--continued points form their own series after the from-scratch ones; --previous keeps an
  earlier output's points and baselines unless a file is given again."""
  small = _replay(tmp_path / "small.json", {"math": 1.5, "all": 1.3})
  base = _replay(tmp_path / "base.json", {"math": 1.6, "all": 1.45})
  first = tmp_path / "first.json"
  _script().main(["--point", f"100000:{small}", "--baseline", f"old:{base}", "--json", str(first)])
  (tmp_path / "small.json").unlink()                  # the replay file is gone
  more = _replay(tmp_path / "more.json", {"math": 2.0, "all": 1.9})
  out = tmp_path / "out.json"
  _script().main(["--continued", f"900000:{more}", "--previous", str(first), "--json", str(out),
                  "--plot", str(tmp_path / "fig.png")])
  d = json.loads(out.read_text())
  assert [(p["series"], p["reply_tokens"]) for p in d["points"]] == [("scratch", 100000),
                                                                    ("continued", 900000)]
  assert d["points"][0]["al"]["math"] == 1.5 and d["points"][1]["al"]["all"] == 1.9
  assert [b["name"] for b in d["baselines"]] == ["old"]
  assert (tmp_path / "fig.png").stat().st_size > 0
  other = _replay(tmp_path / "other.json", {"all": 1.0}, num_draft=3)
  with pytest.raises(SystemExit, match="other settings"):
    _script().main(["--continued", f"1:{other}", "--previous", str(first),
                    "--json", str(tmp_path / "o.json")])
