"""EAGLE-3 (chain): a one-layer head over the target's fused hidden taps, drafting D tokens one
step at a time from its own output features, with its own KV cache kept in step with acceptance.

One `Eagle3Head.layer` forward serves drafting (attention over the head's cache) and training
(`jspec/train/eagle3.py`: training-time-test attention). Draft vocabulary: the head predicts Vd
tokens, mapped to target ids by `draft_to_target` (sorted ascending); others are never proposed.
Its LM head is its own (trained, saved) or, with `lm_head="target"`, the target's LM-head rows of
the draft vocabulary (frozen, never saved: a large draft vocabulary costs no checkpoint bytes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters.shared import LM_HEADS, AttendFn, DraftVocab, TargetLMHead
from models import cpu_gemm
from models.config import LlamaConfig
from models.llama import MLP, Llama, RMSNorm, rope


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
  hidden_size: int              # H (= the target's: the head reads the target's embeddings)
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  vocab_size: int               # the target's vocabulary
  draft_vocab_size: int         # Vd, the tokens the head can propose
  taps: tuple[int, ...]         # target layers whose *entering* residual stream is fused
  rms_eps: float = 1e-5
  rope_theta: float = 10000.0
  max_position: int = 4096
  lm_head: str = "own"          # "own": trained and saved; "target": the target's rows, frozen

  def __post_init__(self):
    if self.lm_head not in LM_HEADS:
      raise ValueError(f"EAGLE-3 lm_head must be one of {LM_HEADS}, got {self.lm_head!r}")
    if not 1 <= self.draft_vocab_size <= self.vocab_size:
      raise ValueError(f"draft_vocab_size must be in [1, {self.vocab_size}] (the target's "
                       f"vocabulary), got {self.draft_vocab_size}")
    if not self.taps:
      raise ValueError("EAGLE-3 needs at least one target tap")

  @classmethod
  def for_target(cls, target: LlamaConfig, *, draft_vocab_size: int | None = None,
                 taps: tuple[int, ...] | None = None, lm_head: str = "own") -> "Eagle3Config":
    """The published defaults: taps entering layers (2, L//2, L-3), the target's layer shapes."""
    n = target.num_layers
    taps = tuple(taps) if taps is not None else (min(2, n - 1), n // 2, max(n - 3, 0))
    for t in taps:
      if not 0 <= t < n:
        raise ValueError(f"EAGLE-3 tap {t} is outside the target's layers [0, {n})")
    return cls(hidden_size=target.hidden_size, num_heads=target.num_heads,
               num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
               intermediate_size=target.intermediate_size, vocab_size=target.vocab_size,
               draft_vocab_size=draft_vocab_size or target.vocab_size, taps=taps,
               rms_eps=target.rms_eps, rope_theta=target.rope_theta,
               max_position=target.max_position, lm_head=lm_head)

  def layer_config(self) -> LlamaConfig:
    """The draft layer's shapes as a one-layer LlamaConfig (for its MLP and KV cache)."""
    return LlamaConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                       intermediate_size=self.intermediate_size, num_layers=1,
                       num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                       head_dim=self.head_dim, rope_theta=self.rope_theta, rms_eps=self.rms_eps,
                       max_position=self.max_position)

  def check_target(self, target: LlamaConfig) -> None:
    """Raises a clear error if this head cannot draft for `target`."""
    if self.hidden_size != target.hidden_size:
      raise ValueError(f"EAGLE-3 head hidden size {self.hidden_size} differs from the target's "
                       f"{target.hidden_size}: the head was trained for another model")
    if self.vocab_size != target.vocab_size:
      raise ValueError(f"EAGLE-3 head vocabulary {self.vocab_size} differs from the target's "
                       f"{target.vocab_size}: the head was trained for another model")
    for t in self.taps:
      if not 0 <= t < target.num_layers:
        raise ValueError(f"EAGLE-3 head tap {t} is outside the target's {target.num_layers} "
                         "layers: the head was trained for another model")


class Eagle3Head(nnx.Module):
  """fc over the concatenated taps, one decoder layer over [norm(embed(token)); norm(feature)],
  its own final norm and a draft-vocabulary LM head. The target's embedding is passed in, never
  copied."""

  def __init__(self, cfg: Eagle3Config, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    h, nq, nkv, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    lin = lambda i, o: nnx.Linear(i, o, use_bias=False, param_dtype=dtype, dtype=dtype, rngs=rngs,
                                  dot_general=cpu_gemm.DotGeneral())   # drafts: one weight pass
    self.config = cfg
    self.dtype = jnp.dtype(dtype)     # activations and cache (weights may be kept as stored)
    self.fc = lin(len(cfg.taps) * h, h)
    self.input_layernorm = RMSNorm(h, cfg.rms_eps, dtype=dtype)     # on the token embedding
    self.hidden_norm = RMSNorm(h, cfg.rms_eps, dtype=dtype)         # on the feature
    self.q_proj = lin(2 * h, nq * dh)
    self.k_proj = lin(2 * h, nkv * dh)
    self.v_proj = lin(2 * h, nkv * dh)
    self.o_proj = lin(nq * dh, h)
    self.post_attention_layernorm = RMSNorm(h, cfg.rms_eps, dtype=dtype)
    self.mlp = MLP(cfg.layer_config(), dtype=dtype, rngs=rngs)
    self.norm = RMSNorm(h, cfg.rms_eps, dtype=dtype)
    self.lm_head = (lin(h, cfg.draft_vocab_size) if cfg.lm_head == "own"
                    else TargetLMHead(cfg.draft_vocab_size, h, dtype))
    self.draft_to_target = DraftVocab(jnp.arange(cfg.draft_vocab_size, dtype=jnp.int32))

  def fuse(self, taps: tuple[jax.Array, ...]) -> jax.Array:
    """Target taps, each [B, T, H] -> the fused feature g [B, T, H]."""
    return self.fc(jnp.concatenate([t.astype(self.dtype) for t in taps], axis=-1))

  def layer(self, feature: jax.Array, emb: jax.Array, positions: jax.Array,
            attend: AttendFn) -> tuple[jax.Array, Any]:
    """feature [B, T, H] (fused taps or the head's previous output), emb [B, T, H] embeddings of
    the tokens that follow, positions [B, T] -> (output feature [B, T, H], attend's aux).

    attend(q [B, T, Hq, Dh], k, v [B, T, KVH, Dh]) -> (out [B, T, Hq, Dh], aux): the cache during
    drafting, the training-time-test mask during training."""
    cfg = self.config
    b, t, _ = feature.shape
    x = jnp.concatenate([self.input_layernorm(emb.astype(feature.dtype)),
                         self.hidden_norm(feature)], axis=-1)                  # [B, T, 2H]
    q = self.q_proj(x).reshape(b, t, cfg.num_heads, cfg.head_dim)              # [B, T, Hq, Dh]
    k = self.k_proj(x).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)           # [B, T, KVH, Dh]
    v = self.v_proj(x).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    q = rope(q, positions, cfg.rope_theta)
    k = rope(k, positions, cfg.rope_theta)
    out, aux = attend(q, k, v)
    a = feature + self.o_proj(out.reshape(b, t, -1))
    return a + self.mlp(self.post_attention_layernorm(a)), aux

  def draft_logits(self, a: jax.Array) -> jax.Array:
    """[..., H] -> [..., Vd] float32."""
    return self.lm_head(self.norm(a)).astype(jnp.float32)

  def target_logits(self, draft_logits: jax.Array) -> jax.Array:
    """[B, Vd] -> [B, V] with -inf outside the draft vocabulary."""
    full = jnp.full(draft_logits.shape[:-1] + (self.config.vocab_size,), -jnp.inf, jnp.float32)
    return full.at[..., self.draft_to_target[...]].set(draft_logits)


def attach_target_rows(head: Eagle3Head, target: Llama) -> None:
  """Fills a `lm_head="target"` head's rows from the target (after its draft vocabulary is set);
  a no-op for a head with its own LM head."""
  if head.config.lm_head == "target":
    head.lm_head.fill(target, head.draft_to_target[...])
