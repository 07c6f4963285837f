"""N-gram prompt lookup inside jit: find the longest suffix n-gram (max_n down to min_n) that occurs
earlier in the row's history (prompt included), take its earliest occurrence, and propose the up-to-D
tokens that followed it (vLLM's rule). Model-free and deterministic: q is one-hot."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jspec.drafters import registry
from jspec.drafters.base import Context, Draft, Drafter


@dataclasses.dataclass(frozen=True)
class NgramDrafter(Drafter):
  num_draft: int
  min_n: int = 1
  max_n: int = 4
  target_taps: tuple[int, ...] = ()

  def __post_init__(self):
    if not 1 <= self.min_n <= self.max_n:
      raise ValueError(f"n-gram sizes need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                       f"{self.min_n}, {self.max_n}")

  def init_state(self, params, prompt, ctx: Context, max_len: int):
    return ()

  def commit(self, params, state, ctx: Context):
    return state

  def propose(self, params, state, ctx: Context, key):
    return jax.vmap(self._propose_row)(ctx.tokens, ctx.length), state

  def _propose_row(self, tokens: jax.Array, length: jax.Array) -> Draft:
    s = tokens.shape[0]
    d = self.num_draft
    pos = jnp.arange(s)
    padded = jnp.concatenate([tokens, jnp.zeros((self.max_n,), tokens.dtype)])
    best_start = jnp.int32(-1)   # where the continuation starts (match start + n)
    for n in range(self.min_n, self.max_n + 1):   # longer n overrides shorter
      suffix = jax.lax.dynamic_slice(padded, (jnp.maximum(length - n, 0),), (n,))
      match = jnp.ones((s,), bool)
      for k in range(n):
        match &= jax.lax.dynamic_slice(padded, (k,), (s,)) == suffix[k]
      match &= (pos + n < length) & (length >= n + 1)   # strictly before the suffix itself
      found = jnp.any(match)
      best_start = jnp.where(found, jnp.argmax(match).astype(jnp.int32) + n, best_start)
    cont = jax.lax.dynamic_slice(
        jnp.concatenate([tokens, jnp.zeros((d,), tokens.dtype)]), (jnp.maximum(best_start, 0),), (d,))
    avail = jnp.where(best_start >= 0, jnp.minimum(d, length - best_start), 0)
    return Draft(tokens=cont.astype(jnp.int32), q=None, length=avail.astype(jnp.int32))


@dataclasses.dataclass(frozen=True)
class NgramOptions:
  prompt_lookup_min: int | None = None   # shortest suffix n-gram to match (default 1)
  prompt_lookup_max: int | None = None   # longest suffix n-gram to match (default 4)

  def __post_init__(self):
    lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
    if lo is None and hi is None:
      lo, hi = 1, 4
    lo, hi = (hi if lo is None else lo), (lo if hi is None else hi)
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi)) or \
        not 1 <= lo <= hi:
      raise ValueError(f"n-gram lookup needs integers 1 <= prompt_lookup_min <= "
                       f"prompt_lookup_max, got {lo}, {hi}")
    object.__setattr__(self, "prompt_lookup_min", lo)
    object.__setattr__(self, "prompt_lookup_max", hi)


registry.register(registry.Method(
    "ngram", NgramOptions,
    lambda o, d, target, draft_model=None: (NgramDrafter(d, o.prompt_lookup_min,
                                                         o.prompt_lookup_max), None),
    help="prompt lookup: continue the longest earlier match of the suffix n-gram",
    cli_flags=(registry.CliFlag("--ngram-min", "prompt_lookup_min", int, "shortest n-gram"),
               registry.CliFlag("--ngram-max", "prompt_lookup_max", int, "longest n-gram"))))
