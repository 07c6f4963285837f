"""Pieces every learned head uses: its draft vocabulary and attention over its own KV cache."""

from __future__ import annotations

from typing import Any, Callable

import jax
from flax import nnx

from models.kv_cache import KVCache
from pallas_kernels.verify_attention import verify_attention


class DraftVocab(nnx.Variable):
  """Target ids of the draft vocabulary [Vd] (not trained)."""


# attend(q, k, v) -> (out, aux): attention of a head layer's queries over its cache and new keys
AttendFn = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, Any]]


def cache_attend(cache: KVCache, impl: str = "auto") -> AttendFn:
  """Attention over the head's one-layer cache: writes k/v at slots lengths + t, then attends to
  the prefix and causally within the block (aux: the written cache, lengths not yet advanced)."""
  def attend(q, k, v):
    c = cache.write(0, k, v)
    return verify_attention(q, c.k[0], c.v[0], c.lengths, impl=impl), c
  return attend
