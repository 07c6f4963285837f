"""The copy-or-learned hybrid on a tiny random target with a tiny EAGLE-3 head: each row's draft is
the n-gram drafter's own draft where it proposes and the head's own draft elsewhere (against both
drafters run alone), the head's propose is skipped when every row copies, greedy outputs equal
plain decoding at a fixed and an adaptive length and over EAGLE-2 trees (a copied chain drafted as
a tree) without recompiling, and bad options fail with the option named. Losslessness: test_lossless_exact (the real hybrid in the enumeration) and
test_lossless_montecarlo (sampled head drafts through the real round)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder, SpeculativeConfig, count_compiles
from jspec.drafters.base import Context
from jspec.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head
from jspec.drafters.hybrid import HybridDrafter
from jspec.drafters.model_free.ngram import NgramDrafter
from jspec.sampling import SamplingParams
from models import Llama, LlamaConfig

CFG = LlamaConfig.tiny(vocab_size=16, num_layers=2)
D = 3


@pytest.fixture(scope="module")
def target():
  model = Llama(CFG, rngs=nnx.Rngs(0))
  model.embed.embedding[...] = model.embed.embedding[...] * 6.0
  return model


@pytest.fixture(scope="module")
def head():
  cfg = Eagle3Config.for_target(CFG, draft_vocab_size=CFG.vocab_size, taps=(0, 1, 1))
  head = Eagle3Head(cfg, rngs=nnx.Rngs(2))
  head.lm_head.kernel[...] = head.lm_head.kernel[...] * 6.0
  head.draft_to_target[...] = jnp.arange(CFG.vocab_size, dtype=jnp.int32)
  return head


# row 0 ends with a 2-gram seen before (copy), row 1 has no repeated token at all (the head)
PROMPTS = [[5, 7, 9, 2, 11, 5, 7], [1, 2, 3, 4, 6, 8, 10]]


def _prefilled(target, head, temperature):
  sd = SpecDecoder(target, {"method": "hybrid", "num_speculative_tokens": D},
                   draft_model=head, time_rounds=False)
  state, sampling = sd.prefill(PROMPTS, max_new_tokens=8, temperature=temperature)
  return sd, state, sampling


def _context(state, sampling, rows):
  """The round's context with the committed tokens replaced by `rows` (the n-gram reads them; the
  head reads its own state)."""
  ctx = state.context(sampling)
  tokens = ctx.tokens.at[:, :len(rows[0])].set(jnp.asarray(rows, jnp.int32))
  return dataclasses.replace(ctx, tokens=tokens, length=jnp.full_like(ctx.length, len(rows[0])))


def test_each_row_takes_the_copy_draft_where_it_matches_and_the_head_elsewhere(target, head):
  sd, state, sampling = _prefilled(target, head, 1.0)
  hybrid, params = sd.drafter, sd.drafter_params
  assert isinstance(hybrid, HybridDrafter)
  ctx = _context(state, sampling, PROMPTS)
  keys = jnp.stack([jax.random.key(1), jax.random.key(2)])
  draft, new = hybrid.propose(params, state.drafter_state, ctx, keys)
  copy, _ = hybrid.copy.propose(None, (), ctx, keys)
  alone, alone_state = hybrid.learned.propose(params["learned"], state.drafter_state.learned,
                                              ctx, keys)
  copy_len = np.asarray(copy.length)
  assert copy_len[0] > 0 and copy_len[1] == 0       # the fixture's premise
  np.testing.assert_array_equal(draft.tokens[0], copy.tokens[0])
  np.testing.assert_array_equal(draft.tokens[1], alone.tokens[1])
  assert np.asarray(draft.length).tolist() == [copy_len[0], D]
  np.testing.assert_array_equal(draft.q[0], jax.nn.one_hot(copy.tokens[0], CFG.vocab_size))
  np.testing.assert_allclose(draft.q[1], alone.q[1])
  for a, b in zip(jax.tree.leaves(new.learned), jax.tree.leaves(alone_state)):
    np.testing.assert_array_equal(a, b)


def test_the_head_is_skipped_when_every_row_copies(target, head):
  sd, state, sampling = _prefilled(target, head, 0.0)
  hybrid, params = sd.drafter, sd.drafter_params
  ctx = _context(state, sampling, [PROMPTS[0], PROMPTS[0]])      # both rows copy
  keys = jnp.stack([jax.random.key(1), jax.random.key(2)])
  draft, new = hybrid.propose(params, state.drafter_state, ctx, keys)
  assert np.all(np.asarray(draft.length) > 0)
  # the head's state is returned untouched (its propose would have advanced the cache lengths)
  _, ran = hybrid.learned.propose(params["learned"], state.drafter_state.learned, ctx, keys)
  assert not np.array_equal(ran.cache.lengths, state.drafter_state.learned.cache.lengths)
  for a, b in zip(jax.tree.leaves(new.learned), jax.tree.leaves(state.drafter_state.learned)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("num", [D, "auto", "tree"])
def test_greedy_equals_plain_without_recompiling(target, head, num):
  cfg = {"method": "hybrid", "num_speculative_tokens": num}
  if num == "tree":             # EAGLE-2 trees of 4 nodes where the row does not copy
    cfg.update(num_speculative_tokens=4, tree_top_k=2, tree_depth=3)
  sd = SpecDecoder(target, cfg, draft_model=head, time_rounds=False)
  plain = Decoder(target)
  rng = np.random.default_rng(0)
  prompts = PROMPTS + [rng.integers(0, CFG.vocab_size, 9).tolist()]
  out = sd.generate(prompts, max_new_tokens=24, eos=False, pad_to=16)
  assert out.token_ids == plain.generate(prompts, max_new_tokens=24, eos=False).token_ids
  assert out.acceptance_length > 1.0
  other = [rng.integers(0, CFG.vocab_size, n).tolist() for n in (4, 12, 7)]
  with count_compiles() as c:
    again = sd.generate(other, max_new_tokens=24, eos=False, temperature=0.8, seed=3, pad_to=16)
  assert c.count == 0 and all(len(t) == 24 for t in again.token_ids)


def test_the_copy_drafter_alone_matches_its_own_rule():
  """Built with prompt_lookup_min 2, the copy side proposes only after a repeated 2-gram."""
  ng = NgramDrafter(D, 2, 4)
  tokens = jnp.asarray([[5, 7, 9, 2, 11, 5, 7, 0], [5, 7, 9, 2, 11, 9, 7, 0]], jnp.int32)
  ctx = Context(tokens=tokens, length=jnp.asarray([7, 7]), prompt_len=jnp.asarray([7, 7]),
                sampling=SamplingParams.make(2))
  draft, _ = ng.propose(None, (), ctx, None)
  assert np.asarray(draft.length).tolist() == [3, 0]
  assert np.asarray(draft.tokens[0]).tolist() == [9, 2, 11]


@pytest.mark.parametrize("cfg, message", [
    ({"learned": "ngram"}, r"hybrid learned='ngram': choose one of eagle3, mtp"),
    ({"learned": "layer_skip", "head": "/x"}, r"takes no head folder; drop head"),
    ({"prompt_lookup_min": 3, "prompt_lookup_max": 2}, r"prompt_lookup_min <= prompt_lookup_max"),
    ({"learned": "dspark", "tree_top_k": 2, "tree_depth": 2},
     r"learned='dspark' drafts no EAGLE-2 trees \(eagle3 and mtp do\); drop tree_top_k"),
    ({"tree_top_k": 2}, r"need both tree_top_k >= 1 and tree_depth >= 1"),
])
def test_bad_options_name_what_to_change(cfg, message):
  with pytest.raises(ValueError, match=message):
    SpeculativeConfig.from_dict({"method": "hybrid", "num_speculative_tokens": 2, **cfg})


def test_over_a_tree_head_copies_chains_as_trees_and_drafts_the_head_tree_elsewhere(target, head):
  sd = SpecDecoder(target, {"method": "hybrid", "num_speculative_tokens": 4, "tree_top_k": 2,
                            "tree_depth": 2}, draft_model=head, time_rounds=False)
  state, sampling = sd.prefill(PROMPTS, max_new_tokens=8, temperature=0.0)
  hybrid, params = sd.drafter, sd.drafter_params
  assert hybrid.tree and hybrid.learned.tree
  ctx = _context(state, sampling, PROMPTS)
  keys = jnp.stack([jax.random.key(1), jax.random.key(2)])
  draft, _ = hybrid.propose(params, state.drafter_state, ctx, keys)
  copy, _ = hybrid.copy.propose(None, (), ctx, keys)
  alone, _ = hybrid.learned.propose(params["learned"], state.drafter_state.learned, ctx, keys)
  n = int(copy.length[0])
  assert n > 0 and int(copy.length[1]) == 0          # the fixture's premise
  np.testing.assert_array_equal(draft.tokens[0, :n], copy.tokens[0, :n])
  assert np.asarray(draft.parent[0]).tolist() == [0, 1, 2, 3]          # a chain as a tree
  np.testing.assert_array_equal(draft.tokens[1], alone.tokens[1])
  np.testing.assert_array_equal(draft.parent[1], alone.parent[1])
  assert np.asarray(alone.parent[1]).tolist() != [0, 1, 2, 3]          # the head's tree branches
  assert np.asarray(draft.length).tolist() == [n, 4]
  # greedy rows: every node deterministic (one-hot q at its token, the copied chain's too)
  np.testing.assert_array_equal(draft.q, np.eye(draft.q.shape[-1])[np.asarray(draft.tokens)])


def test_refusals(target, head):
  with pytest.raises(ValueError, match="equally many"):
    HybridDrafter(NgramDrafter(3, 2, 4), Eagle3Drafter.from_head(head, target, 4)[0])
  with pytest.raises(ValueError, match="adaptive draft lengths .* work with chains only"):
    SpecDecoder(target, {"method": "hybrid", "num_speculative_tokens": "auto", "tree_top_k": 2,
                         "tree_depth": 2}, draft_model=head)


def test_the_adaptive_length_reads_which_side_drafts(target, head):
  """Under "auto" a row's regime (copy or head) is read before the choice, with its own
  estimates: a copying row with confident copy estimates verifies its whole copy, a row the head
  drafts with poor head estimates is a plain round, from one and the same state."""
  from jspec.costs import CostTable
  costs = CostTable({1: {1: 1.0}}, round={1: {0: 1.0, 1: 1.2, 2: 1.3, 3: 1.4}})   # 0: per step
  sd = SpecDecoder(target, {"method": "hybrid", "num_speculative_tokens": D,
                            "draft_lengths": [0, 1, 2, 3]}, draft_model=head, cost_table=costs,
                   time_rounds=False)
  state, sampling = sd.prefill(PROMPTS[:1], max_new_tokens=8)
  w, params = sd.drafter, sd.drafter_params
  est = jnp.stack([jnp.full((1, D), 0.05), jnp.full((1, D), 0.95)], axis=1)   # [B, R, D]
  ds = dataclasses.replace(state.drafter_state, est=est)
  live = jnp.ones((1,), bool)
  picks = []
  for rows in ([PROMPTS[0]], [PROMPTS[1]]):          # copies 3 tokens / no repeated 2-gram
    ready = w.prepare(params, ds, _context(state, sampling, rows))
    picks.append((int(ready.regime[0]), int(ready.avail[0]),
                  w.lengths[int(w.choose(params, ready, jnp.full((1,), D), live))]))
  assert picks == [(1, 3, 3), (0, D, 0)]


def test_built_in_round_costs_are_the_learned_sides():
  from jspec.costs import CostTable
  hybrid, eagle3, ngram = (CostTable.default("cpu", m).round_at for m in ("hybrid", "eagle3",
                                                                          "ngram"))
  assert hybrid == eagle3 and hybrid != ngram
