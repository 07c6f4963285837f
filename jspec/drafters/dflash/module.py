"""DFlash (arXiv 2602.06036): a block drafter that proposes a whole block in one parallel pass.

Context features: the target's taps (jspec's tap t = the output of layer t-1) fused by `fc` and
normed, injected as extra K/V in every draft layer ("KV injection"); only this context K/V persists
across rounds (the drafter's cache holds it at committed positions 0 .. length-2). Each round the
block [anchor = the last committed token, MASK x (bs-1)] at positions length-1 .. length+bs-2 runs
non-causally through the draft layers (target-shaped Llama blocks) over [context, block], then the
final norm and the target's frozen LM-head rows of a draft vocabulary. DFlash drafts slots 1..bs-1
greedily (D = bs-1, q one-hot); DSpark (`jspec/drafters/dspark/`) reuses this backbone with the
anchor slot predicting too (`sample_from_anchor`) and a sequential Markov head on top.

Training: `jspec/train/dflash.py`; head-folder I/O: `checkpoint.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters.shared import DraftVocab
from models import cpu_gemm
from models.config import LlamaConfig
from models.llama import Block, RMSNorm, rope

# attend(layer, q [B, T, Hq, Dh], k, v [B, T, KVH, Dh]) -> out [B, T, Hq, Dh]
LayerAttend = Callable[[int, jax.Array, jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
  hidden_size: int              # H (= the target's: the drafter reads its embeddings and taps)
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  vocab_size: int               # the target's vocabulary
  draft_vocab_size: int         # Vd: rows of the target's LM head the drafter proposes from
  taps: tuple[int, ...]         # target taps fused into the context (tap t = output of layer t-1)
  mask_token_id: int            # the target token whose (frozen) embedding fills the MASK slots
  num_layers: int = 1           # draft layers
  block_size: int = 8           # the block trained (slots, the anchor included)
  sample_from_anchor: bool = False   # DSpark: slot k predicts the token k+1 after the anchor
                                # (bs drafts per block); DFlash: slot k>=1 predicts token k
  markov_rank: int = 0          # DSpark's Markov head rank (0 = none, DFlash)
  markov_gated: bool = False    # DSpark's gated Markov head
  confidence: bool = False      # DSpark's confidence head
  sliding_window: int = 0       # > 0: a query at position p sees context positions > p - window
                                # (DFlash's sliding-window layers; 0 = the whole context)
  rms_eps: float = 1e-5
  rope_theta: float = 10000.0
  max_position: int = 4096

  def __post_init__(self):
    for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                 "vocab_size", "num_layers"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"DFlash {name} must be an integer >= 1, got {v!r}")
    if not 1 <= self.draft_vocab_size <= self.vocab_size:
      raise ValueError(f"draft_vocab_size must be in [1, {self.vocab_size}] (the target's "
                       f"vocabulary), got {self.draft_vocab_size}")
    if not self.taps:
      raise ValueError("DFlash needs at least one target tap")
    if not 0 <= self.mask_token_id < self.vocab_size:
      raise ValueError(f"mask_token_id must be a target token id in [0, {self.vocab_size}), got "
                       f"{self.mask_token_id}")
    if self.block_size < (1 if self.sample_from_anchor else 2):
      raise ValueError(f"block_size must be >= {1 if self.sample_from_anchor else 2}, got "
                       f"{self.block_size}")
    if self.markov_rank < 0:
      raise ValueError(f"markov_rank must be >= 0, got {self.markov_rank}")
    if self.sliding_window < 0:
      raise ValueError(f"sliding_window must be >= 0 (0 = the whole context), got "
                       f"{self.sliding_window}")

  @property
  def max_draft(self) -> int:
    """Drafts per trained block: bs (DSpark) or bs - 1 (DFlash)."""
    return self.block_size if self.sample_from_anchor else self.block_size - 1

  @classmethod
  def for_target(cls, target: LlamaConfig, *, draft_vocab_size: int | None = None,
                 taps: tuple[int, ...] | None = None, mask_token_id: int = 0, **kw):
    """Target-shaped draft layers; default taps (2, L//2, L-3), EAGLE-3's (outputs of layers 1,
    L//2-1, L-4), so one feature cache serves both."""
    n = target.num_layers
    taps = tuple(taps) if taps is not None else (min(2, n), n // 2, max(n - 3, 1))
    for t in taps:
      if not 1 <= t <= n:
        raise ValueError(f"DFlash tap {t} is outside [1, {n}] (tap t = the output of layer t-1)")
    return cls(hidden_size=target.hidden_size, num_heads=target.num_heads,
               num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
               intermediate_size=target.intermediate_size, vocab_size=target.vocab_size,
               draft_vocab_size=draft_vocab_size or target.vocab_size, taps=taps,
               mask_token_id=mask_token_id, rms_eps=target.rms_eps, rope_theta=target.rope_theta,
               max_position=target.max_position, **kw)

  def layer_config(self) -> LlamaConfig:
    """The draft layers' shapes as a LlamaConfig (their Blocks and the context cache)."""
    return LlamaConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                       intermediate_size=self.intermediate_size, num_layers=self.num_layers,
                       num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                       head_dim=self.head_dim, rope_theta=self.rope_theta, rms_eps=self.rms_eps,
                       max_position=self.max_position)

  def check_target(self, target: LlamaConfig, name: str = "DFlash") -> None:
    """Raises a clear error if this drafter cannot draft for `target`."""
    fix = (f"the {name} head was trained for another model; train one for this target with "
           f"`jspec train {name.lower()}` or pass one with head=PATH")
    if self.hidden_size != target.hidden_size:
      raise ValueError(f"{name} hidden size {self.hidden_size} differs from the target's "
                       f"{target.hidden_size}: {fix}")
    if self.vocab_size != target.vocab_size:
      raise ValueError(f"{name} vocabulary {self.vocab_size} differs from the target's "
                       f"{target.vocab_size}: {fix}")
    for t in self.taps:
      if not 1 <= t <= target.num_layers:
        raise ValueError(f"{name} tap {t} is outside the target's layers: {fix}")


class DFlashModule(nnx.Module):
  """fc + hidden_norm over the taps, `num_layers` target-shaped blocks whose attention also reads
  the context's K/V, a final norm. The target's embedding and LM-head rows are passed in."""

  def __init__(self, cfg: DFlashConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    h = cfg.hidden_size
    self.config = cfg
    self.fc = nnx.Linear(len(cfg.taps) * h, h, use_bias=False, param_dtype=dtype, dtype=dtype,
                         rngs=rngs, dot_general=cpu_gemm.DotGeneral())
    self.hidden_norm = RMSNorm(h, cfg.rms_eps, dtype=dtype)
    lcfg = cfg.layer_config()
    self.layers = nnx.List([Block(lcfg, dtype=dtype, rngs=rngs) for _ in range(cfg.num_layers)])
    self.norm = RMSNorm(h, cfg.rms_eps, dtype=dtype)
    self.draft_to_target = DraftVocab(jnp.arange(cfg.draft_vocab_size, dtype=jnp.int32))

  def context(self, taps: tuple[jax.Array, ...]) -> jax.Array:
    """Target taps, each [B, T, H] -> the context features [B, T, H]."""
    dtype = self.fc.kernel[...].dtype
    return self.hidden_norm(self.fc(jnp.concatenate([t.astype(dtype) for t in taps], axis=-1)))

  def context_kv(self, ctx: jax.Array, positions: jax.Array) -> tuple[list, list]:
    """Per draft layer, the context's (k, v) [B, T, KVH, Dh] at positions [B, T]."""
    cfg = self.config
    b, t, _ = ctx.shape
    ks, vs = [], []
    for blk in self.layers:
      k = blk.attn.k_proj(ctx).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
      ks.append(rope(k, positions, cfg.rope_theta))
      vs.append(blk.attn.v_proj(ctx).reshape(b, t, cfg.num_kv_heads, cfg.head_dim))
    return ks, vs

  def __call__(self, x: jax.Array, positions: jax.Array, attend: LayerAttend) -> jax.Array:
    """Block embeddings x [B, T, H] at positions [B, T] -> normed hidden states [B, T, H]; each
    layer's attention is attend(layer, q, k, v) over the context and the block."""
    cfg = self.config
    b, t, _ = x.shape
    x = x.astype(self.fc.kernel[...].dtype)
    for i, blk in enumerate(self.layers):
      attn = blk.attn
      y = blk.input_norm(x)
      q = rope(attn.q_proj(y).reshape(b, t, cfg.num_heads, cfg.head_dim), positions,
               cfg.rope_theta)
      k = rope(attn.k_proj(y).reshape(b, t, cfg.num_kv_heads, cfg.head_dim), positions,
               cfg.rope_theta)
      v = attn.v_proj(y).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
      x = x + attn.o_proj(attend(i, q, k, v).reshape(b, t, -1))
      x = x + blk.mlp(blk.post_attn_norm(x))
    return self.norm(x)

  def draft_logits(self, h: jax.Array, rows: jax.Array) -> jax.Array:
    """[..., H] normed hidden, the target's LM-head rows of the draft vocabulary [Vd, H] ->
    [..., Vd] float32."""
    return jnp.einsum("...h,vh->...v", h.astype(rows.dtype), rows,
                      preferred_element_type=jnp.float32)

  def target_logits(self, draft_logits: jax.Array) -> jax.Array:
    """[..., Vd] -> [..., V] with -inf outside the draft vocabulary."""
    if self.config.draft_vocab_size == self.config.vocab_size:
      return draft_logits
    full = jnp.full(draft_logits.shape[:-1] + (self.config.vocab_size,), -jnp.inf, jnp.float32)
    return full.at[..., self.draft_to_target[...]].set(draft_logits)
