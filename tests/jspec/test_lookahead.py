"""Lookahead decoding: the n-gram pool and the candidate choice against plain-Python references,
the Jacobi window's attention layout, the window's n-grams against the target's own greedy
continuation, greedy identity and no recompilation on a tiny model, and option errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder, SpeculativeConfig, count_compiles, engine
from jspec.drafters.model_free.lookahead import LookaheadDrafter, LookaheadState, _pool_add
from models import KVCache, Llama, LlamaConfig


class PoolReference:
  """A round's n-grams are used at once: each distinct one is stamped clock + its last index;
  pooled ones take the new stamp, new ones (newest first) fill empty slots, then replace the
  entries with the oldest stamps from before this round; beyond that they are dropped."""

  def __init__(self, size):
    self.size, self.clock, self.entries = size, 0, {}

  def add(self, grams):
    last = {}
    for w, g in enumerate(grams):
      last[tuple(g)] = self.clock + w
    fresh = []
    for g, s in last.items():
      if g in self.entries:
        self.entries[g] = s
      else:
        fresh.append((s, g))
    for s, g in sorted(fresh, reverse=True):
      if len(self.entries) >= self.size:
        old = [(st, k) for k, st in self.entries.items() if st < self.clock]
        if not old:
          break
        del self.entries[min(old)[1]]
      self.entries[g] = s
    self.clock += len(grams)

  def choose(self, last_token, candidates, draft_len):
    keyed = sorted(((s, g) for g, s in self.entries.items() if g[0] == last_token),
                   reverse=True)[:candidates]
    if not keyed:
      return []
    conts = [g[1:1 + draft_len] for _, g in keyed]

    def score(v):
      return sum(sum(1 for k in range(1, draft_len + 1) if u[:k] == v[:k]) for u in conts)

    best = max(range(len(conts)), key=lambda i: (score(conts[i]), -i))
    return list(conts[best])


def _device_entries(state, row):
  pool, stamp = np.asarray(state.pool[row]), np.asarray(state.stamp[row])
  return {tuple(pool[i].tolist()): int(stamp[i]) for i in range(len(stamp)) if stamp[i] >= 0}


def _empty(b, n, g, w):
  return LookaheadState(jnp.zeros((b, n - 1, w), jnp.int32), jnp.zeros((b, g, n), jnp.int32),
                        jnp.full((b, g), -1, jnp.int32), jnp.zeros((b,), jnp.int32))


@pytest.mark.parametrize("n, g, w", [(2, 4, 4), (3, 6, 3), (4, 16, 5)])
def test_pool_matches_reference(n, g, w):
  rng = np.random.default_rng(n * 100 + g)
  b = 5
  add = jax.jit(jax.vmap(_pool_add))
  state = _empty(b, n, g, w)
  refs = [PoolReference(g) for _ in range(b)]
  evicted = 0
  for _ in range(30):
    grams = rng.integers(0, 3, (b, w, n))     # small alphabet: repeats within and across rounds
    state = add(state, jnp.asarray(grams, jnp.int32), jnp.ones((b, w), bool))
    for r in range(b):
      before = len(refs[r].entries)
      refs[r].add(grams[r].tolist())
      evicted += before + w > g
      assert _device_entries(state, r) == refs[r].entries
  assert evicted > 10


def test_prompt_seeds_the_pool_like_the_reference():
  rng = np.random.default_rng(1)
  drafter = LookaheadDrafter(3, window=3, ngram=3, pool_size=8, candidates=4)
  b, p = 4, 30
  prompt = rng.integers(0, 4, (b, p))
  plen = np.asarray([30, 2, 17, 9])
  ctx = _ctx(prompt, plen)
  state = drafter.init_state(None, jnp.asarray(prompt, jnp.int32), ctx, 64)
  for r in range(b):
    ref = PoolReference(8)
    toks = prompt[r, :plen[r]].tolist()
    grams = [toks[i:i + 3] for i in range(len(toks) - 2)]
    ref.add(grams)
    want = dict(ref.entries)
    got = _device_entries(state, r)
    assert got == want      # stamps: the index among the bucket's p - n + 1 n-grams
  assert int(state.clock[0]) == p - 2


def _ctx(tokens, lens):
  from jspec.drafters.base import Context
  from jspec.sampling import SamplingParams
  b = tokens.shape[0]
  return Context(tokens=jnp.asarray(tokens, jnp.int32), length=jnp.asarray(lens, jnp.int32),
                 prompt_len=jnp.asarray(lens, jnp.int32), sampling=SamplingParams.make(b))


@pytest.mark.parametrize("d, n, v", [(3, 4, 7), (2, 4, 3), (4, 3, 16)])
def test_choice_matches_reference(d, n, v):
  rng = np.random.default_rng(d * 10 + v)
  g, w, b = 16, 4, 6
  drafter = LookaheadDrafter(d, window=w, ngram=n, pool_size=g, candidates=v)
  add = jax.jit(jax.vmap(_pool_add))
  state = _empty(b, n, g, w)
  refs = [PoolReference(g) for _ in range(b)]
  drafted = 0
  for _ in range(15):
    grams = rng.integers(0, 3, (b, w, n))
    grams[:, :, 1:] = rng.integers(0, 2, (b, w, n - 1))   # agreeing continuations
    state = add(state, jnp.asarray(grams, jnp.int32), jnp.ones((b, w), bool))
    toks = rng.integers(0, 4, (b, 5))
    draft, _ = drafter.propose(None, state, _ctx(toks, [5] * b), None)
    for r in range(b):
      refs[r].add(grams[r].tolist())
      want = refs[r].choose(int(toks[r, 4]), v, min(n - 1, d))
      got_len = int(draft.length[r])
      assert np.asarray(draft.tokens[r, :got_len]).tolist() == want
      drafted += got_len
  assert drafted > 100


def test_window_columns_are_contiguous_trajectories():
  """Every window token sees exactly one token at each offset 1 .. its own (a sequence), and
  level l of column c sits at offset 1 + c + l on the diagonal of its column."""
  drafter = LookaheadDrafter(3, window=4, ngram=4)
  offsets, mask = drafter._window_layout()
  w = 4
  for i in range(len(offsets)):
    seen = sorted(offsets[mask[i]].tolist())
    assert seen == list(range(1, offsets[i] + 1)), (i, seen)
    lvl, col = divmod(i, w)
    assert offsets[i] == 1 + col + lvl
    assert all(offsets[j] <= offsets[i] for j in np.flatnonzero(mask[i]))


CFG = LlamaConfig.tiny()


@pytest.fixture(scope="module")
def tiny():
  model = Llama(CFG, rngs=nnx.Rngs(4))
  model.embed.embedding[...] = model.embed.embedding[...] * 4.0   # peaked next-token choices
  return model


def test_window_ngrams_are_the_targets_greedy_continuations(tiny):
  """After a round, each column's new top-level token is the target's argmax after the column's
  trajectory (committed prefix + level 0 up to the column + the column's upper levels), computed
  here by a plain forward over that sequence."""
  sd = SpecDecoder(tiny, {"method": "lookahead", "num_speculative_tokens": 3, "window": 4,
                          "ngram": 4})
  rng = np.random.default_rng(2)
  prompts = [rng.integers(1, CFG.vocab_size, n).tolist() for n in (9, 6)]
  state, sampling = sd.prefill(prompts, max_new_tokens=20, eos=False)
  checked = 0
  for _ in range(3):
    lv = np.asarray(state.drafter_state.levels)                                  # [B, 3, W]
    tokens, length = np.asarray(state.tokens), np.asarray(state.length)
    state = engine.spec_round(sd.graphdef, sd.weights, sd.drafter, sd.drafter_params, state,
                              sampling, eos_ids=())
    out = np.asarray(state.drafter_state.levels[:, -1])                        # [B, W]
    for r in range(len(prompts)):
      prefix = tokens[r, :length[r]].tolist()
      for c in range(4):
        seq = prefix + lv[r, 0, :c + 1].tolist() + lv[r, 1:, c].tolist()
        logits = tiny(jnp.asarray([seq]), KVCache.init(CFG, 1, 64)).logits[0, -1]
        top2 = np.sort(np.asarray(logits))[-2:]
        if top2[1] - top2[0] > 1e-4:
          assert out[r, c] == int(jnp.argmax(logits)), (r, c)
          checked += 1
  assert checked >= 20


def test_greedy_identity_and_no_recompilation(tiny):
  rng = np.random.default_rng(3)
  prompts = [rng.integers(1, CFG.vocab_size, n).tolist() for n in (7, 12, 4)]
  kw = dict(max_new_tokens=60, eos=False)
  plain = Decoder(tiny).generate(prompts, **kw).token_ids
  sd = SpecDecoder(tiny, {"method": "lookahead", "num_speculative_tokens": 3, "window": 3,
                          "pool_size": 16})
  first = sd.generate(prompts, **kw)
  assert first.token_ids == plain
  with count_compiles() as c:
    again = sd.generate([p[::-1] for p in prompts], temperature=[0.0, 1.0, 0.7], seed=4, **kw)
  assert c.count == 0 and again.rounds > 0
  assert again.token_ids[0] == Decoder(tiny).generate([prompts[0][::-1]], **kw).token_ids[0]


def test_extras_leave_committed_state_unchanged(tiny):
  """With the window's tokens run in the same forward, the chain's logits equal a forward of the
  chain alone (the window is invisible to it) up to float reassociation."""
  sd = SpecDecoder(tiny, {"method": "lookahead", "num_speculative_tokens": 2, "window": 3})
  rng = np.random.default_rng(5)
  state, sampling = sd.prefill([rng.integers(1, CFG.vocab_size, 8).tolist()], max_new_tokens=8,
                               eos=False)
  model = nnx.merge(sd.graphdef, sd.weights)
  draft, _ = sd.drafter.propose(None, state.drafter_state, state.context(sampling), None)
  block = jnp.concatenate([state.tokens[:, state.length[0] - 1:state.length[0]], draft.tokens], 1)
  alone = model(block, state.cache).logits
  with_extras, _ = engine.verify_with_extras(model, sd.drafter, state, block, draft.extra)
  np.testing.assert_allclose(np.asarray(with_extras.logits[:, :3]), np.asarray(alone),
                             atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cfg, message", [
    ({"window": 0}, "window must be an integer >= 1"),
    ({"ngram": 1}, "ngram must be an integer >= 2"),
    ({"pool_size": 2, "window": 5}, r"pool_size \(2\) must be >= window \(5\)"),
    ({"candidates": 1000}, r"candidates \(1000\) must be <= pool_size \(512\)"),
    ({"window": 20, "ngram": 6}, "window tokens per verify is over 64"),
    ({"pool_from_prompt": "yes"}, "pool_from_prompt must be true or false"),
])
def test_bad_options_fail_before_compiling(cfg, message):
  with count_compiles() as c:
    with pytest.raises(ValueError, match=message):
      SpeculativeConfig.from_dict({"method": "lookahead", "num_speculative_tokens": 3, **cfg})
  assert c.count == 0


def test_default_ngram_follows_d():
  from jspec.drafters import registry
  entry = registry.get("lookahead")
  for d, n in ((1, 2), (3, 4), (7, 5)):
    drafter, _ = entry.build(entry.options(), d, None)
    assert drafter.ngram == n and drafter.num_extra == 5 * (n - 1)
