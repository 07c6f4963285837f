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

from jspec.drafters.base import Context, Draft
from jspec.sampling import process_logits
from models.kv_cache import KVCache
from models.llama import Llama


@dataclasses.dataclass(frozen=True)
class DraftModelDrafter:
  graphdef: Any            # nnx.GraphDef of the draft model (hashable, static)
  num_draft: int
  sample: bool = True      # sample from the processed q (recorded); False: argmax, q = None
  target_taps: tuple[int, ...] = ()

  @classmethod
  def from_model(cls, model: Llama, num_draft: int, *, sample: bool = True):
    """Returns (drafter, params)."""
    graphdef, params = nnx.split(model)
    return cls(graphdef=graphdef, num_draft=num_draft, sample=sample), params

  def init_state(self, params, prompt: jax.Array, ctx: Context, max_len: int) -> KVCache:
    model = nnx.merge(self.graphdef, params)
    dtype = jax.tree_util.tree_leaves(params)[0].dtype
    cache = KVCache.init(model.config, prompt.shape[0], max_len, dtype=dtype)
    return model(prompt, cache, num_new=ctx.prompt_len,
                 logit_indices=jnp.zeros((prompt.shape[0], 1), jnp.int32)).cache

  def commit(self, params, state, ctx: Context):
    return state

  def propose(self, params, state: KVCache, ctx: Context, key: jax.Array):
    model = nnx.merge(self.graphdef, params)
    b = ctx.length.shape[0]
    rows = jnp.arange(b)
    last_two = jnp.stack([ctx.tokens[rows, ctx.length - 2], ctx.tokens[rows, ctx.length - 1]], 1)
    out = model(last_two, state.with_lengths(ctx.length - 2),
                logit_indices=jnp.ones((b, 1), jnp.int32))

    def pick(logits, i):   # [B, V] -> token [B], q [B, V]
      best = jnp.argmax(logits, axis=-1).astype(jnp.int32)
      if not self.sample:
        return best, None

      def draw(_):
        logp = process_logits(logits, ctx.params)
        ks = jax.vmap(jax.random.fold_in, (0, None))(key, i)
        g = jax.vmap(lambda k: jax.random.gumbel(k, logits.shape[-1:]))(ks)
        return jnp.argmax(logp + g, axis=-1).astype(jnp.int32), jnp.exp(logp)

      # All rows greedy: q is one-hot at the argmax; skip the processing and the noise.
      onehot = lambda _: (best, jax.nn.one_hot(best, logits.shape[-1], dtype=jnp.float32))
      return jax.lax.cond(jnp.all(ctx.params.greedy), onehot, draw, None)

    tok, q0 = pick(out.logits[:, 0], 0)

    def step(carry, i):
      cache, tok = carry
      o = model(tok[:, None], cache)
      nxt, q = pick(o.logits[:, 0], i)
      return (o.cache, nxt), (nxt, q)

    (cache, _), (toks, qs) = jax.lax.scan(step, (out.cache, tok), jnp.arange(1, self.num_draft))
    tokens = jnp.concatenate([tok[:, None], jnp.moveaxis(toks, 0, 1)], axis=1)     # [B, D]
    q = None if q0 is None else jnp.concatenate([q0[:, None], jnp.moveaxis(qs, 0, 1)], axis=1)
    return Draft(tokens=tokens, q=q), cache


def layer_skip_model(target: Llama, num_layers: int) -> Llama:
  """The target's first `num_layers` layers + its final norm and LM head, sharing its weights."""
  cfg = target.config
  if not 1 <= num_layers < cfg.num_layers:
    raise ValueError(f"layer-skip needs 1 <= num_layers < {cfg.num_layers} (the target's depth), "
                     f"got {num_layers}")
  small = dataclasses.replace(cfg, num_layers=num_layers)
  dtype = jax.tree_util.tree_leaves(nnx.state(target))[0].dtype
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Llama(small, dtype=dtype)))
  source = dict(nnx.to_flat_state(nnx.state(target)))
  filled = [(path, source[path]) for path, _ in nnx.to_flat_state(abstract)]
  return nnx.merge(graphdef, nnx.from_flat_state(filled))
