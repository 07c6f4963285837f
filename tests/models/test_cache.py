"""KV-cache consistency (one prefill == prefix + multi-token extends + single steps, ragged rows),
tree masks and hidden-state taps, on a tiny random model against the model's own one-shot forward."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import KVCache, Llama, LlamaConfig

CFG = LlamaConfig.tiny(num_layers=3)


@pytest.fixture(scope="module")
def model():
  return Llama(CFG, rngs=nnx.Rngs(3))


def _one_shot(model, ids):
  return np.asarray(model(jnp.asarray([ids]), KVCache.init(CFG, 1, len(ids))).logits[0])


@pytest.mark.parametrize("batch", [1, 3])
def test_incremental_equals_one_shot(model, batch):
  rng = np.random.default_rng(batch)
  total = [23, 17, 30][:batch]
  seqs = [rng.integers(0, CFG.vocab_size, n).tolist() for n in total]
  prefix = [5, 9, 2][:batch]
  # Phase 1: ragged prefill, right-padded, each row advancing by its own prompt length.
  width = max(prefix)
  toks = np.zeros((batch, width), np.int32)
  for b in range(batch):
    toks[b, :prefix[b]] = seqs[b][:prefix[b]]
  cache = KVCache.init(CFG, batch, 40)
  out = model(jnp.asarray(toks), cache, num_new=jnp.asarray(prefix))
  got = [[np.asarray(out.logits[b, :prefix[b]])] for b in range(batch)]
  cache, pos = out.cache, list(prefix)
  # Phase 2: multi-token extends of 4 then 3, then single-token steps, until each row is done.
  for t in [4, 3] + [1] * 40:
    if all(p >= n for p, n in zip(pos, total)):
      break
    chunk = np.zeros((batch, t), np.int32)
    adv = []
    for b in range(batch):
      piece = seqs[b][pos[b]:pos[b] + t]
      chunk[b, :len(piece)] = piece
      adv.append(len(piece))
    out = model(jnp.asarray(chunk), cache, num_new=jnp.asarray(adv))
    for b in range(batch):
      if adv[b]:
        got[b].append(np.asarray(out.logits[b, :adv[b]]))
      pos[b] += adv[b]
    cache = out.cache
  np.testing.assert_array_equal(np.asarray(cache.lengths), total)
  for b in range(batch):
    np.testing.assert_allclose(np.concatenate(got[b]), _one_shot(model, seqs[b]), atol=2e-5)


def test_rollback_is_setting_lengths(model):
  ids = list(range(1, 15))
  cache = KVCache.init(CFG, 1, 32)
  out = model(jnp.asarray([ids[:10]]), cache)
  wrong = model(jnp.asarray([[7, 7, 7]]), out.cache).cache          # speculative garbage
  rolled = wrong.with_lengths(jnp.asarray([10]))
  got = model(jnp.asarray([ids[10:]]), rolled).logits[0]
  np.testing.assert_allclose(np.asarray(got), _one_shot(model, ids)[10:], atol=2e-5)


def test_tree_mask_matches_separate_branches(model):
  """A two-branch tree verified in one pass equals each branch run as a plain sequence."""
  prefix = [3, 1, 4, 1, 5]
  branch_a, branch_b = [9, 2], [6]
  # Flattened tree: [a0, a1, b0]; a1 sees a0; b0 sees only itself. Positions = prefix + depth.
  tree = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 1]], bool)
  cache = model(jnp.asarray([prefix]), KVCache.init(CFG, 1, 16)).cache
  pos = jnp.asarray([[5, 6, 5]])
  out = model(jnp.asarray([branch_a + branch_b]), cache, positions=pos,
              tree_mask=jnp.asarray(tree)[None])
  np.testing.assert_allclose(np.asarray(out.logits[0, :2]),
                             _one_shot(model, prefix + branch_a)[5:], atol=2e-5)
  np.testing.assert_allclose(np.asarray(out.logits[0, 2]),
                             _one_shot(model, prefix + branch_b)[5], atol=2e-5)


def test_taps_follow_the_entering_layer_convention(model):
  ids = jnp.asarray([[5, 6, 7, 8]])
  out = model(ids, KVCache.init(CFG, 1, 8), taps=(0, 1, CFG.num_layers))
  np.testing.assert_allclose(np.asarray(out.hidden[0]), np.asarray(model.embed(ids)))
  # tap L is the pre-norm output: final norm + head of it reproduces the logits.
  np.testing.assert_allclose(np.asarray(model.logits(model.norm(out.hidden[2]))),
                             np.asarray(out.logits), atol=1e-5)
  # tap 1 is the output of layer 0: running layer 0 by hand reproduces it.
  from models.llama import attention_mask
  cache = KVCache.init(CFG, 1, 8)
  x, _ = model.layers[0](out.hidden[0], jnp.arange(4)[None], cache, 0,
                         attention_mask(cache.lengths, 4, 8, None))
  np.testing.assert_allclose(np.asarray(x), np.asarray(out.hidden[1]), atol=1e-6)


def test_writes_past_the_cache_are_dropped_not_clamped(model):
  cache = model(jnp.asarray([[1, 2, 3, 4, 5, 6]]), KVCache.init(CFG, 1, 8)).cache
  before = [np.asarray(k) for k in cache.k]
  after = model(jnp.asarray([[7, 8, 9, 10]]), cache).cache   # slots 6..9; 8, 9 do not exist
  for k0, k1 in zip(before, after.k):
    np.testing.assert_array_equal(np.asarray(k1)[:, :6], k0[:, :6])


@pytest.mark.parametrize("tree", [False, True])
def test_unwritten_forward_then_write_block_equals_the_writing_forward(model, tree):
  """write_cache=False (jnp attention over [prefix, block], cache only read) + write_block gives the
  writing forward's logits, taps and cache, causal and with a tree mask, at ragged lengths."""
  rng = np.random.default_rng(7)
  b, t = 2, 4
  cache = model(jnp.asarray(rng.integers(0, CFG.vocab_size, (b, 9))), KVCache.init(CFG, b, 20),
                num_new=jnp.asarray([9, 6])).cache
  block = jnp.asarray(rng.integers(0, CFG.vocab_size, (b, t)))
  mask = None
  if tree:   # node 0 root; 1 and 2 its children; 3 child of 2
    m = np.eye(t, dtype=bool)
    m[:, 0] = True
    m[3, 2] = True
    mask = jnp.asarray(np.broadcast_to(m, (b, t, t)))
  pos = cache.lengths[:, None] + jnp.asarray([0, 1, 1, 2])[None] if tree else None
  ref = model(block, cache, positions=pos, tree_mask=mask, taps=(1, 3))
  out = model(block, cache, positions=pos, tree_mask=mask, taps=(1, 3), write_cache=False)
  assert out.cache is cache and len(out.new_kv[0]) == CFG.num_layers
  np.testing.assert_allclose(np.asarray(out.logits), np.asarray(ref.logits), atol=2e-5)
  for h, g in zip(ref.hidden, out.hidden):
    np.testing.assert_allclose(np.asarray(g), np.asarray(h), atol=2e-5)
  written = cache.write_block(*out.new_kv)
  for layer in range(CFG.num_layers):
    np.testing.assert_allclose(np.asarray(written.k[layer]), np.asarray(ref.cache.k[layer]),
                               atol=1e-5)
    np.testing.assert_allclose(np.asarray(written.v[layer]), np.asarray(ref.cache.v[layer]),
                               atol=1e-5)
  with pytest.raises(ValueError, match="one k and one v per layer"):
    cache.write_block(out.new_kv[0][:1], out.new_kv[1])


@pytest.mark.parametrize("write", [True, False])
def test_packed_forward_equals_the_padded_one(model, write):
  """A block whose rows verify different numbers of tokens, run packed (only each row's first
  n_b tokens through the projections and MLPs): the logits, taps and cached K/V of those tokens
  equal the padded forward's; the rows' other positions are zeros in logits and taps."""
  rng = np.random.default_rng(7)
  b, t, n = 3, 5, [5, 1, 3]
  prefix = [6, 11, 8]
  cache = KVCache.init(CFG, b, 32)
  toks = np.zeros((b, max(prefix)), np.int32)
  for r in range(b):
    toks[r, :prefix[r]] = rng.integers(0, CFG.vocab_size, prefix[r])
  cache = model(jnp.asarray(toks), cache, num_new=jnp.asarray(prefix)).cache
  block = jnp.asarray(rng.integers(0, CFG.vocab_size, (b, t)), jnp.int32)
  keep = np.flatnonzero((np.arange(t)[None, :] < np.asarray(n)[:, None]).reshape(-1))
  taps = (0, 2, CFG.num_layers)
  full = model(block, cache, taps=taps, write_cache=write)
  packed = model(block, cache, taps=taps, write_cache=write, pack=jnp.asarray(keep, jnp.int32))
  for r in range(b):
    np.testing.assert_allclose(np.asarray(packed.logits[r, :n[r]]),
                               np.asarray(full.logits[r, :n[r]]), atol=2e-5)
    assert not np.any(np.asarray(packed.logits[r, n[r]:]))
    for h_full, h_packed in zip(full.hidden, packed.hidden):
      np.testing.assert_allclose(np.asarray(h_packed[r, :n[r]]), np.asarray(h_full[r, :n[r]]),
                                 atol=2e-5)
      assert not np.any(np.asarray(h_packed[r, n[r]:]))
    for layer in range(CFG.num_layers):
      if write:
        got = [np.asarray(c.k[layer][r, prefix[r]:prefix[r] + n[r]])
               for c in (packed.cache, full.cache)]
      else:
        got = [np.asarray(o.new_kv[0][layer][r, :n[r]]) for o in (packed, full)]
      np.testing.assert_allclose(got[0], got[1], atol=2e-5)
  with pytest.raises(ValueError, match="pack and logit_indices"):
    model(block, cache, pack=jnp.asarray(keep, jnp.int32),
          logit_indices=jnp.zeros((b, 1), jnp.int32))
