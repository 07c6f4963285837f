"""Verification attention in plain jnp, the model's math (GQA groups, fp32 scores, probabilities in
v.dtype): the oracle for the kernels and the CPU/TPU implementation."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def attention_mask(lengths: jax.Array, t: int, s: int, tree_mask: jax.Array | None) -> jax.Array:
  """[B, T, S] bool: each new token sees the committed prefix and, among the new tokens, itself,
  its predecessors (causal) or the nodes `tree_mask[b, t, u]` allows."""
  key = jnp.arange(s)[None, None, :]                       # [1, 1, S]
  start = lengths[:, None, None]                           # [B, 1, 1]
  offset = key - start                                     # index into the new block
  if tree_mask is None:
    inside = offset <= jnp.arange(t)[None, :, None]
  else:
    idx = jnp.clip(offset, 0, t - 1)                       # [B, 1, S]
    inside = jnp.take_along_axis(tree_mask, jnp.broadcast_to(idx, (lengths.shape[0], t, s)), axis=2)
  return (key < start) | ((offset >= 0) & (offset < t) & inside)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
  """GQA attention. q [B, T, Hq, Dh], k/v [B, S, KVH, Dh], mask [B, T, S] -> [B, T, Hq, Dh]."""
  b, t, hq, dh = q.shape
  kvh = k.shape[2]
  qg = q.reshape(b, t, kvh, hq // kvh, dh)                                  # [B, T, KVH, G, Dh]
  scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32)
  scores = scores * (dh ** -0.5)
  scores = jnp.where(mask[:, None, None, :, :], scores, -jnp.inf)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)                   # [B, KVH, G, T, S]
  out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
  return out.reshape(b, t, hq, dh)


def verify_attention_reference(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array,
                               tree_mask: jax.Array | None = None, *,
                               mask: jax.Array | None = None) -> jax.Array:
  """q [B, T, Hq, Dh] for the T new tokens, whose keys/values k/v [B, S, KVH, Dh] already hold at
  slots lengths[b] .. lengths[b]+T-1; tree_mask [B, T, T] (None = causal) -> [B, T, Hq, Dh].

  mask: the [B, T, S] `attention_mask` if the caller already built it (a forward shares one across
  its layers); it must agree with lengths and tree_mask.
  """
  if mask is None:
    mask = attention_mask(lengths, q.shape[1], k.shape[1], tree_mask)
  return attend(q, k, v, mask)


def attend_unwritten_reference(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, lengths: jax.Array,
                     k_new: jax.Array, v_new: jax.Array,
                     tree_mask: jax.Array | None = None) -> jax.Array:
  """`verify_attention_reference` for a block whose keys/values are *not* in the cache: q, k_new,
  v_new [B, T, ...] for the T new tokens, the cache's slots < lengths[b] as the prefix, tree_mask
  [B, T, T] (None = causal). The cache is only read, so a caller can keep it out of a `lax.switch`
  and write the block once afterwards. Attends over [cache, block] concatenated: on XLA:CPU the
  concatenation fuses with the relayout the dot needs anyway, and measured as fast as the writing
  path, while two separate dots over cache and block measured 25% slower (B = 4, default model)."""
  b, t = q.shape[:2]
  s = k_cache.shape[1]
  k = jnp.concatenate([k_cache, k_new.astype(k_cache.dtype)], axis=1)          # [B, S+T, KVH, Dh]
  v = jnp.concatenate([v_cache, v_new.astype(v_cache.dtype)], axis=1)
  prefix = jnp.broadcast_to((jnp.arange(s)[None, :] < lengths[:, None])[:, None, :], (b, t, s))
  inside = jnp.tril(jnp.ones((t, t), bool)) if tree_mask is None else tree_mask
  mask = jnp.concatenate([prefix, jnp.broadcast_to(inside, (b, t, t))], axis=2)  # [B, T, S+T]
  return attend(q, k, v, mask)


def gather_pages(pages: jax.Array, block_tables: jax.Array) -> jax.Array:
  """Pages [P, page_size, KVH, Dh], tables [B, N] -> contiguous [B, N * page_size, KVH, Dh]."""
  b, n = block_tables.shape
  _, page_size, kvh, dh = pages.shape
  return pages[block_tables].reshape(b, n * page_size, kvh, dh)


def normalize_tables(block_tables: jax.Array, num_pages: int) -> jax.Array:
  """Block tables with every entry outside [0, num_pages) set to -1, the "no page" sentinel: a
  slot in no page holds no key (a row's pages past its length may be left unallocated)."""
  t = block_tables.astype(jnp.int32)
  return jnp.where((t >= 0) & (t < num_pages), t, -1)


def paged_verify_attention_reference(q, k_pages, v_pages, block_tables, lengths, tree_mask=None):
  """q [B, T, Hq, Dh] -> [B, T, Hq, Dh]; the contiguous reference over the gathered pages, where
  the slots of table entries outside [0, P) (-1: no page) hold no key."""
  num_pages, page_size = k_pages.shape[:2]
  tables = normalize_tables(block_tables, num_pages)
  gathered = jnp.maximum(tables, 0)
  k, v = gather_pages(k_pages, gathered), gather_pages(v_pages, gathered)
  in_page = jnp.repeat(tables >= 0, page_size, axis=1)                         # [B, S]
  mask = attention_mask(lengths, q.shape[1], k.shape[1], tree_mask) & in_page[:, None, :]
  return verify_attention_reference(q, k, v, lengths, tree_mask, mask=mask)
