"""EAGLE-2 dynamic draft trees for feature-level drafters (the EAGLE-3 head, the MTP module), built
inside the jit with static shapes.

From the drafter's state (its output feature and draft logits at the last committed position):
  1. the root's top-k draft tokens are level 1, scored by their log-probability;
  2. `depth - 1` expansions: the k frontier nodes run through the drafter at once (each attends to the
     head's cache and to its own ancestors among the expanded nodes), each proposes its top-k
     children scored by cumulative log-probability, and the best k of the k*k children become the
     next frontier;
  3. reranking: the `budget` best of all scored nodes, sorted by creation order (parents before
     children; a child never outscores its parent and ties keep the parent), form the tree.
Tokens are deterministic (q = None): tree verification (jspec.tree) accepts each with the target's
probability of it after earlier siblings' rejection, which keeps sampling lossless.

A deterministic node is a poor draft for a sampled row: it is accepted with p(token), where a token
drawn from the drafter's q is accepted with min(1, p / q) (benchmarks/REPORT.md, T = 1: trees
1.00-1.03x against chains 1.07-1.08x). So a drafter with sampled drafts (`draft_sampling`, the
default) drafts the tree for its greedy rows only, and for sampled rows the sampled chain of the
same node budget, verified as the tree whose node i hangs under node i - 1
(`tree_or_sampled_chain`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jspec.drafters.base import Draft
from pallas_kernels.verify_attention.reference import attend


def num_candidates(top_k: int, depth: int) -> int:
  """Nodes scored by the expansion: k at level 1, then k*k per further level."""
  return top_k + (depth - 1) * top_k * top_k


def check(top_k: int, depth: int, budget: int, draft_vocab: int) -> None:
  if top_k < 1 or depth < 1:
    raise ValueError(f"an EAGLE-2 tree needs tree_top_k >= 1 and tree_depth >= 1, got "
                     f"{top_k} and {depth}")
  if top_k > draft_vocab:
    raise ValueError(f"tree_top_k ({top_k}) exceeds the head's draft vocabulary ({draft_vocab})")
  most = num_candidates(top_k, depth)
  if not 1 <= budget <= most:
    raise ValueError(f"num_speculative_tokens is the tree's node budget: with tree_top_k={top_k} "
                     f"and tree_depth={depth} it must be in [1, {most}], got {budget}")


def _tree_attend(cache, buf_k, buf_v, buf_mask, level_slots):
  """attend(q, k, v) for one expansion level: writes the frontier's k/v into the node buffer at
  `level_slots`, then attends to the head's cache (slots < its length) and to the buffer nodes
  buf_mask allows (the node's ancestors and itself)."""
  def fn(q, k, v):
    bk = buf_k.at[:, level_slots].set(k.astype(buf_k.dtype))
    bv = buf_v.at[:, level_slots].set(v.astype(buf_v.dtype))
    b, t = q.shape[:2]
    s = cache.k[0].shape[1]
    prefix = jnp.broadcast_to((jnp.arange(s)[None, :] < cache.lengths[:, None])[:, None, :],
                              (b, t, s))
    mask = jnp.concatenate([prefix, buf_mask], axis=2)
    out = attend(q, jnp.concatenate([cache.k[0], bk], axis=1),
                 jnp.concatenate([cache.v[0], bv], axis=1), mask)
    return out, (bk, bv)
  return fn


def propose_tree(expand, draft_to_target: jax.Array, embed: jax.Array, cache, feature: jax.Array,
                 logits: jax.Array, top_k: int, depth: int, budget: int) -> Draft:
  """The EAGLE-2 tree from a feature-level drafter's state: Draft(tokens [B, N], parent [B, N]),
  N = budget.

  expand(feature [B, k, H], emb [B, k, H], positions [B, k], attend) -> (the children's input
  feature [B, k, H], their draft logits [B, k, Vd], attend's aux): one step of the drafter for the
  k frontier nodes (EAGLE-3's head layer, MTP's module). cache: the drafter's one-layer KV cache
  (lengths = committed - 1); feature [B, H] and logits [B, Vd]: its state after the last
  committed token; draft_to_target [Vd] maps draft ids to target ids."""
  b = feature.shape[0]
  k = top_k
  kvh, dh = cache.k[0].shape[2:]
  m = max(depth - 1, 1) * k                                  # expanded nodes' buffer
  buf_k = jnp.zeros((b, m, kvh, dh), cache.k[0].dtype)
  buf_v = jnp.zeros_like(buf_k)
  anc = jnp.zeros((b, k, m), bool)                           # frontier's ancestors in the buffer

  logp = jax.nn.log_softmax(logits, axis=-1)                 # [B, Vd]
  score, tok = jax.lax.top_k(logp, k)                        # level 1
  scores, toks, parents = [score], [tok], [jnp.full((b, k), -1, jnp.int32)]
  ids = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (b, k))    # frontier candidate ids
  feature = jnp.broadcast_to(feature[:, None], (b, k) + feature.shape[1:])
  for level in range(1, depth):
    slots = jnp.arange((level - 1) * k, level * k)
    mask = anc.at[:, :, slots].set(jnp.eye(k, dtype=bool)[None])      # ancestors + itself
    positions = jnp.broadcast_to(cache.lengths[:, None] + level - 1, (b, k))
    a, child_logits, (buf_k, buf_v) = expand(feature, embed[draft_to_target[tok]], positions,
                                             _tree_attend(cache, buf_k, buf_v, mask, slots))
    child_logp = jax.nn.log_softmax(child_logits, axis=-1)            # [B, k, Vd]
    c_score, c_tok = jax.lax.top_k(child_logp, k)                    # [B, k, k]
    c_score = c_score + score[:, :, None]
    base = num_candidates(k, level)                                   # first id of this level
    scores.append(c_score.reshape(b, k * k))
    toks.append(c_tok.reshape(b, k * k))
    parents.append(jnp.broadcast_to(jnp.repeat(ids, k, axis=1), (b, k * k)))
    # the next frontier: the best k children
    score, pick = jax.lax.top_k(c_score.reshape(b, k * k), k)
    tok = jnp.take_along_axis(c_tok.reshape(b, k * k), pick, axis=1)
    src = pick // k                                                   # parent's frontier slot
    ids = base + pick
    feature = jnp.take_along_axis(a, src[:, :, None], axis=1)
    anc = jnp.take_along_axis(mask, src[:, :, None], axis=1)

  scores = jnp.concatenate(scores, axis=1)                           # [B, M]
  toks = jnp.concatenate(toks, axis=1)
  parents = jnp.concatenate(parents, axis=1)
  _, chosen = jax.lax.top_k(scores, budget)                          # ties: lower id first
  chosen = jnp.sort(chosen, axis=1)                                  # parents before children
  par_id = jnp.take_along_axis(parents, chosen, axis=1)
  # a parent's block index: its rank among the chosen ids + 1 (the root, id -1, is block 0)
  parent = jnp.where(par_id < 0, 0,
                     jax.vmap(jnp.searchsorted)(chosen, par_id).astype(jnp.int32) + 1)
  tokens = draft_to_target[jnp.take_along_axis(toks, chosen, axis=1)]
  return Draft(tokens=tokens.astype(jnp.int32), parent=parent.astype(jnp.int32))


def tree_or_sampled_chain(greedy: jax.Array, tree, chain, vocab_size: int,
                          sample: bool = True) -> Draft:
  """One tree draft per row: greedy rows [B] carry `tree()` (a Draft of tokens and parents,
  deterministic), the other rows `chain()` (a sampled chain Draft of the same width, its q
  recorded) as the tree whose node i hangs under node i - 1. q is the chain's where a row samples,
  one-hot at the tree's tokens where it is greedy. Each side runs only when some row needs it
  (`lax.cond`), so an all-greedy batch drafts the tree alone and an all-sampled batch the chain
  alone. sample=False (a drafter that never samples its drafts): `tree()` for every row."""
  if not sample:
    return tree()
  def skip(fn):
    shapes = jax.eval_shape(fn)
    return lambda: jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

  t = jax.lax.cond(jnp.any(greedy), tree, skip(tree))
  c = jax.lax.cond(jnp.all(greedy), skip(chain), chain)
  b, n = t.tokens.shape
  rows = greedy[:, None]
  chain_parent = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
  onehot = jax.nn.one_hot(t.tokens, vocab_size, dtype=c.q.dtype)
  return Draft(tokens=jnp.where(rows, t.tokens, c.tokens),
               q=jnp.where(rows[:, :, None], onehot, c.q),
               parent=jnp.where(rows, t.parent, chain_parent))


def check_options(top_k: int, depth: int) -> None:
  """The tree options every chain head takes (EAGLE-3, MTP): both >= 1 for a tree, both 0 for a
  chain."""
  if (top_k > 0) != (depth > 0) or top_k < 0 or depth < 0:
    raise ValueError(f"EAGLE-2 trees need both tree_top_k >= 1 and tree_depth >= 1 (or neither: "
                     f"a chain), got tree_top_k={top_k}, tree_depth={depth}")
