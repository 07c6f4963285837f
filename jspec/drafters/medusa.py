"""Medusa (chain): K heads over the target's final normed hidden state at the last verified
position; head k proposes the token k+2 positions ahead, so a round's D <= K drafts come at once.

Head k = num_layers x ResBlock (x + SiLU(W x + b), W zero-initialised: identity at init) then a
draft-vocabulary LM head (Medusa, arXiv 2401.10774). Each head's distribution depends only on the
target's hidden state, never on earlier drafts, so a sampled draft records its exact q.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters import registry, static_tree
from jspec.drafters.base import Context, Draft, draft_token
from jspec.drafters.eagle3 import DraftVocab
from models.config import LlamaConfig
from models.llama import Llama


@dataclasses.dataclass(frozen=True)
class MedusaConfig:
  hidden_size: int              # H (= the target's: the heads read its final hidden state)
  vocab_size: int               # the target's vocabulary
  draft_vocab_size: int         # Vd, the tokens a head can propose
  num_heads: int = 4            # K: head k predicts the token k+2 after its input position
  num_layers: int = 1           # ResBlocks per head

  def __post_init__(self):
    for name in ("hidden_size", "vocab_size", "num_heads", "num_layers"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"Medusa {name} must be an integer >= 1, got {v!r}")
    if not 1 <= self.draft_vocab_size <= self.vocab_size:
      raise ValueError(f"draft_vocab_size must be in [1, {self.vocab_size}] (the target's "
                       f"vocabulary), got {self.draft_vocab_size}")

  @classmethod
  def for_target(cls, target: LlamaConfig, *, draft_vocab_size: int | None = None,
                 num_heads: int = 4, num_layers: int = 1) -> "MedusaConfig":
    return cls(hidden_size=target.hidden_size, vocab_size=target.vocab_size,
               draft_vocab_size=draft_vocab_size or target.vocab_size, num_heads=num_heads,
               num_layers=num_layers)

  def check_target(self, target: LlamaConfig) -> None:
    """Raises a clear error if these heads cannot draft for `target`."""
    if self.hidden_size != target.hidden_size:
      raise ValueError(f"Medusa head hidden size {self.hidden_size} differs from the target's "
                       f"{target.hidden_size}: the head was trained for another model; train one "
                       "for this target with `jspec train medusa`")
    if self.vocab_size != target.vocab_size:
      raise ValueError(f"Medusa head vocabulary {self.vocab_size} differs from the target's "
                       f"{target.vocab_size}: the head was trained for another model; train one "
                       "for this target with `jspec train medusa`")


class MedusaHead(nnx.Module):
  """All K heads, stacked: one einsum per ResBlock layer and one for the LM heads."""

  def __init__(self, cfg: MedusaConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    k, n, h, vd = cfg.num_heads, cfg.num_layers, cfg.hidden_size, cfg.draft_vocab_size
    self.config = cfg
    self.res_kernel = nnx.Param(jnp.zeros((k, n, h, h), dtype))     # [K, L, H_in, H_out]
    self.res_bias = nnx.Param(jnp.zeros((k, n, h), dtype))          # [K, L, H]
    init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
    self.lm_head = nnx.Param(init(rngs.params(), (k, h, vd), dtype))  # [K, H, Vd]
    self.draft_to_target = DraftVocab(jnp.arange(vd, dtype=jnp.int32))

  def __call__(self, hidden: jax.Array, num_heads: int | None = None) -> jax.Array:
    """hidden [..., H] (the target's final normed hidden state) -> draft logits [..., K', Vd]
    float32 of the first K' = num_heads heads (default all)."""
    k = self.config.num_heads if num_heads is None else num_heads
    w, b, lm = self.res_kernel[...][:k], self.res_bias[...][:k], self.lm_head[...][:k]
    x = jnp.broadcast_to(hidden.astype(w.dtype)[..., None, :],
                         hidden.shape[:-1] + (k, hidden.shape[-1]))           # [..., K', H]
    for layer in range(self.config.num_layers):
      x = x + jax.nn.silu(jnp.einsum("...kh,kho->...ko", x, w[:, layer]) + b[:, layer])
    return jnp.einsum("...kh,khv->...kv", x, lm, preferred_element_type=jnp.float32)

  def target_logits(self, draft_logits: jax.Array) -> jax.Array:
    """[..., Vd] -> [..., V] with -inf outside the draft vocabulary."""
    full = jnp.full(draft_logits.shape[:-1] + (self.config.vocab_size,), -jnp.inf, jnp.float32)
    return full.at[..., self.draft_to_target[...]].set(draft_logits)


def final_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """The target's final RMSNorm (models.llama.RMSNorm) on its last-layer tap, in float32."""
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale.astype(
      jnp.float32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MedusaState:
  hidden: jax.Array        # [B, H] the target's final normed hidden state at committed position
                           # length-2 (its LM head gave the last committed token)


@dataclasses.dataclass(frozen=True)
class MedusaDrafter:
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


@dataclasses.dataclass(frozen=True)
class MedusaOptions:
  head: str | None = None        # a Medusa head folder (default: the head shipped for the
                                 # target, if there is one)
  draft_sampling: bool = True    # sample from the processed q (recorded) vs argmax (chains)
  tree_choices: Any = None       # a static tree: rank paths ([[0], [1], [0, 0], ...]) of
                                 # num_speculative_tokens nodes, or "auto": the best tree of that
                                 # many nodes for the head's measured rank accuracies
                                 # (rank_accuracy.json in its folder); None = a chain

  def __post_init__(self):
    c = self.tree_choices
    if c is not None and c != "auto":
      if isinstance(c, str) or not all(isinstance(p, (list, tuple)) for p in c):
        raise ValueError(f"tree_choices must be 'auto' or a list of rank paths such as "
                         f"[[0], [1], [0, 0]], got {c!r}")
      object.__setattr__(self, "tree_choices", tuple(tuple(int(r) for r in p) for p in c))


def _build(opts: MedusaOptions, num_draft: int, target: Llama, draft_model=None):
  from jspec.drafters import medusa_format

  if isinstance(draft_model, MedusaHead):
    head = draft_model
  else:
    path, sha = opts.head, None
    if path is None:
      path = medusa_format.shipped_head(target.config)
      sha = medusa_format.shipped(target.config)[1]
    dtype = jax.tree_util.tree_leaves(nnx.state(target))[0].dtype
    head = medusa_format.load_medusa(path, dtype=dtype, expected_sha256=sha)
  choices = opts.tree_choices
  if choices == "auto":
    if isinstance(draft_model, MedusaHead):
      raise ValueError("tree_choices='auto' reads the rank accuracies saved beside a head "
                       "folder; with a head object, give explicit tree_choices")
    choices = static_tree.best_tree(medusa_format.read_rank_accuracy(path), num_draft)
  return MedusaDrafter.from_head(head, target, num_draft, sample=opts.draft_sampling,
                                 tree_choices=choices)


registry.register(registry.Method(
    "medusa", MedusaOptions, _build,
    help="Medusa heads over the target's final hidden state (chain, D <= heads, or a static "
         "tree of D nodes)",
    cli_flags=(registry.CliFlag("--medusa-head", "head", str,
                                "Medusa head folder (default: the shipped head for the default "
                                "model)"),
               registry.CliFlag("--medusa-tree", "tree_choices", str,
                                "'auto': a static tree of --num-draft nodes chosen from the "
                                "head's measured rank accuracies"))))
