"""The mtp drafter (the engine's side): see module.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters import eagle_tree
from jspec.drafters.base import Context, Draft, Drafter, draft_chain, draft_token
from jspec.drafters.mtp.module import MTPModule, rms_norm
from jspec.drafters.shared import cache_attend
from models.kv_cache import KVCache
from models.llama import Llama


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MTPState:
  cache: KVCache           # the module's K/V at committed positions 0 .. length-2
  hidden: jax.Array        # [B, H] its normed output at position length-2 (the next step's prev)
  logits: jax.Array        # [B, Vd] its draft logits: the next token after the committed ones


@dataclasses.dataclass(frozen=True)
class MTPDrafter(Drafter):
  """params: {"mtp": nnx.State of an MTPModule, "embed": the target's embedding [V, H], "norm":
  its final norm's scale [H], "head": its LM-head rows of the draft vocabulary [Vd, H]}."""
  graphdef: Any                       # nnx.GraphDef of the module (static)
  num_draft: int
  target_taps: tuple[int, ...]        # (L,): the last layer's output; normed here
  sample: bool = True                 # sample from the processed q (recorded) vs argmax (a tree
                                      # drafter: sampled rows draft the chain, greedy rows the tree)
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
    params = {"mtp": state, "embed": target.embed_table(),
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

      tree = lambda: eagle_tree.propose_tree(expand, module.draft_to_target[...],
                                             params["embed"], state.cache, state.hidden,
                                             state.logits, self.tree_top_k, self.tree_depth,
                                             self.num_draft)
      chain = lambda: self._chain(module, params, state, ctx, key, None)[0]
      return eagle_tree.tree_or_sampled_chain(ctx.sampling.greedy, tree, chain,
                                              module.config.vocab_size, self.sample), state
    draft, cache = self._chain(module, params, state, ctx, key, num)
    return draft, dataclasses.replace(state, cache=cache)

  def _chain(self, module, params, state: MTPState, ctx: Context, key, num):
    """The chain of num_draft drafts (the first `num` when given): (Draft, the module's cache)."""
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
    return Draft(tokens=tokens, q=q, length=length), cache
