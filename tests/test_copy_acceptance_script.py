"""benchmarks/scripts/copy_acceptance.py applies the n-gram drafter's own rule: its per-position
drafts equal NgramDrafter.propose (the jitted library code) on random token rows with repeats."""

import jax.numpy as jnp
import numpy as np

from jspec.drafters.base import Context
from jspec.drafters.model_free.ngram import NgramDrafter
from jspec.sampling import SamplingParams
from tests.scripts import load_script


def _script():
  return load_script("copy_acceptance")


def test_drafts_equal_the_ngram_drafter():
  script, d, s = _script(), 3, 64
  rng = np.random.default_rng(0)
  row = rng.integers(0, 3, s).tolist()             # a small alphabet: many matches of every n
  got = script.drafts(row, 4, d)
  ng = NgramDrafter(d, 1, 4)
  lengths = jnp.arange(1, s, dtype=jnp.int32)
  tokens = jnp.broadcast_to(jnp.asarray(row, jnp.int32), (s - 1, s))
  ctx = Context(tokens=tokens, length=lengths, prompt_len=lengths,
                sampling=SamplingParams.make(s - 1))
  draft, _ = ng.propose(None, (), ctx, None)
  n_seen = set()
  for p, (n, want) in enumerate(got, start=1):
    k = int(draft.length[p - 1])
    assert list(np.asarray(draft.tokens[p - 1, :k])) == want, p
    n_seen.add(n)
  assert n_seen == {0, 1, 2, 3, 4}


def test_acceptance_counts_reply_positions_only(tmp_path):
  script = _script()
  toks = np.asarray([7, 1, 2, 3, 1, 2, 3, 1, 2], np.int32)
  mask = np.asarray([0, 0, 0, 0, 1, 1, 1, 1, 1], np.uint8)
  path = tmp_path / "shard_00000.npz"
  np.savez(path, tokens=toks, offsets=np.asarray([0, len(toks)]), loss_mask=mask)
  out = script.measure([str(path)], 4, 3)
  assert out["reply_positions"] == 5
  # position 4 (after 7 1 2 3): 1-gram "3"? never before -> no match; later positions copy
  rows = out["by_matched_n"]
  assert rows["0"]["positions"] == 1 and sum(r["positions"] for r in rows.values()) == 5
  assert all(rows[n]["first_accepted"] == 1.0 for n in rows if n != "0" and rows[n]["positions"])
