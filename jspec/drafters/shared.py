"""Pieces every learned head uses: its draft vocabulary, an LM head made of the target's rows, and
attention over its own KV cache."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from models import cpu_gemm

from models.kv_cache import KVCache
from pallas_kernels.verify_attention import verify_attention


class DraftVocab(nnx.Variable):
  """Target ids of the draft vocabulary [Vd] (not trained)."""


LM_HEADS = ("own", "target")   # a head's LM head: its own (trained, saved) or the target's rows


class TargetRows(nnx.Variable):
  """The target's LM-head rows of the draft vocabulary [Vd, H] (not trained, not saved)."""


class TargetLMHead(nnx.Module):
  """Draft logits [..., Vd] from the target's own LM-head rows of the draft vocabulary, filled
  from the target when the head is built or loaded (`fill`)."""

  def __init__(self, draft_vocab_size: int, hidden_size: int, dtype):
    self.rows = TargetRows(jnp.zeros((draft_vocab_size, hidden_size), dtype))

  def __call__(self, x: jax.Array) -> jax.Array:
    rows = self.rows[...]     # [Vd, H]: one pass over the rows on CPU (an einsum read them slower)
    return cpu_gemm.matmul(x.astype(rows.dtype), rows, transpose_w=True)

  def fill(self, target, draft_ids: jax.Array) -> None:
    """Copies the target's LM-head rows of `draft_ids` [Vd] (a models.llama.Llama)."""
    self.rows[...] = target.head_rows(draft_ids).astype(self.rows[...].dtype)


# attend(q, k, v) -> (out, aux): attention of a head layer's queries over its cache and new keys
AttendFn = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, Any]]


def cache_attend(cache: KVCache, impl: str = "auto") -> AttendFn:
  """Attention over the head's one-layer cache: writes k/v at slots lengths + t, then attends to
  the prefix and causally within the block (aux: the written cache, lengths not yet advanced)."""
  def attend(q, k, v):
    c = cache.write(0, k, v)
    return verify_attention(q, c.k[0], c.v[0], c.lengths, impl=impl), c
  return attend
