"""Tree drafts through the jitted round on a tiny random model: an oracle drafter that knows plain
decoding's output puts the right token second among two children at each depth (so the accepted
path skips block slots and compaction has work to do), and is wrong on purpose at some depths.
Greedy output equals plain decoding, the compacted target cache equals a fresh prefill of the
committed tokens, a full cache stops rows cleanly, nothing recompiles; EAGLE-2 trees on a random
EAGLE-3 head are greedy-identical too."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder, count_compiles, engine
from jspec.drafters.base import Draft, Drafter
from jspec.drafters.eagle3 import Eagle3Config, Eagle3Head
from models import KVCache, Llama, LlamaConfig

CFG = LlamaConfig.tiny()
DEPTH = 3


@pytest.fixture(scope="module")
def tiny():
  return Llama(CFG, rngs=nnx.Rngs(5))


def _prompts(seed, lengths):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, CFG.vocab_size, n).tolist() for n in lengths]


@dataclasses.dataclass(frozen=True)
class OracleTree(Drafter):
  """params: the reference continuation [B, S] (prompt + plain output). At each depth two
  children: a wrong token, then the right one (which alone has children); at depths where
  (length + depth) % 4 == 3 both are wrong."""
  num_draft: int = 2 * DEPTH
  target_taps: tuple = ()
  tree = True

  def init_state(self, params, prompt, ctx, max_len):
    return jnp.zeros((), jnp.int32)

  def commit(self, params, state, ctx):
    return state

  def propose(self, params, state, ctx, key):
    b = ctx.length.shape[0]
    pos = ctx.length[:, None] + jnp.arange(DEPTH)[None, :]
    right = jnp.take_along_axis(params, jnp.minimum(pos, params.shape[1] - 1), axis=1)
    wrong = (right + 1) % CFG.vocab_size
    right = jnp.where(pos % 4 == 3, (right + 2) % CFG.vocab_size, right)
    tokens = jnp.stack([wrong, right], axis=2).reshape(b, 2 * DEPTH).astype(jnp.int32)
    parent = jnp.asarray([0, 0] + [2 * i for i in range(1, DEPTH) for _ in range(2)], jnp.int32)
    return Draft(tokens=tokens, parent=jnp.broadcast_to(parent, (b, 2 * DEPTH))), state


def _oracle_decoder(tiny, prompts, plain_out):
  sd = SpecDecoder(tiny, {"method": "ngram", "num_speculative_tokens": 2 * DEPTH})
  width = max(len(p) + len(o) for p, o in zip(prompts, plain_out)) + 8
  ref = np.zeros((len(prompts), width), np.int32)
  for i, (p, o) in enumerate(zip(prompts, plain_out)):
    ref[i, :len(p) + len(o)] = p + o
  sd.drafter, sd.drafter_params = OracleTree(), jnp.asarray(ref)
  return sd


def test_oracle_tree_is_greedy_identical_and_compacts(tiny):
  prompts = _prompts(0, [5, 9, 3])
  plain = Decoder(tiny).generate(prompts, max_new_tokens=30, eos=False).token_ids
  sd = _oracle_decoder(tiny, prompts, plain)
  out = sd.generate(prompts, max_new_tokens=30, eos=False)
  assert out.token_ids == plain
  assert 1.5 < out.acceptance_length < DEPTH + 1       # paths through slot 2, 4, 6, some cut
  # after a few rounds driven by hand, the cache holds exactly a fresh prefill's K/V
  state, sampling = sd.prefill(prompts, max_new_tokens=30, eos=False)
  for _ in range(4):
    state = engine.spec_round(sd.graphdef, sd.weights, sd.drafter, sd.drafter_params, state,
                              sampling, eos_ids=())
  length = np.asarray(state.length)
  assert np.all(length > np.asarray([len(p) for p in prompts]) + 6)
  toks = np.asarray(state.tokens)
  for b in range(len(prompts)):
    n = int(length[b]) - 1
    fresh = tiny(jnp.asarray(toks[b:b + 1, :n]), KVCache.init(CFG, 1, n)).cache
    for layer in range(CFG.num_layers):
      np.testing.assert_allclose(np.asarray(state.cache.k[layer][b, :n]),
                                 np.asarray(fresh.k[layer][0]), atol=2e-5)
      np.testing.assert_allclose(np.asarray(state.cache.v[layer][b, :n]),
                                 np.asarray(fresh.v[layer][0]), atol=2e-5)


def test_tree_rows_stop_cleanly_at_a_full_cache_and_never_recompile(tiny):
  prompts = _prompts(3, [4, 7])
  plain = Decoder(tiny).generate(prompts, max_new_tokens=40, eos=False).token_ids
  sd = _oracle_decoder(tiny, prompts, plain)
  out = sd.generate(prompts, max_new_tokens=40, eos=False, max_len=20)
  assert out.finish_reason == ["cache_full", "cache_full"]
  for row, full, p in zip(out.token_ids, plain, prompts):
    assert len(row) == 20 - len(p) and row == full[:len(row)]
  sd.generate(prompts, max_new_tokens=40, eos=False, temperature=[0.0, 1.0])
  with count_compiles() as c:
    sd.generate(_prompts(4, [6, 2]), max_new_tokens=40, eos=False, temperature=[1.0, 0.0], seed=3)
  assert c.count == 0


def test_eagle2_trees_are_greedy_identical(tiny):
  head = Eagle3Head(Eagle3Config.for_target(CFG, draft_vocab_size=64, taps=(0, 1, 1)),
                    rngs=nnx.Rngs(2))
  prompts = _prompts(6, [8, 4, 11])
  plain = Decoder(tiny).generate(prompts, max_new_tokens=24, eos=False).token_ids
  for k, depth, n in [(2, 3, 6), (3, 2, 12), (1, 4, 4)]:
    sd = SpecDecoder(tiny, {"method": "eagle3", "num_speculative_tokens": n, "tree_top_k": k,
                            "tree_depth": depth}, draft_model=head)
    assert sd.generate(prompts, max_new_tokens=24, eos=False).token_ids == plain


def test_eagle2_tree_shape(tiny):
  """The tree is connected, topologically ordered, of the budget's size; its tokens are each
  parent's top-k and the depth is bounded."""
  from jspec import tree
  from jspec.drafters import eagle_tree
  head = Eagle3Head(Eagle3Config.for_target(CFG, draft_vocab_size=64, taps=(0, 1, 1)),
                    rngs=nnx.Rngs(2))
  sd = SpecDecoder(tiny, {"method": "eagle3", "num_speculative_tokens": 9, "tree_top_k": 3,
                          "tree_depth": 3}, draft_model=head)
  state, _ = sd.prefill(_prompts(7, [5, 8]), max_new_tokens=8)
  h = nnx.merge(sd.drafter.graphdef, sd.drafter_params["head"])
  def expand(feature, emb, positions, attend):
    a, aux = h.layer(feature, emb, positions, attend)
    return a, h.draft_logits(a), aux

  draft = jax.jit(lambda s: eagle_tree.propose_tree(
      expand, h.draft_to_target[...], sd.drafter_params["embed"], s.cache, s.feature, s.logits,
      3, 3, 9))(state.drafter_state)
  parent = np.asarray(draft.parent)
  tree.check_parents(parent)
  d = np.asarray(tree.depths(tree.ancestor_mask(draft.parent)))
  assert parent.shape == (2, 9) and d.max() <= 3 and (parent == 0).sum(1).min() >= 1
  top = np.argsort(-np.asarray(state.drafter_state.logits), axis=1)[:, :3]
  for b in range(2):   # level-1 nodes are the root's top-3 (draft vocab = target ids here)
    assert set(np.asarray(draft.tokens)[b][parent[b] == 0]) <= set(top[b])
  with pytest.raises(ValueError, match="node budget"):
    SpecDecoder(tiny, {"method": "eagle3", "num_speculative_tokens": 40, "tree_top_k": 3,
                       "tree_depth": 3}, draft_model=head)
  with pytest.raises(ValueError, match="both tree_top_k"):
    SpecDecoder(tiny, {"method": "eagle3", "num_speculative_tokens": 4, "tree_top_k": 3},
                draft_model=head)
  with pytest.raises(ValueError, match="chains only"):
    SpecDecoder(tiny, {"method": "eagle3", "num_speculative_tokens": "auto", "tree_top_k": 3,
                       "tree_depth": 3}, draft_model=head)


def test_trees_over_a_bf16_cache_are_greedy_identical(tiny):
  """Tree verification and compaction with the KV cache in bf16 emit bf16-cache plain decoding."""
  model = nnx.clone(tiny)
  model.cache_dtype = jnp.dtype(jnp.bfloat16)
  prompts = _prompts(4, [6, 3])
  plain = Decoder(model).generate(prompts, max_new_tokens=24, eos=False).token_ids
  sd = _oracle_decoder(model, prompts, plain)
  out = sd.generate(prompts, max_new_tokens=24, eos=False)
  assert out.token_ids == plain and out.acceptance_length > 1.5
