"""DFlash (arXiv 2602.06036): a block drafter that proposes a whole block in one parallel pass.

Context features: the target's taps (jspec's tap t = the output of layer t-1) fused by `fc` and
normed, injected as extra K/V in every draft layer ("KV injection"); only this context K/V persists
across rounds (the drafter's cache holds it at committed positions 0 .. length-2). Each round the
block [anchor = the last committed token, MASK x (bs-1)] at positions length-1 .. length+bs-2 runs
non-causally through the draft layers (target-shaped Llama blocks) over [context, block], then the
final norm and the target's frozen LM-head rows of a draft vocabulary. DFlash drafts slots 1..bs-1
greedily (D = bs-1, q one-hot); DSpark (`jspec/drafters/dspark.py`) reuses this backbone with the
anchor slot predicting too (`sample_from_anchor`) and a sequential Markov head on top.

Training: `jspec/train/dflash.py`; head-folder I/O: `dflash_format.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters import registry
from jspec.drafters.base import Context, Draft
from jspec.drafters.eagle3 import DraftVocab
from models.config import LlamaConfig
from models.kv_cache import KVCache
from models.llama import Block, Llama, RMSNorm, rope
from pallas_kernels.verify_attention.reference import attend as reference_attend
from pallas_kernels.verify_attention import attend_unwritten

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
                         rngs=rngs)
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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DFlashState:
  cache: KVCache     # per draft layer, the context's K/V at committed positions 0 .. length-2


def _write_context(module: DFlashModule, cache: KVCache, taps, start: jax.Array,
                   num_valid: jax.Array) -> KVCache:
  """Writes the context K/V of the T positions start .. start+T-1 (taps [B, T, H] each) and sets
  the lengths to start + num_valid."""
  t = taps[0].shape[1]
  positions = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
  ks, vs = module.context_kv(module.context(taps), positions)
  cache = cache.with_lengths(start)
  for i, (k, v) in enumerate(zip(ks, vs)):
    cache = cache.write(i, k, v)
  return cache.with_lengths(start + num_valid)


@dataclasses.dataclass(frozen=True)
class DFlashDrafter:
  """params: {"drafter": nnx.State of the module, "embed": the target's embedding [V, H], "head":
  its LM-head rows of the draft vocabulary [Vd, H]}."""
  graphdef: Any                       # nnx.GraphDef of the module (static)
  num_draft: int
  target_taps: tuple[int, ...]

  @property
  def block_size(self) -> int:
    return self.num_draft + 1

  @classmethod
  def from_module(cls, module: DFlashModule, target: Llama, num_draft: int):
    """Returns (drafter, params); checks that the module fits the target first."""
    check_block(module.config, target.config, num_draft, "DFlash")
    graphdef, state = nnx.split(module)
    return cls(graphdef, num_draft, tuple(module.config.taps)), _params(module, state, target)

  def backbone(self, params) -> DFlashModule:
    return nnx.merge(self.graphdef, params["drafter"])

  def init_state(self, params, prompt: jax.Array, ctx: Context, max_len: int) -> DFlashState:
    module = self.backbone(params)
    b = prompt.shape[0]
    cache = KVCache.init(module.config.layer_config(), b, max_len,
                         dtype=module.fc.kernel[...].dtype)
    zeros = jnp.zeros((b,), jnp.int32)
    return DFlashState(_write_context(module, cache, ctx.target_hidden, zeros, ctx.prompt_len))

  def commit(self, params, state: DFlashState, ctx: Context) -> DFlashState:
    """The verified block's taps become context at the committed positions (the block's first
    position is the old length - 1)."""
    n = ctx.num_new
    start = ctx.length - n - 1
    return DFlashState(_write_context(self.backbone(params), state.cache, ctx.target_hidden, start,
                                      n))

  def block_hidden(self, module: DFlashModule, params, state: DFlashState, ctx: Context,
                   size: int) -> tuple[jax.Array, jax.Array]:
    """One parallel pass over [anchor, MASK x (size-1)] at positions length-1 ...: returns (the
    anchors [B], the normed hidden states [B, size, H])."""
    cache = state.cache
    b = ctx.length.shape[0]
    start = ctx.length - 1
    anchor = jnp.take_along_axis(ctx.tokens, start[:, None], axis=1)[:, 0]
    tokens = jnp.concatenate([anchor[:, None], jnp.full((b, size - 1),
                                                        module.config.mask_token_id, jnp.int32)],
                             axis=1)
    positions = start[:, None] + jnp.arange(size, dtype=jnp.int32)[None, :]
    full = jnp.ones((b, size, size), bool)           # non-causal inside the block
    window = module.config.sliding_window
    if window:
      slots = jnp.arange(cache.max_len)[None, None, :]
      mask = jnp.concatenate([(slots < cache.lengths[:, None, None])
                              & (slots > positions[:, :, None] - window), full], axis=2)

    def attend(i, q, k, v):
      if not window:
        return attend_unwritten(q, cache.k[i], cache.v[i], cache.lengths, k, v, full)
      return reference_attend(q, jnp.concatenate([cache.k[i], k.astype(cache.k[i].dtype)], 1),
                              jnp.concatenate([cache.v[i], v.astype(cache.v[i].dtype)], 1), mask)

    return anchor, module(params["embed"][tokens], positions, attend)

  def propose(self, params, state: DFlashState, ctx: Context, key: jax.Array):
    module = self.backbone(params)
    _, h = self.block_hidden(module, params, state, ctx, self.block_size)
    logits = module.target_logits(module.draft_logits(h[:, 1:], params["head"]))
    return Draft(tokens=jnp.argmax(logits, axis=-1).astype(jnp.int32)), state


def check_block(cfg: DFlashConfig, target: LlamaConfig, num_draft: int, name: str) -> None:
  cfg.check_target(target, name)
  if not 1 <= num_draft <= cfg.max_draft:
    raise ValueError(f"num_speculative_tokens must be in [1, {cfg.max_draft}] for this {name} "
                     f"head (trained on blocks of {cfg.block_size}), got {num_draft}")


def _params(module: DFlashModule, state, target: Llama) -> dict:
  """The drafter's params: its state, the target's embedding and LM-head rows of its vocabulary."""
  cfg = module.config
  full = cfg.draft_vocab_size == cfg.vocab_size
  return {"drafter": state, "embed": target.embed.embedding[...],
          "head": target.head_rows(None if full else module.draft_to_target[...])}


@dataclasses.dataclass(frozen=True)
class DFlashOptions:
  head: str | None = None        # a DFlash head folder (`jspec train dflash`; default: the head
                                 # shipped for the target, if there is one)


def _build(opts: DFlashOptions, num_draft: int, target: Llama, draft_model=None):
  from jspec.drafters import dflash_format

  if isinstance(draft_model, DFlashModule):
    module = draft_model
  else:
    module = dflash_format.load_for_target(opts.head, target, "dflash")
  return DFlashDrafter.from_module(module, target, num_draft)


registry.register(registry.Method(
    "dflash", DFlashOptions, _build,
    help="DFlash block drafter: one parallel pass drafts the block (greedy)",
    cli_flags=(registry.CliFlag("--dflash-head", "head", str,
                                "DFlash head folder (default: the shipped head for the default "
                                "model)"),)))
