"""DSpark (arXiv 2607.05147): DFlash's parallel backbone with the anchor slot predicting too
(`sample_from_anchor`: a block of bs slots drafts bs tokens), plus a sequential Markov head sampled
left to right and a confidence head.

Slot k's logits are U_k + B(x_{k-1}) on the draft vocabulary, x_0 the anchor (the last committed
token): vanilla B = W2 W1[x], gated B = W2 (sigmoid(W_g [h_k; W1[x]]) * W1[x]); W1 is indexed by
the draft vocabulary plus one row for every other token (the anchor may lie outside it). Tokens are
drawn from the rows' processed distributions with q recorded (argmax for greedy rows), so the
verifier's rejection sampling keeps the target's distribution. The confidence head
c_k = sigmoid(w [h_k; W1[x_{k-1}]]) estimates P(slot k survives | slots < k accepted).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters.dflash.module import DFlashConfig, DFlashModule


class DSparkModule(nnx.Module):
  """The DFlash backbone (`sample_from_anchor`), the Markov head and the confidence head."""

  def __init__(self, cfg: DFlashConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
    if not cfg.sample_from_anchor or cfg.markov_rank < 1:
      raise ValueError("a DSpark config needs sample_from_anchor=True and markov_rank >= 1")
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    h, r, vd = cfg.hidden_size, cfg.markov_rank, cfg.draft_vocab_size
    self.config = cfg
    self.backbone = DFlashModule(cfg, dtype=dtype, rngs=rngs)
    self.markov_embed = nnx.Embed(vd + 1, r, param_dtype=dtype, dtype=dtype, rngs=rngs)
    # W2 starts at zero: the untrained head adds nothing to the backbone's logits
    self.markov_proj = nnx.Linear(r, vd, use_bias=False, param_dtype=dtype, dtype=dtype,
                                  kernel_init=nnx.initializers.zeros, rngs=rngs)
    if cfg.markov_gated:
      self.markov_gate = nnx.Linear(h + r, r, param_dtype=dtype, dtype=dtype, rngs=rngs)
    if cfg.confidence:
      self.confidence_head = nnx.Linear(h + r, 1, param_dtype=dtype, dtype=dtype, rngs=rngs)

  def draft_index(self, tokens: jax.Array) -> jax.Array:
    """Target ids -> draft-vocabulary rows of W1 (Vd for a token outside the vocabulary)."""
    cfg = self.config
    table = jnp.full((cfg.vocab_size,), cfg.draft_vocab_size, jnp.int32).at[
        self.backbone.draft_to_target[...]].set(jnp.arange(cfg.draft_vocab_size, dtype=jnp.int32))
    return table[tokens]

  def markov_bias(self, h: jax.Array, prev: jax.Array) -> tuple[jax.Array, jax.Array]:
    """h [..., H] the slot's hidden state, prev [...] the previous token's draft index ->
    (the bias on the slot's draft logits [..., Vd] float32, W1[prev] [..., r])."""
    e = self.markov_embed(prev)
    z = e
    if self.config.markov_gated:
      z = jax.nn.sigmoid(self.markov_gate(jnp.concatenate([h.astype(e.dtype), e], -1))) * e
    return self.markov_proj(z).astype(jnp.float32), e

  def confidence_logit(self, h: jax.Array, e: jax.Array) -> jax.Array:
    """[..., H], W1[prev] [..., r] -> the confidence logit [...] (sigmoid: c_k)."""
    if not self.config.confidence:
      return jnp.zeros(h.shape[:-1], jnp.float32)
    x = jnp.concatenate([h.astype(e.dtype), e], -1)
    return self.confidence_head(x)[..., 0].astype(jnp.float32)
