"""benchmarks/scripts/unseen_prompts.py: the picked prompts are the first unused ones of each
family, none of them in the data folder, and too few unseen prompts is an error."""
import gzip
import json

import numpy as np
import pytest

from tests.scripts import load_script


def _script():
  return load_script("unseen_prompts")


def test_picks_the_first_unused_prompts_of_each_family(tmp_path):
  script = _script()
  corpus = tmp_path / "corpus.jsonl.gz"
  rows = [dict(id=f"{fam}-{i}", category=fam, messages=[{"role": "user", "content": str(i)}])
          for i in range(6) for fam in ("math", "coding")]
  with gzip.open(corpus, "wt") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  data = tmp_path / "data"
  data.mkdir()
  np.savez(data / "shard_00000.npz", prompt_ids=np.asarray(["math-0", "math-2", "coding-1"]))
  used = script.used_ids(str(data))
  got = script.unseen(str(corpus), used, ["math", "coding"], 3)
  assert [r["id"] for r in got] == ["math-1", "math-3", "math-4", "coding-0", "coding-2",
                                    "coding-3"]
  with pytest.raises(SystemExit, match=r"too few unseen prompts .* math \(4\)"):
    script.unseen(str(corpus), used, ["math"], 5)
