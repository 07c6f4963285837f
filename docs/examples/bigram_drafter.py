"""An example drafter from outside jspec (docs/extending.md): each row keeps a table of the token
that last followed every token in its history and drafts by walking it from the last committed
token. Importing this file registers the method "bigram"; nothing in jspec changes."""

import dataclasses

import jax
import jax.numpy as jnp

from jspec.drafters import registry
from jspec.drafters.base import Context, Draft, Drafter


def successors(tokens: jax.Array, length: jax.Array, vocab: int) -> jax.Array:
  """[B, S] tokens -> [B, V]: the token after the last occurrence of each token (-1: none)."""
  pos = jnp.arange(tokens.shape[1])
  valid = pos[None] + 1 < length[:, None]            # position t has a successor t + 1
  last = jax.vmap(lambda t, v: jnp.full((vocab,), -1).at[t].max(jnp.where(v, pos, -1)))(
      tokens, valid)
  after = jnp.take_along_axis(tokens, jnp.clip(last + 1, 0, tokens.shape[1] - 1), axis=1)
  return jnp.where(last >= 0, after, -1)


@dataclasses.dataclass(frozen=True)
class BigramDrafter(Drafter):
  num_draft: int
  vocab: int
  target_taps: tuple[int, ...] = ()

  def init_state(self, params, prompt, ctx: Context, max_len: int):
    return successors(ctx.tokens, ctx.length, self.vocab)

  def commit(self, params, state, ctx: Context):
    return successors(ctx.tokens, ctx.length, self.vocab)

  def propose(self, params, state, ctx: Context, key):
    last = jnp.take_along_axis(ctx.tokens, ctx.length[:, None] - 1, axis=1)[:, 0]

    def step(tok, _):
      nxt = jnp.take_along_axis(state, jnp.maximum(tok, 0)[:, None], axis=1)[:, 0]
      nxt = jnp.where(tok >= 0, nxt, -1)
      return nxt, nxt

    _, toks = jax.lax.scan(step, last, None, length=self.num_draft)
    toks = jnp.moveaxis(toks, 0, 1)                   # [B, D]; -1 after the walk ends
    length = jnp.sum(jnp.cumprod(toks >= 0, axis=1), axis=1).astype(jnp.int32)
    return Draft(tokens=jnp.maximum(toks, 0).astype(jnp.int32), length=length), state


@dataclasses.dataclass(frozen=True)
class BigramOptions:
  pass


registry.register(registry.Method(
    "bigram", BigramOptions,
    lambda opts, d, target, draft_model=None: (BigramDrafter(d, target.config.vocab_size), None),
    help="walk the row's own bigram table from the last token (example drafter)"))
