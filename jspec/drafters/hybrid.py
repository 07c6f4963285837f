"""Copy where the text repeats, a learned head elsewhere: per row and per round, the draft of a
model-free copy drafter (n-gram prompt lookup) when it proposes anything, else the learned
drafter's (EAGLE-3, MTP, Medusa, DFlash, DSpark or a draft model).

The two kinds win in different places: prompt lookup on text the reply copies (code edits,
summaries and answers quoting a passage: long exact continuations, nothing to compute), a head
on open text (it predicts, but one or two tokens at a time). The choice reads only the committed
context (whether a suffix n-gram of at least `prompt_lookup_min` tokens occurred before), never
either draft's verification, so every round is an ordinary round over one chain: lossless for
both kinds and for sampled learned drafts (a copied row's q is one-hot at its tokens, as for the
copy drafter alone). The learned drafter's state is committed every round whoever drafted (its
commit reads the target's taps of the committed block, not its own drafts), and its propose is
skipped in a round where every row copies (`lax.cond`; at B = 1, every round with a match).
Under the adaptive draft length (`"auto"`) the two sides are two regimes (`regime`): the choice
reads whether a row copies this round, and how far its copy goes, before anything is drafted,
and keeps separate acceptance estimates for copied and learned drafts.

Over a tree drafter (an EAGLE-2 tree of EAGLE-3 or MTP: `tree_top_k`, `tree_depth`) the hybrid
drafts trees of the node budget: a copying row's chain is the tree whose node i hangs under node
i - 1, the other rows carry the head's tree, and the round verifies both under one ancestor mask
(jspec.tree): lossless for the same reason, whichever side a row drafts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jspec.drafters import eagle_tree, registry
from jspec.drafters.base import Context, Draft, Drafter
from jspec.drafters.model_free.ngram import NgramDrafter, NgramOptions


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HybridState:
  copy: Any
  learned: Any


@dataclasses.dataclass(frozen=True)
class HybridDrafter(Drafter):
  """params: {"copy": the copy drafter's, "learned": the learned drafter's}."""
  copy: Drafter             # model-free, deterministic chains (q None), no extra tokens
  learned: Drafter          # any chain drafter
  regimes = 2               # the adaptive length keeps one estimate per side: 0 learned, 1 copy

  def __post_init__(self):
    if self.copy.target_taps or self.copy.tree or self.copy.num_extra:
      raise ValueError(f"the hybrid's copy drafter must draft plain chains without the target's "
                       f"hidden states; {type(self.copy).__name__} does not")
    if self.learned.num_extra or self.learned.confidence_schedule:
      raise ValueError(f"the hybrid drafts chains or trees: {type(self.learned).__name__} is set to "
                       "draft extra tokens or confidence-scheduled prefixes; drop those options")
    if self.copy.num_draft != self.learned.num_draft:
      raise ValueError(f"the hybrid's drafters must draft equally many tokens, got "
                       f"{self.copy.num_draft} and {self.learned.num_draft}")

  @property
  def num_draft(self) -> int:
    return self.learned.num_draft

  @property
  def target_taps(self) -> tuple[int, ...]:
    return self.learned.target_taps

  @property
  def tree(self) -> bool:
    return self.learned.tree

  @property
  def variable_length(self) -> bool:
    return self.learned.variable_length

  def init_state(self, params, prompt, ctx: Context, max_len: int) -> HybridState:
    return HybridState(self.copy.init_state(params["copy"], prompt, ctx, max_len),
                       self.learned.init_state(params["learned"], prompt, ctx, max_len))

  def _copy(self, params, state: HybridState, ctx: Context, key):
    copy, copy_state = self.copy.propose(params["copy"], state.copy, ctx, key)
    b, d = ctx.tokens.shape[0], self.num_draft
    copy_len = jnp.full((b,), d, jnp.int32) if copy.length is None else copy.length
    return copy, copy_len, copy_state

  def regime(self, params, state: HybridState, ctx: Context):
    """([B] 1 where the row copies this round, else 0; [B] the drafts that side proposes)."""
    _, copy_len, _ = self._copy(params, state, ctx, None)
    use = copy_len > 0
    return use.astype(jnp.int32), jnp.where(use, copy_len, self.num_draft).astype(jnp.int32)

  def propose(self, params, state: HybridState, ctx: Context, key, num=None):
    b, d = ctx.tokens.shape[0], self.num_draft
    copy, copy_len, copy_state = self._copy(params, state, ctx, key)
    if num is not None:
      copy_len = jnp.minimum(copy_len, num)
    use = copy_len > 0                                                     # [B]
    extra = {} if num is None else {"num": num}

    def run(learned_state):
      return self.learned.propose(params["learned"], learned_state, ctx, key, **extra)

    shapes = jax.eval_shape(run, state.learned)
    skip = lambda s: (jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), shapes[0]), s)
    learned, learned_state = jax.lax.cond(jnp.all(use), skip, run, state.learned)
    learned_len = jnp.full((b,), d, jnp.int32) if learned.length is None else learned.length
    tokens = jnp.where(use[:, None], copy.tokens, learned.tokens)
    q = None
    if learned.q is not None:
      onehot = jax.nn.one_hot(copy.tokens, learned.q.shape[-1], dtype=learned.q.dtype)
      q = jnp.where(use[:, None, None], onehot, learned.q)
    parent = None
    if self.tree:   # a copied chain as a tree: node i's parent is block i (node i - 1; 0 = root)
      chain = jnp.broadcast_to(jnp.arange(d, dtype=jnp.int32), (b, d))
      parent = jnp.where(use[:, None], chain, learned.parent)
    draft = Draft(tokens=tokens, q=q, length=jnp.where(use, copy_len, learned_len), parent=parent)
    return draft, HybridState(copy_state, learned_state)

  def commit(self, params, state: HybridState, ctx: Context) -> HybridState:
    return dataclasses.replace(
        state, copy=self.copy.commit(params["copy"], state.copy, ctx),
        learned=self.learned.commit(params["learned"], state.learned, ctx))

  def make_request(self, prediction, batch_size: int, *, vocab_size: int, tokenizer=None):
    return self.learned.make_request(prediction, batch_size, vocab_size=vocab_size,
                                     tokenizer=tokenizer)

  def after_generate(self, params, prompts, outputs):
    return {"copy": self.copy.after_generate(params["copy"], prompts, outputs),
            "learned": self.learned.after_generate(params["learned"], prompts, outputs)}


LEARNED = ("eagle3", "mtp", "medusa", "dflash", "dspark", "draft_model", "layer_skip")


@dataclasses.dataclass(frozen=True)
class HybridOptions:
  learned: str = "eagle3"        # the learned drafter's method (a chain)
  head: str | None = None        # its head folder (default: the head shipped for the target)
  prompt_lookup_min: int = 2     # copy where a suffix n-gram of at least this many tokens
  prompt_lookup_max: int = 4     # (up to this many) occurred before
  draft_sampling: bool = True    # the learned drafter samples from its processed q vs argmax
  tree_top_k: int = 0            # > 0: the learned drafter's EAGLE-2 trees (eagle3, mtp);
  tree_depth: int = 0            # num_speculative_tokens is then the node budget

  def __post_init__(self):
    name = self.learned.replace("-", "_") if isinstance(self.learned, str) else self.learned
    if name not in LEARNED:
      raise ValueError(f"hybrid learned={self.learned!r}: choose one of {', '.join(LEARNED)}")
    object.__setattr__(self, "learned", name)
    NgramOptions(self.prompt_lookup_min, self.prompt_lookup_max)   # validates the sizes
    if self.head is not None and "head" not in _fields(name):
      raise ValueError(f"hybrid learned={name!r} takes no head folder; drop head")
    eagle_tree.check_options(self.tree_top_k, self.tree_depth)
    if self.tree_top_k and "tree_top_k" not in _fields(name):
      raise ValueError(f"hybrid learned={name!r} drafts no EAGLE-2 trees (eagle3 and mtp do); "
                       "drop tree_top_k and tree_depth")


def _fields(method: str) -> set[str]:
  return {f.name for f in dataclasses.fields(registry.get(method).options)}


def _build(opts: HybridOptions, num_draft: int, target, draft_model=None):
  entry = registry.get(opts.learned)
  keys = {"head": opts.head, "draft_sampling": opts.draft_sampling,
          "tree_top_k": opts.tree_top_k or None, "tree_depth": opts.tree_depth or None}
  learned, params = entry.build(
      entry.options(**{k: v for k, v in keys.items() if k in _fields(opts.learned)
                       and v is not None}), num_draft, target, draft_model)
  copy = NgramDrafter(num_draft, opts.prompt_lookup_min, opts.prompt_lookup_max)
  return HybridDrafter(copy, learned), {"copy": None, "learned": params}


registry.register(registry.Method(
    "hybrid", HybridOptions, _build,
    help="n-gram prompt lookup where a suffix n-gram repeats, a learned drafter elsewhere",
    cli_flags=(registry.CliFlag("--learned", "learned", str,
                                f"the hybrid's learned drafter ({', '.join(LEARNED)})"),
               registry.CliFlag("--head", "head", str, "the learned drafter's head folder"),
               registry.CliFlag("--ngram-min", "prompt_lookup_min", int, "shortest n-gram"),
               registry.CliFlag("--ngram-max", "prompt_lookup_max", int, "longest n-gram"),
               registry.CliFlag("--tree-top-k", "tree_top_k", int,
                                "the learned drafter's EAGLE-2 tree: children per node"),
               registry.CliFlag("--tree-depth", "tree_depth", int,
                                "the learned drafter's EAGLE-2 tree: depth"))))
