"""The dflash drafter (the engine's side): see module.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters.base import Context, Draft, Drafter
from jspec.drafters.dflash.module import DFlashConfig, DFlashModule
from models.config import LlamaConfig
from models.kv_cache import KVCache
from models.llama import Llama
from pallas_kernels.verify_attention import attend_unwritten
from pallas_kernels.verify_attention.reference import attend as reference_attend

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
class DFlashDrafter(Drafter):
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
    return (cls(graphdef, num_draft, tuple(module.config.taps)),
            drafter_params(module, state, target))

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


def drafter_params(module: DFlashModule, state, target: Llama) -> dict:
  """The drafter's params: its state, the target's embedding and LM-head rows of its vocabulary."""
  cfg = module.config
  full = cfg.draft_vocab_size == cfg.vocab_size
  return {"drafter": state, "embed": target.embed_table(),
          "head": target.head_rows(None if full else module.draft_to_target[...])}
