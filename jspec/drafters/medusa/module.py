"""Medusa (chain): K heads over the target's final normed hidden state at the last verified
position; head k proposes the token k+2 positions ahead, so a round's D <= K drafts come at once.

Head k = num_layers x ResBlock (x + SiLU(W x + b), W zero-initialised: identity at init) then a
draft-vocabulary LM head (Medusa, arXiv 2401.10774): each head's own (trained, saved), or with
`lm_head="target"` the target's LM-head rows of the draft vocabulary, shared by the heads (frozen,
never saved: a large draft vocabulary costs no checkpoint bytes). Each head's distribution depends
only on the target's hidden state, never on earlier drafts, so a sampled draft records its exact q.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters.shared import LM_HEADS, DraftVocab, TargetLMHead
from models.config import LlamaConfig
from models.llama import Llama


@dataclasses.dataclass(frozen=True)
class MedusaConfig:
  hidden_size: int              # H (= the target's: the heads read its final hidden state)
  vocab_size: int               # the target's vocabulary
  draft_vocab_size: int         # Vd, the tokens a head can propose
  num_heads: int = 4            # K: head k predicts the token k+2 after its input position
  num_layers: int = 1           # ResBlocks per head
  lm_head: str = "own"          # "own": one per head, trained and saved; "target": the target's
                                # rows of the draft vocabulary, shared, frozen

  def __post_init__(self):
    if self.lm_head not in LM_HEADS:
      raise ValueError(f"Medusa lm_head must be one of {LM_HEADS}, got {self.lm_head!r}")
    for name in ("hidden_size", "vocab_size", "num_heads", "num_layers"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"Medusa {name} must be an integer >= 1, got {v!r}")
    if not 1 <= self.draft_vocab_size <= self.vocab_size:
      raise ValueError(f"draft_vocab_size must be in [1, {self.vocab_size}] (the target's "
                       f"vocabulary), got {self.draft_vocab_size}")

  @classmethod
  def for_target(cls, target: LlamaConfig, *, draft_vocab_size: int | None = None,
                 num_heads: int = 4, num_layers: int = 1, lm_head: str = "own") -> "MedusaConfig":
    return cls(hidden_size=target.hidden_size, vocab_size=target.vocab_size,
               draft_vocab_size=draft_vocab_size or target.vocab_size, num_heads=num_heads,
               num_layers=num_layers, lm_head=lm_head)

  def check_target(self, target: LlamaConfig) -> None:
    """Raises a clear error if these heads cannot draft for `target`."""
    if self.hidden_size != target.hidden_size:
      raise ValueError(f"Medusa head hidden size {self.hidden_size} differs from the target's "
                       f"{target.hidden_size}: the head was trained for another model; train one "
                       "for this target with `jspec train medusa`")
    if self.vocab_size != target.vocab_size:
      raise ValueError(f"Medusa head vocabulary {self.vocab_size} differs from the target's "
                       f"{target.vocab_size}: the head was trained for another model; train one "
                       "for this target with `jspec train medusa`")


class MedusaHead(nnx.Module):
  """All K heads, stacked: one einsum per ResBlock layer and one for the LM heads (or one product
  with the target's rows, `lm_head="target"`, filled by `attach_target_rows`)."""

  def __init__(self, cfg: MedusaConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    k, n, h, vd = cfg.num_heads, cfg.num_layers, cfg.hidden_size, cfg.draft_vocab_size
    self.config = cfg
    self.res_kernel = nnx.Param(jnp.zeros((k, n, h, h), dtype))     # [K, L, H_in, H_out]
    self.res_bias = nnx.Param(jnp.zeros((k, n, h), dtype))          # [K, L, H]
    init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
    self.lm_head = (nnx.Param(init(rngs.params(), (k, h, vd), dtype))  # [K, H, Vd]
                    if cfg.lm_head == "own" else TargetLMHead(vd, h, dtype))
    self.draft_to_target = DraftVocab(jnp.arange(vd, dtype=jnp.int32))

  def __call__(self, hidden: jax.Array, num_heads: int | None = None) -> jax.Array:
    """hidden [..., H] (the target's final normed hidden state) -> draft logits [..., K', Vd]
    float32 of the first K' = num_heads heads (default all)."""
    k = self.config.num_heads if num_heads is None else num_heads
    w, b = self.res_kernel[...][:k], self.res_bias[...][:k]
    x = jnp.broadcast_to(hidden.astype(w.dtype)[..., None, :],
                         hidden.shape[:-1] + (k, hidden.shape[-1]))           # [..., K', H]
    for layer in range(self.config.num_layers):
      x = x + jax.nn.silu(jnp.einsum("...kh,kho->...ko", x, w[:, layer]) + b[:, layer])
    if self.config.lm_head == "target":
      return self.lm_head(x).astype(jnp.float32)
    return jnp.einsum("...kh,khv->...kv", x, self.lm_head[...][:k],
                      preferred_element_type=jnp.float32)

  def target_logits(self, draft_logits: jax.Array) -> jax.Array:
    """[..., Vd] -> [..., V] with -inf outside the draft vocabulary."""
    full = jnp.full(draft_logits.shape[:-1] + (self.config.vocab_size,), -jnp.inf, jnp.float32)
    return full.at[..., self.draft_to_target[...]].set(draft_logits)


def attach_target_rows(head: MedusaHead, target: Llama) -> None:
  """Fills a `lm_head="target"` head's rows from the target (after its draft vocabulary is set); a no-op for heads with their own LM heads."""
  if head.config.lm_head == "target":
    head.lm_head.fill(target, head.draft_to_target[...])


def final_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """The target's final RMSNorm (models.llama.RMSNorm) on its last-layer tap, in float32."""
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale.astype(
      jnp.float32)
