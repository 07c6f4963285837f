"""Tree verification: lossless acceptance over a draft tree (EAGLE-2, Medusa, SpecInfer).

A tree draft is N nodes in topological order: node i (block index i + 1) carries a token and the
block index of its parent, `parent[i]` in [0, i] (0 = the last committed token, the root). The
target runs once over the N + 1 flattened tokens, each at position prefix + depth and seeing only
its ancestors, which gives the target distribution p[n] after every node n.

Acceptance walks from the root. At node n the current distribution r starts as p[n]; its children
are tried in index order: child c with token x, proposed from q_c (one-hot for a deterministic
child), is accepted with probability min(1, r(x) / q_c(x)); on rejection r <- normalise(max(0,
r - q_c)) and the next sibling is tried. A deterministic child's rejection zeroes x and
renormalises; children sampled i.i.d. from a recorded q get the multi-draft (recursive rejection)
rule. When no child is accepted the emitted token is drawn from the final r; at a leaf, that is
p[n] (the bonus token). Every emitted sequence is distributed as sampling from p token by token.
A chain is the tree with parent = [0, 1, .., D-1], and then this is `jspec.rejection`'s rule.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jspec.rejection import acceptance_probability, residual_distribution
from jspec.sampling import SamplingParams, categorical, process_logits
from models.kv_cache import set_rows

NONE = jnp.iinfo(jnp.int32).max     # "no accepted child"


def chain_parents(b: int, d: int) -> jax.Array:
  """The parents of a chain of d drafts: [B, D] = 0, 1, .., D-1."""
  return jnp.broadcast_to(jnp.arange(d, dtype=jnp.int32), (b, d))


def ancestor_mask(parent: jax.Array) -> jax.Array:
  """[B, N] parents -> [B, N+1, N+1] bool: block token i sees token j iff j is i or an ancestor."""
  parent = jnp.asarray(parent, jnp.int32)
  b, n = parent.shape
  eye = jnp.eye(n + 1, dtype=bool)
  rows = jnp.arange(b)

  def add(i, m):
    return m.at[:, i + 1].set(m[rows, parent[:, i]] | eye[i + 1])

  return jax.lax.fori_loop(0, n, add, jnp.broadcast_to(eye, (b, n + 1, n + 1)))


def depths(mask: jax.Array) -> jax.Array:
  """Ancestor mask [B, N+1, N+1] -> depth of each block token [B, N+1] (the root 0)."""
  return jnp.sum(mask, axis=-1, dtype=jnp.int32) - 1


def check_parents(parent) -> None:
  """Host-side check of a concrete parent array (for tests and drafters' static trees)."""
  import numpy as np
  parent = np.asarray(parent)
  n = parent.shape[-1]
  if np.any(parent < 0) or np.any(parent > np.arange(n)):
    raise ValueError("a tree's nodes must be in topological order: node i's parent must be in "
                     f"[0, i] (0 = the last committed token), got {parent.tolist()}")


def tree_outcomes(p: jax.Array, tokens: jax.Array, parent: jax.Array, q: jax.Array | None,
                  num_nodes: jax.Array | None = None):
  """The deterministic part of tree verification.

  p: [B, N+1, V] processed target probabilities after each block token; tokens, parent: [B, N];
  q: [B, N, V] the distribution each node's token was sampled from (None: every node is
  deterministic, one-hot); num_nodes: [B] valid nodes per row (the rest are never accepted).
  Returns (accept [B, N], final [B, N+1, V]): accept[b, i] is the probability that node i is
  accepted given that its parent was reached and its earlier siblings were rejected; final[b, n] is
  the distribution of the emitted token when the walk stops at n (every child rejected).
  """
  b, n = tokens.shape
  v = p.shape[-1]
  rows = jnp.arange(b)
  valid = jnp.arange(n)[None, :] < (n if num_nodes is None else num_nodes[:, None])

  def node(r, i):
    par = parent[:, i]
    r_par = r[rows, par]                                                    # [B, V]
    x = tokens[:, i]
    q_i = jax.nn.one_hot(x, v, dtype=p.dtype) if q is None else q[:, i].astype(p.dtype)
    r_x = jnp.take_along_axis(r_par, x[:, None], axis=1)[:, 0]
    q_x = None if q is None else jnp.take_along_axis(q_i, x[:, None], axis=1)[:, 0]
    a = jnp.where(valid[:, i], acceptance_probability(r_x, q_x), 0.0)
    r_new = jnp.where(valid[:, i, None], residual_distribution(r_par, q_i), r_par)
    return r.at[rows, par].set(r_new), a

  final, accept = jax.lax.scan(node, p, jnp.arange(n))
  return jnp.moveaxis(accept, 0, 1), final


def first_hits(parent: jax.Array, hit: jax.Array) -> jax.Array:
  """[B, N] parents and per-node hits -> [B, N+1]: the block index of each token's first child
  (in index order) that hits, or NONE."""
  n = parent.shape[1]
  is_child = parent[:, :, None] == jnp.arange(n + 1)[None, None, :]          # [B, N, N+1]
  idx = jnp.arange(1, n + 1, dtype=jnp.int32)[None, :, None]
  return jnp.min(jnp.where(is_child & hit[:, :, None], idx, NONE), axis=1)


def walk(parent: jax.Array, hit: jax.Array):
  """Follows first hitting children from the root. Returns (n_acc [B], path [B, N+1]: block
  indices of the accepted path, the root first; entries past n_acc are 0)."""
  b, n = parent.shape
  child = first_hits(parent, hit)
  rows = jnp.arange(b)

  def step(i, c):
    cur, n_acc, path = c
    nxt = child[rows, cur]
    go = nxt != NONE
    cur = jnp.where(go, nxt, cur)
    path = path.at[:, i + 1].set(jnp.where(go, nxt, 0))
    return cur, n_acc + go, path

  zeros = jnp.zeros((b,), jnp.int32)
  _, n_acc, path = jax.lax.fori_loop(0, n, step, (zeros, zeros, jnp.zeros((b, n + 1), jnp.int32)))
  return n_acc, path


def compact(cache, start: jax.Array, path: jax.Array):
  """Moves the K/V of the accepted path, written as a block at slots start .. start+N, to the
  contiguous slots start .. start+N (every layer; entries past the path are garbage that the next
  round overwrites). start: [B]; path: [B, N+1] block indices, root first."""
  b, t = path.shape
  rows = jnp.arange(b)[:, None]
  src = start[:, None] + path
  dst = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
  move = lambda x: set_rows(x, rows, dst, x[rows, src])
  return dataclasses.replace(cache, k=tuple(move(k) for k in cache.k),
                             v=tuple(move(v) for v in cache.v))


def _emitted(tokens, path, n_acc, last):
  """The round's output [B, N+1]: the accepted path's tokens, then `last` at index n_acc."""
  b, n = tokens.shape
  block = jnp.concatenate([jnp.zeros((b, 1), tokens.dtype), tokens], axis=1)   # block index
  out = jnp.take_along_axis(block, path[:, 1:], axis=1)                       # [B, N]
  out = jnp.concatenate([out, jnp.zeros((b, 1), tokens.dtype)], axis=1)
  out = jnp.where(jnp.arange(n + 1)[None, :] < n_acc[:, None], out, 0)
  return out.at[jnp.arange(b), n_acc].set(last)


def verify_tree(keys: jax.Array, p: jax.Array, tokens: jax.Array, parent: jax.Array,
                q: jax.Array | None, num_nodes: jax.Array | None = None):
  """Samples the walk. Returns (n_acc [B], path [B, N+1], emitted [B, N+1]): the first
  n_acc + 1 emitted tokens are the round's output; path[:, :n_acc + 1] the accepted block
  indices (root first). keys: [B] per-row PRNG keys."""
  b, n = tokens.shape
  accept, final = tree_outcomes(p, tokens, parent, q, num_nodes)
  u_key, r_key = jax.vmap(jax.random.split, out_axes=1)(keys)
  u = 1.0 - jax.vmap(lambda k: jax.random.uniform(k, (n,)))(u_key)     # (0, 1]: P(u <= a) = a
  n_acc, path = walk(parent, u <= accept)
  stop = path[jnp.arange(b), n_acc]
  last = categorical(r_key, final[jnp.arange(b), stop])
  return n_acc, path, _emitted(tokens, path, n_acc, last)


def verify_tree_greedy(logits: jax.Array, tokens: jax.Array, parent: jax.Array,
                       num_nodes: jax.Array | None = None):
  """`verify_tree` when every row is greedy: the path of children equal to the target's argmax
  after their parent (the first such sibling), then the argmax after the path's end."""
  b, n = tokens.shape
  target = jnp.argmax(logits, axis=-1).astype(jnp.int32)                     # [B, N+1]
  hit = tokens == jnp.take_along_axis(target, parent, axis=1)
  if num_nodes is not None:
    hit &= jnp.arange(n)[None, :] < num_nodes[:, None]
  n_acc, path = walk(parent, hit)
  last = target[jnp.arange(b), path[jnp.arange(b), n_acc]]
  return n_acc, path, _emitted(tokens, path, n_acc, last)


def verify(keys: jax.Array, logits: jax.Array, params: SamplingParams, tokens: jax.Array,
           parent: jax.Array, q: jax.Array | None, num_nodes: jax.Array | None = None):
  """Raw target logits [B, N+1, V] -> (n_acc, path, emitted), the cheap exact path when every row
  is greedy."""
  def general(_):
    p = jnp.exp(process_logits(logits, params))
    return verify_tree(keys, p, tokens, parent, q, num_nodes)

  return jax.lax.cond(jnp.all(params.greedy),
                      lambda _: verify_tree_greedy(logits, tokens, parent, num_nodes), general,
                      None)
