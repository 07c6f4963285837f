"""Suffix decoding: the on-device matcher against a plain-Python suffix tree (and a brute-force
reference for the capped candidate count), the global cache across generate calls (bounded, oldest
evicted, no recompilation), and option errors before any compilation."""

import math
from collections import Counter

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder, SpeculativeConfig, count_compiles
from jspec.drafters.base import Context
from jspec.drafters.model_free.suffix import (SEP, SuffixCache, SuffixDrafter, pack_cache,
                                              unpack_cache)
from jspec.sampling import SamplingParams
from models import Llama, LlamaConfig

F32 = np.float32


class SuffixTree:
  """A depth-limited suffix trie with counts: node(P).count = occurrences of P, its children the
  tokens that follow them (the structure SuffixDecoding keeps per request and globally)."""

  def __init__(self, depth):
    self.depth = depth
    self.root = {"count": 0, "kids": {}}

  def add(self, seq):
    for i in range(len(seq)):
      node = self.root
      for t in seq[i:i + self.depth]:
        node = node["kids"].setdefault(t, {"count": 0, "kids": {}})
        node["count"] += 1

  def find(self, pattern):
    node = self.root
    for t in pattern:
      node = node["kids"].get(t)
      if node is None:
        return None
    return node


def tree_draft(tree, context, d, depth, factor, offset, min_prob):
  """SuffixDecoding's path speculation (float32 arithmetic, the device's order of operations):
  for each match length, follow the most frequent child (ties: smallest token) while the path
  probability stays >= min_prob; keep the best score (ties: the longer match)."""
  best = (F32(0), [])
  for m in range(1, min(depth, len(context)) + 1):
    node = tree.find(context[-m:])
    if node is None:
      break
    limit = min(d, math.floor(factor * m + offset))
    path, prob, score = [], F32(1), F32(0)
    while len(path) < limit and node["kids"]:
      tok, kid = max(node["kids"].items(), key=lambda kv: (kv[1]["count"], -kv[0]))
      p = F32(prob * F32(kid["count"])) / F32(node["count"])
      if p < F32(min_prob):
        break
      prob, score = p, F32(score + p)
      path.append(tok)
      node = kid
    if score >= best[0]:
      best = (score, path)
  return best


def capped_draft(hist, context, own, d, depth, factor, offset, min_prob, cap):
  """Brute force with the device's candidate cap: only the `cap` positions with the longest
  context match (then the most recent) are counted. own: hist is the row's own history."""
  n = len(hist)
  ends = range(n - 1) if own else range(n)
  match = {}
  for e in ends:
    k = 0
    while k < min(depth, len(context)) and e - k >= 0 and hist[e - k] == context[-1 - k]:
      k += 1
    match[e] = k
  cands = sorted(ends, key=lambda e: (match[e], e), reverse=True)[:cap]
  best = (F32(0), [])
  for m in range(1, depth + 1):
    members = [e for e in cands if match[e] >= m]
    if not members:
      continue
    total = len(members) + (1 if own else 0)
    limit = min(d, math.floor(factor * m + offset))
    path, prob, score = [], F32(1), F32(0)
    while len(path) < limit:
      k = len(path)
      nxt = [hist[e + 1 + k] for e in members if e + 1 + k < n and hist[e + 1 + k] != SEP]
      if not nxt:
        break
      tok, c = max(Counter(nxt).items(), key=lambda kv: (kv[1], -kv[0]))
      p = F32(prob * F32(c)) / F32(total)
      if p < F32(min_prob):
        break
      prob, score = p, F32(score + p)
      path.append(tok)
      members = [e for e in members if e + 1 + k < n and hist[e + 1 + k] == tok]
      total = len(members)
    if score >= best[0]:
      best = (score, path)
  return best


def _propose(drafter, params, toks, lens):
  b = toks.shape[0]
  ctx = Context(tokens=jnp.asarray(toks, jnp.int32), length=jnp.asarray(lens, jnp.int32),
                prompt_len=jnp.asarray(lens, jnp.int32), sampling=SamplingParams.make(b))
  draft, _ = drafter.propose(params, (), ctx, None)
  return np.asarray(draft.tokens), np.asarray(draft.length)


@pytest.mark.parametrize("d, depth, factor, offset, min_prob", [
    (4, 6, 1.0, 0.0, 0.1), (6, 3, 2.0, 0.0, 0.0), (3, 8, 0.5, 1.0, 0.3)])
def test_row_history_matches_suffix_tree(d, depth, factor, offset, min_prob):
  rng = np.random.default_rng(depth)
  s, b = 48, 6
  drafter = SuffixDrafter(d, depth, factor, offset, min_prob, max_candidates=s, cache_tokens=0)
  drafted = 0
  for trial in range(12):
    lens = rng.integers(1, s + 1, b)
    toks = rng.integers(0, 2 + trial % 4, (b, s))    # small alphabets: many repeats
    got, got_len = _propose(drafter, None, toks, lens)
    for r in range(b):
      hist = toks[r, :lens[r]].tolist()
      tree = SuffixTree(depth + d)
      tree.add(hist)
      _, want = tree_draft(tree, hist, d, depth, factor, offset, min_prob)
      assert got[r, :got_len[r]].tolist() == want, (hist, got[r], got_len[r], want)
      drafted += len(want)
  assert drafted > 50


def test_global_cache_matches_suffix_tree_and_wins_on_score():
  rng = np.random.default_rng(7)
  d, depth, cap = 5, 6, 96
  drafter = SuffixDrafter(d, depth, 1.0, 0.0, 0.1, max_candidates=cap, cache_tokens=cap)
  wins = 0
  for trial in range(10):
    entries = [rng.integers(0, 4, rng.integers(3, 20)).tolist() for _ in range(6)]
    packed = pack_cache(entries, cap)
    kept = unpack_cache(packed)
    b, s = 5, 24
    lens = rng.integers(1, s + 1, b)
    toks = rng.integers(0, 4, (b, s))
    got, got_len = _propose(drafter, SuffixCache(jnp.asarray(packed)), toks, lens)
    gtree = SuffixTree(depth + d)
    for e in kept:
      gtree.add(e)
    for r in range(b):
      hist = toks[r, :lens[r]].tolist()
      own = SuffixTree(depth + d)
      own.add(hist)
      s_own, p_own = tree_draft(own, hist, d, depth, 1.0, 0.0, 0.1)
      s_glob, p_glob = tree_draft(gtree, hist, d, depth, 1.0, 0.0, 0.1)
      want = p_glob if s_glob > s_own else p_own
      wins += s_glob > s_own
      assert got[r, :got_len[r]].tolist() == want
  assert wins > 5


@pytest.mark.parametrize("cap", [1, 3, 8])
def test_capped_candidates_match_brute_force(cap):
  rng = np.random.default_rng(cap)
  d, depth = 4, 5
  drafter = SuffixDrafter(d, depth, 1.0, 0.0, 0.05, max_candidates=cap, cache_tokens=0)
  for _ in range(10):
    b, s = 6, 40
    lens = rng.integers(1, s + 1, b)
    toks = rng.integers(0, 3, (b, s))
    got, got_len = _propose(drafter, None, toks, lens)
    for r in range(b):
      hist = toks[r, :lens[r]].tolist()
      _, want = capped_draft(hist, hist, True, d, depth, 1.0, 0.0, 0.05, cap)
      assert got[r, :got_len[r]].tolist() == want


def test_pack_cache_keeps_the_newest_entries():
  assert unpack_cache(pack_cache([[1, 2, 3], [4, 5], [6, 7, 8, 9]], 9)) == [[4, 5], [6, 7, 8, 9]]
  assert unpack_cache(pack_cache([[1] * 20], 6)) == [[1] * 5]
  assert pack_cache([], 4).tolist() == [SEP] * 4


CFG = LlamaConfig.tiny()


@pytest.fixture(scope="module")
def tiny():
  return Llama(CFG, rngs=nnx.Rngs(3))


def test_global_cache_persists_across_calls_without_recompiling(tiny):
  """The second run of the same prompts drafts from the first run's outputs (global cache), with
  no recompilation although the cache changed; outputs stay plain decoding's."""
  rng = np.random.default_rng(0)
  prompts = [rng.integers(1, CFG.vocab_size, n).tolist() for n in (7, 11)]
  kw = dict(max_new_tokens=40, eos=False)
  plain = Decoder(tiny).generate(prompts, **kw).token_ids
  sd = SpecDecoder(tiny, {"method": "suffix", "num_speculative_tokens": 4, "cache_tokens": 256})
  empty = np.asarray(sd.drafter_params.tokens).copy()
  first = sd.generate(prompts, **kw)
  cached = np.asarray(sd.drafter_params.tokens)
  assert unpack_cache(cached) == first.token_ids and not np.array_equal(cached, empty)
  with count_compiles() as c:
    second = sd.generate(prompts, **kw)
    third = sd.generate(prompts[::-1], seed=5, temperature=[0.0, 1.0], **kw)
  assert c.count == 0
  assert first.token_ids == second.token_ids == plain
  assert third.token_ids[0] == plain[1]            # the greedy row
  assert second.acceptance_length > first.acceptance_length + 1.0
  assert len(unpack_cache(sd.drafter_params.tokens)) == 6         # 3 calls x 2 rows, all fit
  sd.reset_drafter()
  assert np.array_equal(np.asarray(sd.drafter_params.tokens), empty)


def test_cache_evicts_oldest(tiny):
  sd = SpecDecoder(tiny, {"method": "suffix", "num_speculative_tokens": 2, "cache_tokens": 64})
  outs = []
  for seed in range(4):
    rng = np.random.default_rng(seed)
    outs += sd.generate([rng.integers(1, CFG.vocab_size, 5).tolist()], max_new_tokens=20,
                        eos=False).token_ids
  assert unpack_cache(sd.drafter_params.tokens) == outs[-3:]     # 3 x (20 + 1) fit in 64


@pytest.mark.parametrize("cfg, message", [
    ({"max_tree_depth": 0}, r"max_tree_depth must be an integer in \[1, 256\]"),
    ({"max_spec_factor": 0}, "max_spec_factor must be a number > 0"),
    ({"min_token_prob": 1.5}, r"min_token_prob must be in \[0, 1\]"),
    ({"max_candidates": 5000}, r"max_candidates must be an integer in \[1, 1024\]"),
    ({"cache_tokens": -3}, "cache_tokens must be 0"),
    ({"cache_tokens": "big"}, "cache_tokens must be 0"),
    ({"max_tree_depth": 2.5, "min_token_prob": -1},
     "max_tree_depth must be an integer.*; min_token_prob must be"),
])
def test_bad_options_fail_before_compiling(cfg, message):
  with count_compiles() as c:
    with pytest.raises(ValueError, match=message):
      SpeculativeConfig.from_dict({"method": "suffix", "num_speculative_tokens": 3, **cfg})
  assert c.count == 0
