"""MTP (DeepSeek-V3 multi-token prediction) as a chain speculator: one module over the target's
final normed hidden state and the next token's embedding, used recursively for D > 1, with its own
KV cache.

Layout (DeepSeek-V3 `num_nextn_predict_layers`, vLLM `deepseek_mtp.py`): x = eh_proj([enorm(emb);
hnorm(prev)]) (embedding first), one decoder layer with the target's shapes, then the shared head
(the target's final norm and LM head, passed in, never copied). Step 1's prev is the target's
final normed hidden h_i with token t_{i+1}; step k > 1 feeds the module's own output through the
shared norm with the token it just drafted. Checkpoint and head-folder I/O: `mtp_format.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters import eagle_tree, registry
from jspec.drafters.base import Context, Draft, draft_chain, draft_token
from jspec.drafters.eagle3 import AttendFn, DraftVocab, cache_attend
from models.config import LlamaConfig
from models.kv_cache import KVCache
from models.llama import Block, Llama, RMSNorm, rope


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
                              rngs=rngs)
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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MTPState:
  cache: KVCache           # the module's K/V at committed positions 0 .. length-2
  hidden: jax.Array        # [B, H] its normed output at position length-2 (the next step's prev)
  logits: jax.Array        # [B, Vd] its draft logits: the next token after the committed ones


@dataclasses.dataclass(frozen=True)
class MTPDrafter:
  """params: {"mtp": nnx.State of an MTPModule, "embed": the target's embedding [V, H], "norm":
  its final norm's scale [H], "head": its LM-head rows of the draft vocabulary [Vd, H]}."""
  graphdef: Any                       # nnx.GraphDef of the module (static)
  num_draft: int
  target_taps: tuple[int, ...]        # (L,): the last layer's output; normed here
  sample: bool = True                 # sample from the processed q (recorded) vs argmax
  attention_impl: str = "auto"
  tree_top_k: int = 0                 # > 0: EAGLE-2 dynamic trees (jspec.drafters.eagle_tree) of
  tree_depth: int = 0                 # num_draft nodes, top-k per node, to this depth
  variable_length = True              # propose(num=...) runs only num - 1 module steps (chains)

  @property
  def tree(self) -> bool:
    return self.tree_top_k > 0

  @classmethod
  def from_module(cls, module: MTPModule, target: Llama, num_draft: int, *, sample: bool = True,
                  tree_top_k: int = 0, tree_depth: int = 0):
    """Returns (drafter, params); checks that the module fits the target first. tree_top_k > 0
    drafts EAGLE-2 trees of num_draft nodes instead of chains."""
    cfg = module.config
    cfg.check_target(target.config)
    if tree_top_k or tree_depth:
      eagle_tree.check(tree_top_k, tree_depth, num_draft, cfg.draft_vocab_size)
    ids = module.draft_to_target[...]
    full = cfg.draft_vocab_size == cfg.vocab_size
    graphdef, state = nnx.split(module)
    params = {"mtp": state, "embed": target.embed.embedding[...],
              "norm": target.norm.scale[...], "head": target.head_rows(None if full else ids)}
    return cls(graphdef, num_draft, (target.config.num_layers,), sample,
               target.attention_impl, tree_top_k, tree_depth), params

  def _catch_up(self, module, params, cache: KVCache, final_hidden, next_tokens, start,
                num_valid):
    """Runs the module over a block of committed positions start .. start+T-1 whose target final
    hidden states [B, T, H] (before the norm) are known (valid: the first num_valid [B]); returns
    (cache at length start+num_valid, normed output and draft logits at the last valid one)."""
    t = next_tokens.shape[1]
    positions = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    prev = rms_norm(final_hidden, params["norm"], module.config.rms_eps)       # h^0 [B, T, H]
    a, cache = module(prev, params["embed"][next_tokens], positions,
                      cache_attend(cache.with_lengths(start), self.attention_impl))
    last = jnp.take_along_axis(a, jnp.maximum(num_valid - 1, 0)[:, None, None], axis=1)[:, 0]
    normed = module.shared_norm(last, params["norm"])
    return (cache.with_lengths(start + num_valid), normed,
            module.draft_logits(normed, params["head"]))

  def init_state(self, params, prompt: jax.Array, ctx: Context, max_len: int) -> MTPState:
    module = nnx.merge(self.graphdef, params["mtp"])
    b, p = prompt.shape
    cache = KVCache.init(module.config.layer_config(), b, max_len,
                         dtype=module.eh_proj.kernel[...].dtype)
    next_tokens = ctx.tokens[:, 1:p + 1]           # position i consumes (h_i, t_{i+1})
    cache, hidden, logits = self._catch_up(module, params, cache, ctx.target_hidden[0],
                                           next_tokens, jnp.zeros((b,), jnp.int32),
                                           ctx.prompt_len)
    return MTPState(cache, hidden, logits)

  def commit(self, params, state: MTPState, ctx: Context) -> MTPState:
    """Re-runs the module over the verified block with the target's hidden states (replacing the
    K/V it wrote from its own outputs while drafting) and keeps the accepted positions."""
    module = nnx.merge(self.graphdef, params["mtp"])
    n = ctx.num_new                                 # [B]
    start = ctx.length - n - 1                      # the block's first position (old length - 1)
    t = ctx.target_hidden[0].shape[1]               # D + 1
    idx = jnp.clip(start[:, None] + 1 + jnp.arange(t)[None, :], 0, ctx.tokens.shape[1] - 1)
    next_tokens = jnp.take_along_axis(ctx.tokens, idx, axis=1)
    cache, hidden, logits = self._catch_up(module, params, state.cache, ctx.target_hidden[0],
                                           next_tokens, start, n)
    moved = (n > 0)[:, None]                        # finished rows keep their state
    return MTPState(cache, jnp.where(moved, hidden, state.hidden),
                    jnp.where(moved, logits, state.logits))

  def propose(self, params, state: MTPState, ctx: Context, key: jax.Array, num=None):
    module = nnx.merge(self.graphdef, params["mtp"])
    if self.tree:
      def expand(prev, emb, positions, attend):
        a, aux = module(prev, emb, positions, attend)
        normed = module.shared_norm(a, params["norm"])
        return normed, module.draft_logits(normed, params["head"]), aux

      draft = eagle_tree.propose_tree(expand, module.draft_to_target[...], params["embed"],
                                      state.cache, state.hidden, state.logits, self.tree_top_k,
                                      self.tree_depth, self.num_draft)
      return draft, state

    def pick(draft_logits, i):
      return draft_token(module.target_logits(draft_logits), ctx.sampling, key, i, self.sample)

    tok, q0 = pick(state.logits, 0)

    def step(carry, i):
      cache, prev, tok = carry
      a, cache = module(prev[:, None], params["embed"][tok][:, None], cache.lengths[:, None],
                        cache_attend(cache, self.attention_impl))
      cache = cache.with_lengths(cache.lengths + 1)
      normed = module.shared_norm(a[:, 0], params["norm"])
      nxt, q = pick(module.draft_logits(normed, params["head"]), i)
      return (cache, normed, nxt), (nxt, q)

    (cache, _, _), tokens, q = draft_chain(step, (state.cache, state.hidden, tok), (tok, q0),
                                           self.num_draft, num)
    length = None if num is None else jnp.full(tok.shape, num, jnp.int32)
    return Draft(tokens=tokens, q=q, length=length), dataclasses.replace(state, cache=cache)


@dataclasses.dataclass(frozen=True)
class MTPOptions:
  head: str | None = None        # an MTP head folder (`jspec train mtp`; default: the module
                                 # shipped for the target, if there is one)
  checkpoint: str | None = None  # or a model folder whose safetensors carry MTP layers
                                 # (`num_nextn_predict_layers`), read from layer L
  draft_sampling: bool = True    # sample from the processed q (recorded) vs argmax (chains)
  tree_top_k: int = 0            # > 0: EAGLE-2 dynamic trees: top-k children per node, the
  tree_depth: int = 0            # tree's depth; num_speculative_tokens is then the node budget

  def __post_init__(self):
    if (self.tree_top_k > 0) != (self.tree_depth > 0) or self.tree_top_k < 0 or \
        self.tree_depth < 0:
      raise ValueError(f"EAGLE-2 trees need both tree_top_k >= 1 and tree_depth >= 1 (or neither: "
                       f"a chain), got tree_top_k={self.tree_top_k}, tree_depth={self.tree_depth}")
    if self.head is not None and self.checkpoint is not None:
      raise ValueError("pass either an MTP head folder (head) or a checkpoint with MTP layers "
                       "(checkpoint), not both")


def _build(opts: MTPOptions, num_draft: int, target: Llama, draft_model=None):
  from jspec.drafters import mtp_format

  if isinstance(draft_model, MTPModule):
    module = draft_model
  else:
    dtype = jax.tree_util.tree_leaves(nnx.state(target))[0].dtype
    if opts.checkpoint is not None:
      module = mtp_format.load_checkpoint_mtp(opts.checkpoint, target.config, dtype=dtype)
    else:
      path, sha = opts.head, None
      if path is None:
        path = mtp_format.shipped_head(target.config)
        sha = mtp_format.shipped(target.config)[1]
      module = mtp_format.load_mtp(path, dtype=dtype, expected_sha256=sha)
  return MTPDrafter.from_module(module, target, num_draft, sample=opts.draft_sampling,
                                tree_top_k=opts.tree_top_k, tree_depth=opts.tree_depth)


registry.register(registry.Method(
    "mtp", MTPOptions, _build,
    help="MTP module (DeepSeek-V3 layout) over the target's final hidden state (chain or "
         "EAGLE-2 tree)",
    cli_flags=(registry.CliFlag("--mtp-head", "head", str,
                                "MTP head folder (default: the shipped module for the default "
                                "model)"),
               registry.CliFlag("--mtp-checkpoint", "checkpoint", str,
                                "a model folder whose safetensors carry MTP layers "
                                "(num_nextn_predict_layers)"),
               registry.CliFlag("--tree-top-k", "tree_top_k", int,
                                "EAGLE-2 dynamic tree: children per node (0 = chain); "
                                "--num-draft is then the node budget"),
               registry.CliFlag("--tree-depth", "tree_depth", int,
                                "EAGLE-2 dynamic tree: depth"))))
