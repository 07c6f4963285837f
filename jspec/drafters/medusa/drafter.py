"""The medusa drafter (the engine's side): see module.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters import static_tree
from jspec.drafters.base import Context, Draft, Drafter, draft_token
from jspec.drafters.medusa.module import MedusaHead, attach_target_rows, final_norm
from models.llama import Llama


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MedusaState:
  hidden: jax.Array        # [B, H] the target's final normed hidden state at committed position
                           # length-2 (its LM head gave the last committed token)


@dataclasses.dataclass(frozen=True)
class MedusaDrafter(Drafter):
  """params: {"head": nnx.State of a MedusaHead, "norm": the target's final norm scale [H]}."""
  graphdef: Any                       # nnx.GraphDef of the head (static)
  num_draft: int
  target_taps: tuple[int, ...]        # (L,): the last layer's output, before the final norm
  rms_eps: float                      # the target's final norm epsilon
  sample: bool = True                 # sample from the processed q (recorded) vs argmax
  tree_parent: tuple[int, ...] = ()   # a static tree (jspec.drafters.static_tree): per node its
  tree_depth: tuple[int, ...] = ()    # parent's block index, depth (the head is depth - 1) and
  tree_rank: tuple[int, ...] = ()     # the rank of its candidate; () = a chain

  @property
  def tree(self) -> bool:
    return bool(self.tree_parent)

  @classmethod
  def from_head(cls, head: MedusaHead, target: Llama, num_draft: int, *, sample: bool = True,
                tree_choices=None):
    """Returns (drafter, params); checks that the head fits the target and D first.
    tree_choices: rank paths (Medusa's format, e.g. [(0,), (1,), (0, 0)]) of a static tree of
    num_draft nodes, or None for a chain."""
    cfg = head.config
    cfg.check_target(target.config)
    attach_target_rows(head, target)
    if tree_choices is not None:
      parent, depth, rank = static_tree.tree_arrays(tree_choices)
      if len(parent) != num_draft:
        raise ValueError(f"a Medusa tree's num_speculative_tokens is its node count: "
                         f"{len(parent)} choices given with num_speculative_tokens={num_draft}")
      if depth.max() > cfg.num_heads or rank.max() >= cfg.draft_vocab_size:
        raise ValueError(f"Medusa tree choices go {depth.max()} deep and to rank {rank.max()}; "
                         f"the head has {cfg.num_heads} heads over {cfg.draft_vocab_size} tokens")
      graphdef, state = nnx.split(head)
      params = {"head": state, "norm": target.norm.scale[...]}
      return cls(graphdef, num_draft, (target.config.num_layers,), float(target.config.rms_eps),
                 False, tuple(parent.tolist()), tuple(depth.tolist()),
                 tuple(rank.tolist())), params
    if num_draft > cfg.num_heads:
      raise ValueError(f"Medusa drafts at most one token per head: num_speculative_tokens="
                       f"{num_draft} exceeds the head's {cfg.num_heads} heads; use "
                       f"num_speculative_tokens <= {cfg.num_heads} (draft_lengths too) or a head "
                       f"trained with more heads (--num-heads)")
    graphdef, state = nnx.split(head)
    params = {"head": state, "norm": target.norm.scale[...]}
    return cls(graphdef, num_draft, (target.config.num_layers,), float(target.config.rms_eps),
               sample), params

  def _hidden_at(self, params, taps: tuple[jax.Array, ...], idx: jax.Array) -> jax.Array:
    """The normed final hidden state [B, H] at per-row block positions idx [B]."""
    x = jnp.take_along_axis(taps[0], jnp.maximum(idx, 0)[:, None, None], axis=1)[:, 0]
    return final_norm(x, params["norm"], self.rms_eps)

  def init_state(self, params, prompt: jax.Array, ctx: Context, max_len: int) -> MedusaState:
    return MedusaState(self._hidden_at(params, ctx.target_hidden, ctx.prompt_len - 1))

  def commit(self, params, state: MedusaState, ctx: Context) -> MedusaState:
    """Block position num_new-1 holds committed position length-2; finished rows keep theirs."""
    n = ctx.num_new                                              # [B]
    hidden = self._hidden_at(params, ctx.target_hidden, n - 1)
    return MedusaState(jnp.where((n > 0)[:, None], hidden, state.hidden))

  def logits(self, params, state: MedusaState, num_heads: int | None = None) -> jax.Array:
    """Draft-vocabulary logits [B, K', Vd] float32 of the first num_heads heads."""
    head = nnx.merge(self.graphdef, params["head"])
    return head(state.hidden, num_heads)

  def propose(self, params, state: MedusaState, ctx: Context, key: jax.Array):
    if self.tree:    # node i: the rank-r candidate of head depth-1 (deterministic, q = None)
      ids, _ = self.topk(params, state, max(self.tree_rank) + 1)        # [B, K, k]
      tokens = ids[:, jnp.asarray(self.tree_depth) - 1, jnp.asarray(self.tree_rank)]
      parent = jnp.broadcast_to(jnp.asarray(self.tree_parent, jnp.int32), tokens.shape)
      return Draft(tokens=tokens.astype(jnp.int32), parent=parent), state
    head = nnx.merge(self.graphdef, params["head"])
    logits = head.target_logits(head(state.hidden, self.num_draft))    # [B, D, V]
    picks = [draft_token(logits[:, i], ctx.sampling, key, i, self.sample)
             for i in range(self.num_draft)]
    tokens = jnp.stack([t for t, _ in picks], axis=1)                   # [B, D]
    q = None if not self.sample else jnp.stack([q for _, q in picks], axis=1)   # [B, D, V]
    return Draft(tokens=tokens, q=q), state

  def topk(self, params, state: MedusaState, k: int) -> tuple[jax.Array, jax.Array]:
    """Per head (all K of the head, not only D) its k most likely tokens: target ids [B, K, k]
    int32 and their log-probabilities [B, K, k] float32 under the head's own softmax over the
    draft vocabulary (no temperature / top-k / top-p), best first. Head i's candidates are for
    the token i+1 after the last committed one (the first draft position is head 0's)."""
    head = nnx.merge(self.graphdef, params["head"])
    vd = head.config.draft_vocab_size
    if not 1 <= k <= vd:
      raise ValueError(f"Medusa topk k must be in [1, {vd}] (the draft vocabulary), got {k}")
    logp = jax.nn.log_softmax(head(state.hidden), axis=-1)              # [B, K, Vd]
    top, idx = jax.lax.top_k(logp, k)                                   # [B, K, k]
    return head.draft_to_target[...][idx], top
