"""The drafter interface every method implements (n-gram, draft model, layer-skip; EAGLE-3, MTP,
Medusa, DFlash, DSpark, suffix and lookahead later).

A drafter is a frozen, hashable object holding only static configuration, so it can be a static
argument of `jax.jit`. Its arrays live in two pytrees the engine threads through the round:
`params` (read-only weights; `None` for model-free drafters) and `state` (caches, features; updated
by `propose` and `commit`). All three methods run inside the engine's single jitted round.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax

from jspec.sampling import SamplingParams


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Draft:
  tokens: jax.Array             # [B, D] proposed tokens
  q: jax.Array | None = None    # [B, D, V] the processed distributions the tokens were sampled
                                # from; None for deterministic drafts (verified as one-hot)
  length: jax.Array | None = None   # [B] valid proposals per row (None = all D)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Context:
  """What a drafter may look at: the committed sequence, nothing from the future."""
  tokens: jax.Array             # [B, S] committed tokens (prompt + generated), padding after length
  length: jax.Array             # [B] committed tokens per row
  prompt_len: jax.Array         # [B]
  params: SamplingParams        # the rows' sampling parameters (a sampling drafter uses them for q)
  target_hidden: tuple[jax.Array, ...] = ()   # [B, T, H] taps from the last target forward


class Drafter(Protocol):
  num_draft: int                     # D, static
  target_taps: tuple[int, ...]       # hidden-state taps the drafter wants from every verify

  def init_state(self, params: Any, prompt: jax.Array, ctx: Context, max_len: int) -> Any:
    """Builds the drafter state after the target's prefill. prompt: [B, P] right-padded prompt
    tokens (lengths ctx.prompt_len); ctx already holds the first sampled token."""

  def propose(self, params: Any, state: Any, ctx: Context, key: jax.Array) -> tuple[Draft, Any]:
    """Proposes D tokens per row following ctx.tokens[:, :ctx.length]. key: [B] per-row keys."""

  def commit(self, params: Any, state: Any, ctx: Context) -> Any:
    """Sees the context after acceptance (lengths advanced, new target taps); returns new state."""
