"""Lookahead decoding (arXiv 2402.02057) inside jit: the verify forward also runs a Jacobi window
(W columns x N-1 levels of earlier iterations) whose trajectories yield n-grams into a per-row pool;
each round drafts the continuation of the best pooled n-gram that starts with the last committed
token (a chain of up to min(N-1, D) tokens, q = None: deterministic).

Window layout: level l, column c holds a guess for the token at offset 1 + c + l past the last
committed one and attends to level 0's columns 0..c and to levels 1..l of its own column, so each
column is one trajectory: its N-1 tokens and the target's argmax after them form an n-gram. After
the round the levels shift down and the argmaxes become the top level (no realignment to the new
length: a round usually commits one token, and the pool only ever proposes).

Pool: G n-grams per row with recency stamps. A round's W n-grams count as used at once: those
already pooled get the new stamp, the rest replace the stalest entries. Candidates: the V most
recent pooled n-grams keyed by the last committed token; the one whose prefixes the others agree
with most is drafted (ties: the most recent). tests/jspec/test_lookahead.py checks the pool and the
choice against plain-Python references.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jspec.drafters import registry
from jspec.drafters.base import Context, Draft, Drafter, ExtraTokens

MAX_EXTRA = 64          # window tokens run with each verify: W * (N - 1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LookaheadState:
  levels: jax.Array      # [B, N-1, W] the Jacobi window, oldest level first
  pool: jax.Array        # [B, G, N] n-grams (key token first)
  stamp: jax.Array       # [B, G] int32 recency; -1 = empty slot
  clock: jax.Array       # [B] int32 the next stamp


@dataclasses.dataclass(frozen=True)
class LookaheadDrafter(Drafter):
  num_draft: int
  window: int = 5            # W
  ngram: int = 4             # N: pooled n-grams are the key token + N-1 draft tokens
  pool_size: int = 512       # G per row
  candidates: int = 7        # V: pooled n-grams considered per round
  pool_from_prompt: bool = True
  target_taps: tuple[int, ...] = ()

  @property
  def num_extra(self) -> int:
    return self.window * (self.ngram - 1)

  @property
  def draft_len(self) -> int:
    return min(self.ngram - 1, self.num_draft)

  def _window_layout(self):
    """Static: RoPE offsets [E] and the attention mask [E, E] of the window, level-major."""
    w, levels = self.window, self.ngram - 1
    lvl = np.repeat(np.arange(levels), w)
    col = np.tile(np.arange(w), levels)
    offsets = 1 + col + lvl
    mask = ((lvl[None, :] == 0) & (col[None, :] <= col[:, None])) | \
           ((lvl[None, :] >= 1) & (lvl[None, :] <= lvl[:, None]) & (col[None, :] == col[:, None]))
    return offsets.astype(np.int32), mask

  def init_state(self, params, prompt, ctx: Context, max_len: int) -> LookaheadState:
    b, p = prompt.shape
    n, g, w = self.ngram, self.pool_size, self.window
    plen = ctx.prompt_len
    # the window starts with prompt tokens (spread over the prompt), as the original does
    picks = (jnp.arange((n - 1) * w) * 97)[None, :] % jnp.maximum(plen, 1)[:, None]
    levels = jnp.take_along_axis(prompt, picks, axis=1).reshape(b, n - 1, w)
    pool = jnp.zeros((b, g, n), jnp.int32)
    stamp = jnp.full((b, g), -1, jnp.int32)
    clock = jnp.zeros((b,), jnp.int32)
    state = LookaheadState(levels.astype(jnp.int32), pool, stamp, clock)
    if self.pool_from_prompt and p >= n:
      grams = jnp.stack([prompt[:, i:p - n + 1 + i] for i in range(n)], axis=-1)  # [B, P-N+1, N]
      valid = jnp.arange(p - n + 1)[None, :] + n <= plen[:, None]
      state = jax.vmap(_pool_add)(state, grams.astype(jnp.int32), valid)
    return state

  def propose(self, params, state: LookaheadState, ctx: Context, key):
    b = ctx.tokens.shape[0]
    last = ctx.tokens[jnp.arange(b), ctx.length - 1]
    tokens, length = jax.vmap(self._choose)(state.pool, state.stamp, last)
    offsets, mask = self._window_layout()
    e = self.num_extra
    top = (self.ngram - 2) * self.window + np.arange(self.window)
    extra = ExtraTokens(tokens=state.levels.reshape(b, e),
                        positions=jnp.broadcast_to(jnp.asarray(offsets), (b, e)),
                        mask=jnp.broadcast_to(jnp.asarray(mask), (b, e, e)),
                        outputs=jnp.broadcast_to(jnp.asarray(top, jnp.int32), (b, self.window)))
    pad = jnp.zeros((b, self.num_draft - self.draft_len), jnp.int32)
    return Draft(tokens=jnp.concatenate([tokens, pad], axis=1), q=None, length=length,
                 extra=extra), state

  def _choose(self, pool, stamp, last):
    """The draft [draft_len] and its length (0 when no pooled n-gram starts with `last`)."""
    v, dl = min(self.candidates, self.pool_size), self.draft_len
    keyed = jnp.where((stamp >= 0) & (pool[:, 0] == last), stamp, -2)
    recency, idx = jax.lax.top_k(keyed, v)                                        # [V]
    ok = recency >= 0
    cont = pool[idx, 1:1 + dl]                                                    # [V, dl]
    same = cont[:, None, :] == cont[None, :, :]                                   # [V, V, dl]
    agree = jnp.cumprod(same.astype(jnp.int32), axis=2) * ok[None, :, None]
    score = jnp.sum(agree, axis=(1, 2))                                           # [V]
    best = jnp.argmax(jnp.where(ok, score, -1))      # top_k order: ties go to the most recent
    return cont[best], jnp.where(ok[0], dl, 0).astype(jnp.int32)

  def commit(self, params, state: LookaheadState, ctx: Context) -> LookaheadState:
    out = ctx.extra_argmax                                                        # [B, W]
    grams = jnp.concatenate([jnp.swapaxes(state.levels, 1, 2), out[:, :, None]], axis=2)  # [B, W, N]
    valid = jnp.ones(grams.shape[:2], bool)
    state = jax.vmap(_pool_add)(state, grams, valid)
    levels = jnp.concatenate([state.levels[:, 1:], out[:, None, :]], axis=1)
    return dataclasses.replace(state, levels=levels)


def _pool_add(state: LookaheadState, grams: jax.Array, valid: jax.Array) -> LookaheadState:
  """One row: n-grams [M, N] (in order; `valid` [M]) are used at once. Each distinct one is stamped
  clock + its last index; pooled ones take the new stamp, new ones replace the stalest entries.
  When more than G are new (the prompt's n-grams at init) the G newest are kept."""
  m = grams.shape[0]
  g = state.pool.shape[0]
  eq = jnp.all(grams[:, None, :] == grams[None, :, :], axis=-1) & valid[None, :]  # [M, M]
  later = jnp.triu(jnp.ones((m, m), bool), k=1)
  last = valid & ~jnp.any(eq & later, axis=1)       # the last occurrence of each distinct n-gram
  stamp_new = state.clock + jnp.arange(m, dtype=jnp.int32)
  in_pool = jnp.all(state.pool[None, :, :] == grams[:, None, :], axis=-1) & \
      (state.stamp >= 0)[None, :]                                                 # [M, G]
  pooled = jnp.any(in_pool, axis=1)
  refresh = jnp.max(jnp.where(in_pool & last[:, None], stamp_new[:, None], -1), axis=0)   # [G]
  stamp = jnp.maximum(state.stamp, refresh)
  fresh = last & ~pooled
  # the newest fresh n-grams go to the stalest slots (fresh rank 0 = the newest)
  k = min(m, g)
  _, order = jax.lax.top_k(jnp.where(fresh, stamp_new, -1), k)                    # newest first
  take = fresh[order]
  _, slots = jax.lax.top_k(-stamp, k)                                             # stalest first
  # the newest fresh n-gram takes the stalest slot: stamps of kept entries stay ordered
  slots = jnp.where(take, slots, g)
  pool = state.pool.at[slots].set(grams[order], mode="drop")
  stamp = stamp.at[slots].set(stamp_new[order], mode="drop")
  return LookaheadState(state.levels, pool, stamp, state.clock + m)


def _is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class LookaheadOptions:
  window: int = 5                 # W, Jacobi window columns
  ngram: int | None = None        # N, n-gram size (default: min(D + 1, 5))
  pool_size: int = 512            # G, pooled n-grams per row
  candidates: int = 7             # V, pooled n-grams considered per round
  pool_from_prompt: bool = True   # seed the pool with the prompt's n-grams

  def __post_init__(self):
    problems = []
    if not _is_int(self.window) or self.window < 1:
      problems.append(f"window must be an integer >= 1, got {self.window!r}")
    if self.ngram is not None and (not _is_int(self.ngram) or self.ngram < 2):
      problems.append(f"ngram must be an integer >= 2, got {self.ngram!r}")
    if not _is_int(self.pool_size) or self.pool_size < 1:
      problems.append(f"pool_size must be an integer >= 1, got {self.pool_size!r}")
    if not _is_int(self.candidates) or self.candidates < 1:
      problems.append(f"candidates must be an integer >= 1, got {self.candidates!r}")
    if not isinstance(self.pool_from_prompt, bool):
      problems.append(f"pool_from_prompt must be true or false, got {self.pool_from_prompt!r}")
    if not problems:
      if self.pool_size < self.window:
        problems.append(f"pool_size ({self.pool_size}) must be >= window ({self.window}): a "
                        "round adds up to W n-grams")
      if self.candidates > self.pool_size:
        problems.append(f"candidates ({self.candidates}) must be <= pool_size ({self.pool_size})")
      if self.ngram is not None and self.window * (self.ngram - 1) > MAX_EXTRA:
        problems.append(f"window x (ngram - 1) = {self.window * (self.ngram - 1)} window tokens "
                        f"per verify is over {MAX_EXTRA}; lower window or ngram")
    if problems:
      raise ValueError("lookahead decoding: " + "; ".join(problems))


def _build(o: LookaheadOptions, d: int, target, draft_model=None):
  n = o.ngram if o.ngram is not None else min(d + 1, 5)
  if o.window * (n - 1) > MAX_EXTRA:
    raise ValueError(f"lookahead decoding: window x (ngram - 1) = {o.window * (n - 1)} window "
                     f"tokens per verify is over {MAX_EXTRA}; lower window or ngram")
  return LookaheadDrafter(d, o.window, n, o.pool_size, o.candidates, o.pool_from_prompt), None


registry.register(registry.Method(
    "lookahead", LookaheadOptions, _build,
    help="lookahead decoding: a Jacobi window in the verify pass feeds an n-gram pool",
    cli_flags=(registry.CliFlag("--lookahead-window", "window", int, "Jacobi window W"),
               registry.CliFlag("--lookahead-ngram", "ngram", int, "n-gram size N"),
               registry.CliFlag("--lookahead-pool", "pool_size", int, "pooled n-grams per row G"),
               registry.CliFlag("--lookahead-candidates", "candidates", int,
                                "pooled n-grams considered per round V"))))
