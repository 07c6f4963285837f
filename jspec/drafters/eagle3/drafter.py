"""The eagle3 drafter (the engine's side): see module.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters import eagle_tree
from jspec.drafters.base import Context, Draft, Drafter, draft_chain, draft_token
from jspec.drafters.eagle3.module import Eagle3Head, attach_target_rows
from jspec.drafters.shared import cache_attend
from models.kv_cache import KVCache
from models.llama import Llama


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Eagle3State:
  cache: KVCache           # the head's K/V at committed positions 0 .. length-2
  feature: jax.Array       # [B, H] the head's output at position length-2
  logits: jax.Array        # [B, Vd] its draft logits: the next token after the committed ones


@dataclasses.dataclass(frozen=True)
class Eagle3Drafter(Drafter):
  """params: {"head": nnx.State of an Eagle3Head, "embed": the target's embedding [V, H]}."""
  graphdef: Any                       # nnx.GraphDef of the head (static)
  num_draft: int
  target_taps: tuple[int, ...]
  sample: bool = True                 # sample from the processed q (recorded) vs argmax (a tree
                                      # drafter: sampled rows draft the chain, greedy rows the tree)
  attention_impl: str = "auto"
  tree_top_k: int = 0                 # > 0: EAGLE-2 dynamic trees (jspec.drafters.eagle_tree) of
  tree_depth: int = 0                 # num_draft nodes, top-k per node, to this depth
  variable_length = True              # propose(num=...) runs only num - 1 head steps (chains)

  @property
  def tree(self) -> bool:
    return self.tree_top_k > 0

  @classmethod
  def from_head(cls, head: Eagle3Head, target: Llama, num_draft: int, *, sample: bool = True,
                tree_top_k: int = 0, tree_depth: int = 0):
    """Returns (drafter, params); checks that the head fits the target first. tree_top_k > 0
    drafts EAGLE-2 trees of num_draft nodes instead of chains."""
    head.config.check_target(target.config)
    if tree_top_k or tree_depth:
      eagle_tree.check(tree_top_k, tree_depth, num_draft, head.config.draft_vocab_size)
    attach_target_rows(head, target)
    graphdef, state = nnx.split(head)
    params = {"head": state, "embed": target.embed_table()}
    return cls(graphdef, num_draft, tuple(head.config.taps), sample,
               target.attention_impl, tree_top_k, tree_depth), params

  def _catch_up(self, head, embed, cache: KVCache, taps, next_tokens, start, num_valid):
    """Runs the head over a block of committed positions start .. start+T-1 whose target taps are
    known (valid: the first num_valid [B]); returns (cache at length start+num_valid, the output
    feature and draft logits at the last valid position)."""
    t = next_tokens.shape[1]
    positions = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    a, cache = head.layer(head.fuse(taps), embed[next_tokens], positions,
                          cache_attend(cache.with_lengths(start), self.attention_impl))
    last = jnp.take_along_axis(a, jnp.maximum(num_valid - 1, 0)[:, None, None], axis=1)[:, 0]
    return cache.with_lengths(start + num_valid), last, head.draft_logits(last)

  def init_state(self, params, prompt: jax.Array, ctx: Context, max_len: int) -> Eagle3State:
    head = nnx.merge(self.graphdef, params["head"])
    b, p = prompt.shape
    cache = KVCache.init(head.config.layer_config(), b, max_len, dtype=head.dtype)
    next_tokens = ctx.tokens[:, 1:p + 1]           # the token after each prompt position
    cache, feature, logits = self._catch_up(head, params["embed"], cache, ctx.target_hidden,
                                            next_tokens, jnp.zeros((b,), jnp.int32),
                                            ctx.prompt_len)
    return Eagle3State(cache, feature, logits)

  def commit(self, params, state: Eagle3State, ctx: Context) -> Eagle3State:
    """Re-runs the head over the verified block with the target's taps (replacing the K/V it wrote
    from its own features while drafting) and keeps the accepted positions."""
    head = nnx.merge(self.graphdef, params["head"])
    n = ctx.num_new                                 # [B]
    start = ctx.length - n - 1                      # the block's first position (old length - 1)
    t = ctx.target_hidden[0].shape[1]               # D + 1
    idx = jnp.clip(start[:, None] + 1 + jnp.arange(t)[None, :], 0, ctx.tokens.shape[1] - 1)
    next_tokens = jnp.take_along_axis(ctx.tokens, idx, axis=1)
    cache, feature, logits = self._catch_up(head, params["embed"], state.cache, ctx.target_hidden,
                                            next_tokens, start, n)
    moved = (n > 0)[:, None]                        # finished rows keep their state
    return Eagle3State(cache, jnp.where(moved, feature, state.feature),
                       jnp.where(moved, logits, state.logits))

  def propose(self, params, state: Eagle3State, ctx: Context, key: jax.Array, num=None):
    head = nnx.merge(self.graphdef, params["head"])
    embed = params["embed"]
    if self.tree:
      def expand(feature, emb, positions, attend):
        a, aux = head.layer(feature, emb, positions, attend)
        return a, head.draft_logits(a), aux

      tree = lambda: eagle_tree.propose_tree(expand, head.draft_to_target[...], embed,
                                             state.cache, state.feature, state.logits,
                                             self.tree_top_k, self.tree_depth, self.num_draft)
      chain = lambda: self._chain(head, embed, state, ctx, key, None)[0]
      return eagle_tree.tree_or_sampled_chain(ctx.sampling.greedy, tree, chain,
                                              head.config.vocab_size, self.sample), state
    draft, cache = self._chain(head, embed, state, ctx, key, num)
    return draft, dataclasses.replace(state, cache=cache)

  def _chain(self, head, embed, state: Eagle3State, ctx: Context, key, num):
    """The chain of num_draft drafts (the first `num` when given): (Draft, the head's cache)."""
    def pick(draft_logits, i):
      return draft_token(head.target_logits(draft_logits), ctx.sampling, key, i, self.sample)

    tok, q0 = pick(state.logits, 0)

    def step(carry, i):
      cache, feature, tok = carry
      a, cache = head.layer(feature[:, None], embed[tok][:, None], cache.lengths[:, None],
                            cache_attend(cache, self.attention_impl))
      cache = cache.with_lengths(cache.lengths + 1)
      nxt, q = pick(head.draft_logits(a[:, 0]), i)
      return (cache, a[:, 0], nxt), (nxt, q)

    (cache, _, _), tokens, q = draft_chain(step, (state.cache, state.feature, tok), (tok, q0),
                                           self.num_draft, num)
    length = None if num is None else jnp.full(tok.shape, num, jnp.int32)
    return Draft(tokens=tokens, q=q, length=length), cache
