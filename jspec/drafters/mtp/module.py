"""MTP (DeepSeek-V3 multi-token prediction) as a chain speculator: one module over the target's
final normed hidden state and the next token's embedding, used recursively for D > 1, with its own
KV cache.

Layout (DeepSeek-V3 `num_nextn_predict_layers`, vLLM `deepseek_mtp.py`): x = eh_proj([enorm(emb);
hnorm(prev)]) (embedding first), one decoder layer with the target's shapes, then the shared head
(the target's final norm and LM head, passed in, never copied). Step 1's prev is the target's
final normed hidden h_i with token t_{i+1}; step k > 1 feeds the module's own output through the
shared norm with the token it just drafted. Checkpoint and head-folder I/O: `checkpoint.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters.shared import AttendFn, DraftVocab
from models import cpu_gemm
from models.config import LlamaConfig
from models.llama import Block, RMSNorm, rope


@dataclasses.dataclass(frozen=True)
class MTPConfig:
  hidden_size: int              # H (= the target's: the module reads its hidden states)
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  vocab_size: int               # the target's vocabulary
  draft_vocab_size: int         # Vd, the tokens the module can propose (rows of the shared head)
  rms_eps: float = 1e-5
  rope_theta: float = 10000.0
  max_position: int = 4096
  qkv_bias: bool = False        # the target family's attention options (Qwen2 / Qwen3)
  qk_norm: bool = False
  own_head_norm: bool = False   # a checkpoint's `shared_head.norm` replaces the target's final
                                # norm (DeepSeek layout); jspec-trained modules use the target's

  def __post_init__(self):
    for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                 "vocab_size"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"MTP {name} must be an integer >= 1, got {v!r}")
    if not 1 <= self.draft_vocab_size <= self.vocab_size:
      raise ValueError(f"draft_vocab_size must be in [1, {self.vocab_size}] (the target's "
                       f"vocabulary), got {self.draft_vocab_size}")

  @classmethod
  def for_target(cls, target: LlamaConfig, *, draft_vocab_size: int | None = None) -> "MTPConfig":
    """One MTP layer with the target's layer shapes (dense MLP: the target's intermediate size)."""
    return cls(hidden_size=target.hidden_size, num_heads=target.num_heads,
               num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
               intermediate_size=target.intermediate_size, vocab_size=target.vocab_size,
               draft_vocab_size=draft_vocab_size or target.vocab_size, rms_eps=target.rms_eps,
               rope_theta=target.rope_theta, max_position=target.max_position,
               qkv_bias=target.qkv_bias, qk_norm=target.qk_norm)

  def layer_config(self) -> LlamaConfig:
    """The decoder layer's shapes as a one-layer dense LlamaConfig (its Block and KV cache)."""
    return LlamaConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                       intermediate_size=self.intermediate_size, num_layers=1,
                       num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                       head_dim=self.head_dim, rope_theta=self.rope_theta, rms_eps=self.rms_eps,
                       max_position=self.max_position, qkv_bias=self.qkv_bias,
                       qk_norm=self.qk_norm)

  def check_target(self, target: LlamaConfig) -> None:
    """Raises a clear error if this module cannot draft for `target`."""
    fix = ("the MTP module was trained for another model; train one for this target with "
           "`jspec train mtp` or pass one with head=PATH (--mtp-head PATH)")
    if self.hidden_size != target.hidden_size:
      raise ValueError(f"MTP module hidden size {self.hidden_size} differs from the target's "
                       f"{target.hidden_size}: {fix}")
    if self.vocab_size != target.vocab_size:
      raise ValueError(f"MTP module vocabulary {self.vocab_size} differs from the target's "
                       f"{target.vocab_size}: {fix}")


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """`models.llama.RMSNorm` with an external scale (the target's final norm, shared)."""
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (normed * scale.astype(jnp.float32)).astype(x.dtype)


class MTPModule(nnx.Module):
  """enorm, hnorm, eh_proj and one decoder layer (`models.llama.Block`: the target's parameter
  names and shapes); the shared head's norm and rows come from the target at call time."""

  def __init__(self, cfg: MTPConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    h = cfg.hidden_size
    self.config = cfg
    self.enorm = RMSNorm(h, cfg.rms_eps, dtype=dtype)       # on the embedding of t_{i+k}
    self.hnorm = RMSNorm(h, cfg.rms_eps, dtype=dtype)       # on the previous hidden
    self.eh_proj = nnx.Linear(2 * h, h, use_bias=False, param_dtype=dtype, dtype=dtype,
                              rngs=rngs, dot_general=cpu_gemm.DotGeneral())
    self.block = Block(cfg.layer_config(), dtype=dtype, rngs=rngs)
    if cfg.own_head_norm:
      self.head_norm = RMSNorm(h, cfg.rms_eps, dtype=dtype)
    self.draft_to_target = DraftVocab(jnp.arange(cfg.draft_vocab_size, dtype=jnp.int32))

  def __call__(self, prev: jax.Array, emb: jax.Array, positions: jax.Array,
               attend: AttendFn) -> tuple[jax.Array, Any]:
    """prev [B, T, H] (a normed hidden state), emb [B, T, H] embeddings of the tokens that follow,
    positions [B, T] -> (output hidden [B, T, H] before the shared norm, attend's aux).

    attend(q [B, T, Hq, Dh], k, v [B, T, KVH, Dh]) -> (out [B, T, Hq, Dh], aux): the module's
    cache while drafting, the training-time-test mask in training."""
    cfg = self.config
    blk, attn = self.block, self.block.attn
    b, t, _ = prev.shape
    dtype = self.eh_proj.kernel[...].dtype
    x = self.eh_proj(jnp.concatenate([self.enorm(emb.astype(dtype)),
                                      self.hnorm(prev.astype(dtype))], axis=-1))   # [B, T, H]
    y = blk.input_norm(x)
    q = attn.q_proj(y).reshape(b, t, cfg.num_heads, cfg.head_dim)            # [B, T, Hq, Dh]
    k = attn.k_proj(y).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)         # [B, T, KVH, Dh]
    v = attn.v_proj(y).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
      q, k = attn.q_norm(q), attn.k_norm(k)
    q = rope(q, positions, cfg.rope_theta)
    k = rope(k, positions, cfg.rope_theta)
    out, aux = attend(q, k, v)
    x = x + attn.o_proj(out.reshape(b, t, -1))
    return x + blk.mlp(blk.post_attn_norm(x)), aux

  def shared_norm(self, h: jax.Array, norm_scale: jax.Array) -> jax.Array:
    """The shared head's norm: the next step's prev hidden and the LM head's input."""
    if self.config.own_head_norm:
      return self.head_norm(h)
    return rms_norm(h, norm_scale, self.config.rms_eps)

  def draft_logits(self, normed: jax.Array, head_rows: jax.Array) -> jax.Array:
    """[..., H] normed hidden, the shared LM head's draft-vocabulary rows [Vd, H] -> [..., Vd]."""
    return jnp.einsum("...h,vh->...v", normed.astype(head_rows.dtype), head_rows,
                      preferred_element_type=jnp.float32)

  def target_logits(self, draft_logits: jax.Array) -> jax.Array:
    """[B, Vd] -> [B, V] with -inf outside the draft vocabulary."""
    if self.config.draft_vocab_size == self.config.vocab_size:
      return draft_logits                    # the full vocabulary, in order (checked on load)
    full = jnp.full(draft_logits.shape[:-1] + (self.config.vocab_size,), -jnp.inf, jnp.float32)
    return full.at[..., self.draft_to_target[...]].set(draft_logits)
