"""Per-row draft lengths (`per_row: True`, jspec/adaptive.py `row_widths`): the split of a round's
drafts between the rows against brute force, rows of different widths in one packed verify of the
real round equal to plain greedy decoding, host and in-round choice equal, no recompiles.
Losslessness with rows of different widths is in test_lossless_montecarlo.py (ngram-auto-rows)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder, count_compiles, engine
from jspec.adaptive import AdaptiveDrafter, draft_ranks
from jspec.costs import CostTable
from models import Llama, LlamaConfig

CFG = LlamaConfig.tiny()
COSTS = CostTable({1: {1: 1.0, 2: 1.05, 4: 1.1}, 4: {1: 1.0, 2: 1.1, 4: 1.2, 8: 1.5, 16: 2.2}})


@pytest.fixture(scope="module")
def tiny():
  return Llama(CFG, rngs=nnx.Rngs(5))


def _prompts(seed, lengths, repeat=1):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, CFG.vocab_size, n).tolist() * repeat for n in lengths]


def test_the_split_is_the_best_one_by_brute_force():
  """For random estimates, proposal counts and live rows, the rows' widths under a budget of n
  drafts (positions ranked below n) are prefixes whose expected accepted drafts equal the best of
  every split of at most n drafts."""
  rng = np.random.default_rng(0)
  b, d = 3, 4
  for trial in range(30):
    est = rng.uniform(0.05, 1.0, (b, d)).astype(np.float32)
    if trial % 3 == 0:
      est[0] = est[1]                                       # ties between rows
    draft_len = rng.integers(0, d + 1, b)
    live = rng.uniform(size=b) < 0.8
    ranks = np.asarray(draft_ranks(jnp.asarray(est), jnp.asarray(draft_len, jnp.int32),
                                   jnp.asarray(live)))
    reach = np.cumprod(est, axis=1)
    value = lambda w: sum(reach[r, :w[r]].sum() for r in range(b))
    for n in range(b * d + 1):
      taken = ranks < n
      w = taken.sum(axis=1)
      assert all(taken[r, :w[r]].all() for r in range(b))                 # a prefix per row
      usable = np.minimum(w, np.where(live, draft_len, 0))
      best = max(value(v) for v in itertools.product(*[range(dl + 1) if lv else [0]
                                                       for dl, lv in zip(draft_len, live)])
                 if sum(v) <= n)
      assert value(usable) == pytest.approx(best, rel=1e-5), (trial, n)


def test_row_widths_use_the_batch_budget_and_one_row_keeps_the_length():
  from jspec.drafters.model_free.ngram import NgramDrafter
  w = AdaptiveDrafter(NgramDrafter(4), lengths=(0, 1, 2, 4), per_row=True)
  assert [w.block_width(k, 3) for k in range(4)] == [0, 3, 4, 4]
  assert [w.packed_tokens(k, 3) for k in range(4)] == [None, 6, 9, None]
  assert [w.block_width(k, 1) for k in range(4)] == [0, 1, 2, 4]
  assert all(w.packed_tokens(k, 1) is None for k in range(4))
  flat = AdaptiveDrafter(NgramDrafter(4), lengths=(0, 1, 2, 4))
  assert [flat.block_width(k, 3) for k in range(4)] == [0, 1, 2, 4]
  assert all(flat.packed_tokens(k, 3) is None for k in range(4))


def test_per_row_config_errors(tiny):
  with pytest.raises(ValueError, match="per_row splits adaptive"):
    SpecDecoder(tiny, {"method": "ngram", "num_speculative_tokens": 3, "per_row": True})
  with pytest.raises(ValueError, match="per_row must be"):
    SpecDecoder(tiny, {"method": "ngram", "num_speculative_tokens": "auto", "per_row": "yes"})
  with pytest.raises(ValueError, match="per_row needs a chain drafter"):
    SpecDecoder(tiny, {"method": "lookahead", "num_speculative_tokens": "auto", "per_row": True})


def test_rows_verify_different_widths_and_match_plain_greedy(tiny):
  """A batch of two repetitive and two random prompts: rounds give the rows different widths
  (their per-row draft counts differ within a round, their sum within the round's budget), the
  tokens equal plain greedy decoding, host and in-round choices agree greedy and sampled, and a
  second call compiles nothing."""
  cfg = {"method": "ngram", "num_speculative_tokens": "auto", "draft_lengths": [0, 1, 2, 4],
         "per_row": True}
  host, dev = (SpecDecoder(tiny, cfg, time_rounds=False, choice=c, cost_table=COSTS)
               for c in ("host", "device"))
  prompts = _prompts(0, [5, 7], repeat=4) + _prompts(1, [9, 12])
  want = Decoder(tiny).generate(prompts, max_new_tokens=30, eos=False).token_ids
  # rounds by hand (the in-round program): per-row drafts verified in each round
  state, sampling = dev.prefill(prompts, max_new_tokens=30, eos=False, pad_to=32)
  lengths = dev.drafter.lengths
  mixed = 0
  while not bool(np.all(np.asarray(state.done))):
    before, chosen = np.asarray(state.metrics.drafted), np.asarray(state.drafter_state.chosen)
    live = ~np.asarray(state.done)
    state = engine.spec_round(dev.graphdef, dev.weights, dev.drafter, dev.drafter_params, state,
                              sampling, eos_ids=())
    k = int(np.flatnonzero(np.asarray(state.drafter_state.chosen) - chosen)[0])
    drafted = (np.asarray(state.metrics.drafted) - before)[live]
    assert drafted.sum() <= len(prompts) * lengths[k]
    mixed += len(set(drafted.tolist())) > 1 and drafted.max() > lengths[k]
  assert mixed > 0
  for t in (0.0, 0.9):
    a = host.generate(prompts, max_new_tokens=30, eos=False, temperature=t, seed=3, pad_to=32)
    b = dev.generate(prompts, max_new_tokens=30, eos=False, temperature=t, seed=3, pad_to=32)
    assert a.token_ids == b.token_ids and a.verified_lengths == b.verified_lengths, t
    if t == 0.0:
      assert a.token_ids == want
  with count_compiles() as c:
    host.generate(_prompts(2, [6, 8, 11, 4]), max_new_tokens=30, eos=False, pad_to=32)
  assert c.count == 0
