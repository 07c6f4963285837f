"""External draft model: any `models` LM sharing the target's vocabulary, with its own KV cache kept
in step with acceptance; and the layer-skip self-draft (the target's first k layers + final norm +
head), a real draft model that needs no training.

Each round re-feeds the last two committed tokens (a T=2 step at cache length - 2) before drafting
the rest one token at a time. That one extra token keeps the draft cache consistent after any
acceptance pattern, including "all accepted" (whose last draft token the draft model never saw),
without per-row shapes or a catch-up step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters import registry
from jspec.drafters.base import Context, Draft, Drafter, draft_chain, draft_token
from models.kv_cache import KVCache
from models.llama import Llama


@dataclasses.dataclass(frozen=True)
class DraftModelDrafter(Drafter):
  graphdef: Any            # nnx.GraphDef of the draft model (hashable, static)
  num_draft: int
  sample: bool = True      # sample from the processed q (recorded); False: argmax, q = None
  target_taps: tuple[int, ...] = ()
  variable_length = True   # propose(num=...) drafts only num tokens (one serial step each)

  @classmethod
  def from_model(cls, model: Llama, num_draft: int, *, sample: bool = True):
    """Returns (drafter, params)."""
    graphdef, params = nnx.split(model)
    return cls(graphdef=graphdef, num_draft=num_draft, sample=sample), params

  def init_state(self, params, prompt: jax.Array, ctx: Context, max_len: int) -> KVCache:
    model = nnx.merge(self.graphdef, params)
    cache = model.init_cache(prompt.shape[0], max_len)
    return model(prompt, cache, num_new=ctx.prompt_len,
                 logit_indices=jnp.zeros((prompt.shape[0], 1), jnp.int32)).cache

  def commit(self, params, state, ctx: Context):
    return state

  def propose(self, params, state: KVCache, ctx: Context, key: jax.Array, num=None):
    model = nnx.merge(self.graphdef, params)
    b = ctx.length.shape[0]
    rows = jnp.arange(b)
    last_two = jnp.stack([ctx.tokens[rows, ctx.length - 2], ctx.tokens[rows, ctx.length - 1]], 1)
    out = model(last_two, state.with_lengths(ctx.length - 2),
                logit_indices=jnp.ones((b, 1), jnp.int32))

    def pick(logits, i):   # [B, V] -> token [B], q [B, V] | None
      return draft_token(logits, ctx.sampling, key, i, self.sample)

    tok, q0 = pick(out.logits[:, 0], 0)

    def step(carry, i):
      cache, tok = carry
      o = model(tok[:, None], cache)
      nxt, q = pick(o.logits[:, 0], i)
      return (o.cache, nxt), (nxt, q)

    (cache, _), tokens, q = draft_chain(step, (out.cache, tok), (tok, q0), self.num_draft, num)
    length = None if num is None else jnp.full((b,), num, jnp.int32)
    return Draft(tokens=tokens, q=q, length=length), cache


def layer_skip_model(target: Llama, num_layers: int) -> Llama:
  """The target's first `num_layers` layers + its final norm and LM head, sharing its weights."""
  cfg = target.config
  if not 1 <= num_layers < cfg.num_layers:
    raise ValueError(f"layer-skip needs 1 <= num_layers < {cfg.num_layers} (the target's depth), "
                     f"got {num_layers}")
  small = dataclasses.replace(cfg, num_layers=num_layers)
  model = nnx.eval_shape(lambda: Llama(small, dtype=target.activation_dtype,
                                       attention_impl=target.attention_impl,
                                       matmul_impl=target.matmul_impl, moe_impl=target.moe_impl))
  model.embed, model.norm = target.embed, target.norm      # every submodule is the target's own
  model.layers = nnx.List(list(target.layers)[:num_layers])
  if not cfg.tie_embeddings:
    model.lm_head = target.lm_head
  return model


@dataclasses.dataclass(frozen=True)
class DraftModelOptions:
  draft_model: str | None = None   # registered name, .gguf, folder or hub id (or pass the model)
  draft_sampling: bool = True      # sample from the processed q (recorded) vs argmax


@dataclasses.dataclass(frozen=True)
class LayerSkipOptions:
  num_layers: int | None = None    # how many of the target's layers draft (default: a quarter)
  draft_sampling: bool = True

  def __post_init__(self):
    if self.num_layers is not None and (not isinstance(self.num_layers, int)
                                        or self.num_layers < 1):
      raise ValueError(f"layer_skip num_layers must be an integer >= 1, got {self.num_layers!r}")


def _build_draft_model(opts: DraftModelOptions, num_draft: int, target: Llama,
                       draft_model: Llama | None = None):
  if draft_model is None:
    if opts.draft_model is None:
      raise ValueError("method 'draft_model' needs draft_model (a model name or path, or pass "
                       "the loaded model as draft_model=)")
    import models
    draft_model = models.load(opts.draft_model, quiet=True).model
  if draft_model.config.vocab_size != target.config.vocab_size:
    raise ValueError(f"draft model vocabulary ({draft_model.config.vocab_size}) differs from the "
                     f"target's ({target.config.vocab_size}); a draft model must share the "
                     "target's tokenizer")
  return DraftModelDrafter.from_model(draft_model, num_draft, sample=opts.draft_sampling)


def _build_layer_skip(opts: LayerSkipOptions, num_draft: int, target: Llama, draft_model=None):
  k = opts.num_layers or max(1, target.config.num_layers // 4)
  return DraftModelDrafter.from_model(layer_skip_model(target, k), num_draft,
                                      sample=opts.draft_sampling)


registry.register(registry.Method(
    "draft_model", DraftModelOptions, _build_draft_model,
    help="an external draft model sharing the target's vocabulary",
    cli_flags=(registry.CliFlag("--draft-model", "draft_model", str,
                                "model for --drafter draft-model (name, .gguf, folder, hub id)"),)))
registry.register(registry.Method(
    "layer_skip", LayerSkipOptions, _build_layer_skip,
    help="the target's first k layers + its head as the draft (no training)",
    cli_flags=(registry.CliFlag("--draft-layers", "num_layers", int,
                                "target layers the layer-skip drafter keeps (default: a quarter)"),)))
