"""Tree verification (jspec.tree): exact enumeration of the emitted distribution on a toy pair.

The toy target and draft are the tables of test_lossless_exact (V = 6, logits indexed by the last
two tokens). Each round drafts a tree: deterministic children (the draft's top-2 at every node, to
depth 3: 14 nodes), children sampled i.i.d. from the draft (two at the root, one below each: the
multi-draft rule), or both mixed, or the real hybrid drafter's tree (`jspec.drafters.hybrid` over a
deterministic table tree: the n-gram's copied chain as a tree where it proposes, else the table's
4-node tree), or what a sampling EAGLE-3 / MTP tree drafter proposes
(`eagle_tree.tree_or_sampled_chain`: the table tree for a greedy row, the sampled 4-token chain as a
tree for a sampled one); the acceptance probabilities and final distributions come from `tree_outcomes`,
rounds chain until 3 tokens are out, and the result must equal the target's joint distribution to
1e-6 under greedy, T = 1, top-k and top-p. A verifier that skips the renormalisation after a
rejected sibling must fail the same check.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec import tree
from jspec.drafters.base import Draft
from jspec.rejection import chain_outcomes
from jspec.sampling import SamplingParams, process_logits
from tests.jspec.test_lossless_exact import (DRAFT, NEED, PARAMS, PROMPT, TARGET, V, TableDrafter,
                                             target_joint)

_process = jax.jit(process_logits)


def _dist(table, ctxs, params):
  logits = jnp.asarray(np.stack([table[c[-2], c[-1]] for c in ctxs]))
  rows = SamplingParams(*(jnp.broadcast_to(x, (len(ctxs),)) for x in
                          (params.temperature, params.top_k, params.top_p)))
  return np.exp(np.asarray(_process(logits, rows), np.float64))


# shapes: per node (parent block index, "det" = the parent's next best unused draft token, or
# "sam" = drawn from the draft at the parent's context)
SHAPES = {
    "deterministic-3x2": [(p, "det") for p in [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]],
    "sampled-2x1": [(0, "sam"), (0, "sam"), (1, "sam"), (2, "sam")],
    "mixed": [(0, "sam"), (0, "sam"), (1, "det"), (1, "det"), (2, "det")],
}


def _trees(ctx, shape, params):
  """Every tree the drafter can propose at ctx: (tokens, parents, q [N, V], probability)."""
  parents = [p for p, _ in shape]
  trees = [((), 1.0)]
  for i, (par, kind) in enumerate(shape):
    nxt = []
    for toks, w in trees:
      path = []                                   # the parent's path tokens from the root
      n = par
      while n > 0:
        path.insert(0, toks[n - 1])
        n = parents[n - 1]
      c = ctx + tuple(path)
      if kind == "det":   # the best draft token not already a sibling of this node
        used = [toks[j] for j in range(i) if parents[j] == par]
        order = np.argsort(-DRAFT[c[-2], c[-1]], kind="stable")
        nxt.append((toks + (int([x for x in order if x not in used][0]),), w))
      else:
        q = _dist(DRAFT, [c], params)[0]
        nxt += [(toks + (x,), w * q[x]) for x in range(V) if q[x] > 0]
    trees = nxt
  return trees


def _node_q(ctx, shape, toks, params):
  """The proposal distribution of each node: the draft at its parent (one-hot when det)."""
  parents = [p for p, _ in shape]
  q = np.zeros((len(shape), V))
  for i, (par, kind) in enumerate(shape):
    path, n = [], par
    while n > 0:
      path.insert(0, toks[n - 1])
      n = parents[n - 1]
    q[i] = np.eye(V)[toks[i]] if kind == "det" else _dist(DRAFT, [ctx + tuple(path)], params)[0]
  return q


@dataclasses.dataclass(frozen=True)
class _TableTree(TableDrafter):
  """A deterministic 4-node tree from the DRAFT table (the hybrid's learned side here): the
  table's best and second-best tokens at the context (parent 0), then each one's best child."""
  num_draft: int = 4
  tree = True

  def propose(self, params, state, ctx, key):
    table = jnp.asarray(DRAFT)
    rows = jnp.arange(ctx.tokens.shape[0])
    a, b = ctx.tokens[rows, ctx.length - 2], ctx.tokens[rows, ctx.length - 1]
    top = jnp.argsort(-table[a, b], axis=-1)[:, :2].astype(jnp.int32)             # [B, 2]
    kids = [jnp.argmax(table[b, top[:, j]], axis=-1).astype(jnp.int32) for j in range(2)]
    tokens = jnp.stack([top[:, 0], top[:, 1], kids[0], kids[1]], axis=1)
    parent = jnp.broadcast_to(jnp.asarray([0, 0, 1, 2], jnp.int32), tokens.shape)
    return Draft(tokens=tokens, parent=parent), state


@functools.lru_cache(maxsize=None)
def _hybrid_propose():
  from jspec.drafters.base import Context
  from jspec.drafters.hybrid import HybridDrafter
  from jspec.drafters.model_free.ngram import NgramDrafter
  drafter = HybridDrafter(NgramDrafter(4, 1, 4), _TableTree())
  params = {"copy": None, "learned": None}

  def fn(tokens, length):
    ctx = Context(tokens=tokens, length=length, prompt_len=length, sampling=SamplingParams.make(1))
    return drafter.propose(params, drafter.init_state(params, tokens, ctx, 32), ctx, None)[0]
  return jax.jit(fn)


@functools.lru_cache(maxsize=None)
def hybrid_tree(ctx):
  """The hybrid's draft at ctx: (tokens, parents, valid nodes)."""
  tokens = jnp.asarray([list(ctx) + [0] * (8 - len(ctx))], jnp.int32)
  draft = _hybrid_propose()(tokens, jnp.asarray([len(ctx)], jnp.int32))
  assert draft.q is None
  return (tuple(np.asarray(draft.tokens[0]).tolist()), tuple(np.asarray(draft.parent[0]).tolist()),
          int(draft.length[0]))


CHAIN4 = [(0, "sam"), (1, "sam"), (2, "sam"), (3, "sam")]


@functools.lru_cache(maxsize=None)
def _tree_or_chain():
  from jspec.drafters.base import Context
  from jspec.drafters.eagle_tree import tree_or_sampled_chain

  def fn(greedy, tokens, length, chain_tokens, chain_q):
    b = chain_tokens.shape[0]
    ctx = Context(tokens=tokens, length=length, prompt_len=length, sampling=SamplingParams.make(b))
    tree_fn = lambda: _TableTree().propose(None, None, ctx, None)[0]
    chain_fn = lambda: Draft(tokens=chain_tokens, q=chain_q)
    return tree_or_sampled_chain(greedy, tree_fn, chain_fn, V)
  return jax.jit(fn)


def tree_or_chain_candidates(ctx, params, sampled_as_deterministic=False):
  """What a sampling tree drafter proposes at ctx, through the real `tree_or_sampled_chain`: the
  table tree when the row is greedy, else every sampled chain of CHAIN4 (tokens, parents, q,
  probability, nodes)."""
  greedy = float(params.temperature) == 0.0
  chains = [((0,) * 4, 1.0)] if greedy else _trees(ctx, CHAIN4, params)
  chain_tokens = np.asarray([t for t, _ in chains], np.int32)
  chain_q = np.stack([np.zeros((4, V)) if greedy else _node_q(ctx, CHAIN4, t, params)
                      for t, _ in chains])
  b = len(chain_tokens)
  tokens = np.zeros((b, 8), np.int32)
  tokens[:, :len(ctx)] = ctx
  draft = _tree_or_chain()(jnp.full((b,), greedy), jnp.asarray(tokens),
                           jnp.full((b,), len(ctx), jnp.int32), jnp.asarray(chain_tokens),
                           jnp.asarray(chain_q, jnp.float32))
  toks, parents, q = (np.asarray(x, np.float64 if x is draft.q else np.int64)
                      for x in (draft.tokens, draft.parent, draft.q))
  if sampled_as_deterministic:       # sampled nodes verified as one-hot (still lossless)
    q = np.eye(V)[toks]
  return [(tuple(toks[i].tolist()), tuple(parents[i].tolist()), q[i],
           chains[i][1], 4) for i in range(b)]


def _candidates(ctx, shape, params):
  """Every tree the drafter can propose at ctx: (tokens, parents, q [N, V], probability, nodes)."""
  if shape == "hybrid":
    toks, parents, n = hybrid_tree(ctx)
    return [(toks, parents, np.eye(V)[list(toks)], 1.0, n)]
  if shape in ("tree-or-chain", "tree-or-chain-broken"):
    return tree_or_chain_candidates(ctx, params, shape.endswith("broken"))
  parents = tuple(p for p, _ in shape)
  return [(toks, parents, _node_q(ctx, shape, toks, params), w, len(shape))
          for toks, w in _trees(ctx, shape, params)]


def spec_tree_joint(params, shape, outcomes):
  n = len(shape) if isinstance(shape, list) else 4

  @functools.lru_cache(maxsize=None)
  def from_ctx(ctx, need):
    trees = _candidates(ctx, shape, params)
    paths = []                                    # the context after each block token
    for toks, parents, _, _, _ in trees:
      blk = [()]
      for i in range(n):
        blk.append(blk[parents[i]] + (toks[i],))
      paths.append(blk)
    p = _dist(TARGET, [ctx + s for blk in paths for s in blk], params).reshape(len(trees), n + 1, V)
    accept, final = outcomes(jnp.asarray(p, jnp.float32),
                             jnp.asarray([t[0] for t in trees], jnp.int32),
                             jnp.asarray([t[1] for t in trees], jnp.int32),
                             jnp.asarray(np.stack([t[2] for t in trees]), jnp.float32),
                             jnp.asarray([t[4] for t in trees], jnp.int32))
    accept, final = np.asarray(accept, np.float64), np.asarray(final, np.float64)
    final = final / final.sum(-1, keepdims=True)   # the sampler normalises (inverse CDF)
    out = {}
    for (toks, parents, _, w, _), blk, a, f in zip(trees, paths, accept, final):
      reach = np.zeros(n + 1)
      reach[0] = w
      for node in range(n + 1):                   # children after their parent: index order
        left = reach[node]
        for c in range(n):
          if parents[c] == node:
            reach[c + 1] = left * a[c]
            left *= 1.0 - a[c]
        if left == 0:
          continue
        for x in range(V):                        # stop at node, emit x
          pr = left * f[node, x]
          if pr == 0:
            continue
          emitted = blk[node] + (x,)
          if len(emitted) >= need:
            out[emitted[:need]] = out.get(emitted[:need], 0.0) + pr
          else:
            for rest, pr2 in from_ctx(ctx + emitted, need - len(emitted)).items():
              out[emitted + rest] = out.get(emitted + rest, 0.0) + pr * pr2
    return out

  return from_ctx(PROMPT, NEED)


_outcomes = jax.jit(tree.tree_outcomes)


@pytest.mark.parametrize("name", list(PARAMS))
@pytest.mark.parametrize("shape", list(SHAPES) + ["hybrid", "tree-or-chain"])
def test_tree_verification_is_lossless(name, shape):
  t, k, p = PARAMS[name]
  params = SamplingParams(jnp.float32(t), jnp.int32(k), jnp.float32(p))
  want = target_joint(params)
  got = spec_tree_joint(params, SHAPES.get(shape, shape), _outcomes)
  assert abs(sum(got.values()) - 1.0) < 1e-6
  for seq, prob in want.items():
    assert abs(got.get(seq, 0.0) - prob) < 1e-6, (seq, got.get(seq, 0.0), prob)


@pytest.mark.parametrize("shape", ["deterministic-3x2", "sampled-2x1", "hybrid"])
def test_skipping_the_renormalisation_fails(monkeypatch, shape):
  """Negative control: rejected siblings' mass removed but r not renormalised."""
  monkeypatch.setattr(tree, "residual_distribution", lambda p, q: jnp.maximum(p - q, 0.0))
  params = SamplingParams(jnp.float32(1.0), jnp.int32(0), jnp.float32(1.0))
  want = target_joint(params)
  got = spec_tree_joint(params, SHAPES.get(shape, shape),
                        jax.jit(lambda *a: tree.tree_outcomes(*a)))
  assert max(abs(got.get(s, 0.0) - p) for s, p in want.items()) > 1e-3


@pytest.mark.parametrize("name", ["T=1", "T=0.7,top-k=3"])
def test_sampled_chain_accepts_more_than_deterministic_verification(name):
  """Why sampled rows draft the chain with its q: verified as deterministic nodes (one-hot q,
  accepted with p(x); lossless for any draft, the rule the tree's nodes get) the same drafts
  accept fewer tokens in a round than with min(1, p / q)."""
  t, k, p = PARAMS[name]
  params = SamplingParams(jnp.float32(t), jnp.int32(k), jnp.float32(p))

  def expected_accepted(shape):
    total = 0.0
    for toks, parents, q, w, n in _candidates(PROMPT, shape, params):
      blk = [()]
      for i in range(n):
        blk.append(blk[parents[i]] + (toks[i],))
      pt = _dist(TARGET, [PROMPT + c for c in blk], params)
      accept, _ = _outcomes(*(jnp.asarray(x)[None] for x in (
          pt.astype(np.float32), np.asarray(toks, np.int32), np.asarray(parents, np.int32),
          q.astype(np.float32), np.asarray([n], np.int32)[0])))
      total += w * np.cumprod(np.asarray(accept[0], np.float64)).sum()   # a chain: parents 0..3
    return total

  good, broken = expected_accepted("tree-or-chain"), expected_accepted("tree-or-chain-broken")
  assert good > broken + 0.2, (good, broken)


def test_tree_or_sampled_chain_per_row():
  """A mixed batch: greedy rows carry the tree and one-hot q, sampled rows the chain, its q and
  the parents of a chain."""
  from jspec.drafters.eagle_tree import tree_or_sampled_chain
  rng = np.random.default_rng(1)
  b, n, v = 4, 3, 7
  tree_tokens = jnp.asarray(rng.integers(0, v, (b, n)), jnp.int32)
  tree_parent = jnp.broadcast_to(jnp.asarray([0, 0, 1], jnp.int32), (b, n))
  chain_tokens = jnp.asarray(rng.integers(0, v, (b, n)), jnp.int32)
  chain_q = jax.nn.softmax(jnp.asarray(rng.normal(size=(b, n, v)), jnp.float32), -1)
  greedy = jnp.asarray([True, False, False, True])
  d = tree_or_sampled_chain(greedy, lambda: Draft(tokens=tree_tokens, parent=tree_parent),
                            lambda: Draft(tokens=chain_tokens, q=chain_q), v)
  for r in range(b):
    g = bool(greedy[r])
    np.testing.assert_array_equal(d.tokens[r], (tree_tokens if g else chain_tokens)[r])
    np.testing.assert_array_equal(d.parent[r], [0, 0, 1] if g else [0, 1, 2])
    np.testing.assert_allclose(d.q[r], np.eye(v)[np.asarray(tree_tokens[r])] if g else chain_q[r])
  # all greedy: the tree alone (the chain's side is skipped), and the reverse
  run = jax.jit(lambda g: tree_or_sampled_chain(
      g, lambda: Draft(tokens=tree_tokens, parent=tree_parent),
      lambda: Draft(tokens=chain_tokens, q=chain_q), v))
  np.testing.assert_array_equal(run(jnp.ones((b,), bool)).tokens, tree_tokens)
  np.testing.assert_array_equal(run(jnp.zeros((b,), bool)).parent, np.broadcast_to([0, 1, 2], (b, n)))


def test_the_hybrid_tree_mixes_copied_chains_and_table_trees():
  """In the enumerated contexts the hybrid drafts the n-gram's chain (as a tree: parents 0, 1, 2,
  3, its own length) in some and the table's 4-node tree in the others."""
  import itertools
  ctxs = [PROMPT + s for m in range(NEED) for s in itertools.product(range(V), repeat=m)]
  kinds = [hybrid_tree(c)[1] for c in ctxs]
  copied = sum(k == (0, 1, 2, 3) for k in kinds)
  learned = sum(k == (0, 0, 1, 2) for k in kinds)
  assert copied + learned == len(ctxs) and min(copied, learned) > len(ctxs) // 5, (copied, learned)
  assert len({hybrid_tree(c)[2] for c in ctxs}) >= 3      # copies of several lengths, and 4 nodes


def test_chain_is_the_special_case():
  rng = np.random.default_rng(0)
  b, d, v = 5, 4, 7
  p = jax.nn.softmax(jnp.asarray(rng.normal(size=(b, d + 1, v)) * 2), -1)
  q = jax.nn.softmax(jnp.asarray(rng.normal(size=(b, d, v)) * 2), -1)
  tokens = jnp.asarray(rng.integers(0, v, (b, d)), jnp.int32)
  n = jnp.asarray([4, 2, 0, 3, 1], jnp.int32)
  for qq in (None, q):
    a1, f1 = chain_outcomes(p, tokens, qq, n)
    a2, f2 = tree.tree_outcomes(p, tokens, tree.chain_parents(b, d), qq, n)
    np.testing.assert_allclose(a1, a2, atol=1e-6)
    np.testing.assert_allclose(f1, f2, atol=1e-6)


def test_masks_depths_and_greedy_walk():
  parent = jnp.asarray([[0, 0, 1, 1, 2, 5]], jnp.int32)
  m = np.asarray(tree.ancestor_mask(parent))[0]
  want = np.eye(7, dtype=bool)
  for i, par in enumerate([0, 0, 1, 1, 2, 5]):
    want[i + 1] |= want[par]
  np.testing.assert_array_equal(m, want)
  np.testing.assert_array_equal(tree.depths(jnp.asarray(m)[None])[0], [0, 1, 1, 2, 2, 2, 3])
  # greedy: target argmax after each block token; the path 0 -> 2 -> 5 -> 6 matches
  tokens = jnp.asarray([[3, 1, 4, 2, 5, 2]], jnp.int32)
  argmax = [1, 9, 5, 9, 9, 2, 7]                 # after block tokens 0..6
  logits = jax.nn.one_hot(jnp.asarray([argmax]), 10) * 5.0
  n_acc, path, out = tree.verify_tree_greedy(logits, tokens, parent)
  assert int(n_acc[0]) == 3
  np.testing.assert_array_equal(path[0, :4], [0, 2, 5, 6])
  np.testing.assert_array_equal(out[0, :4], [1, 5, 2, 7])
  # the sampled walk at temperature ~0 (p one-hot) takes the same path
  keys = jax.random.split(jax.random.key(0), 1)
  n2, path2, out2 = tree.verify_tree(keys, jax.nn.softmax(logits * 100, -1), tokens, parent, None)
  assert int(n2[0]) == 3
  np.testing.assert_array_equal(out2[0, :4], out[0, :4])
  # invalid nodes (num_nodes) are never accepted, nor their descendants
  n3, _, out3 = tree.verify_tree_greedy(logits, tokens, parent, jnp.asarray([5]))
  assert int(n3[0]) == 2 and out3[0, 2] == 2


def test_compaction_moves_the_path():
  from models.kv_cache import KVCache
  from models.config import LlamaConfig
  cfg = LlamaConfig.tiny(num_layers=2)
  cache = KVCache.init(cfg, 2, 16)
  k = jnp.arange(2 * 16, dtype=jnp.float32).reshape(2, 16, 1, 1)
  k = jnp.broadcast_to(k, cache.k[0].shape)
  cache = KVCache(k=(k, k + 1000), v=(k, k), lengths=cache.lengths)
  start = jnp.asarray([3, 5], jnp.int32)
  path = jnp.asarray([[0, 2, 5, 0], [0, 1, 3, 0]], jnp.int32)
  out = tree.compact(cache, start, path)
  np.testing.assert_array_equal(out.k[0][0, 3:6, 0, 0], [3, 5, 8])
  np.testing.assert_array_equal(out.k[1][1, 5:8, 0, 0], [1021, 1022, 1024])
  np.testing.assert_array_equal(out.k[0][0, :3, 0, 0], [0, 1, 2])   # the prefix is untouched


def test_parent_check():
  tree.check_parents([0, 0, 1, 2])
  with pytest.raises(ValueError, match="topological"):
    tree.check_parents([0, 2, 1])
