"""Suffix decoding (SuffixDecoding, arXiv 2411.04975) inside jit: match the row's last tokens against
its own history and against a global cache of earlier outputs, follow the most frequent
continuation, and propose as many tokens as the match length earns (chain drafts, q = None).

A suffix tree's node for a pattern P counts P's occurrences and its children count the tokens that
follow them. The same counts come from fixed-size arrays: for every history position e, the length
of the common suffix of history[..e] and the row's context (capped at max_depth) says for which
match lengths e is an occurrence; following a drafted path narrows the occurrences to those whose
continuation agrees. Counting uses the `max_candidates` longest-matching (then most recent)
occurrences per source: with at least as many candidates as positions it is the suffix tree's count
exactly (tests/jspec/test_suffix.py checks both against plain-Python references).

The global cache is the drafter's read-only `params` inside a call ([C] tokens, earlier outputs
separated by -1, oldest evicted) and is replaced host-side after each `generate` with arrays of the
same shape, so the compiled round is reused.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jspec.drafters import registry
from jspec.drafters.base import Context, Draft, Drafter

SEP = -1                 # separates entries of the global cache and fills its free tail
_TOKEN_BITS = 20         # frequency-major, token-minor scores: vocabularies below 2**20


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SuffixCache:
  tokens: jax.Array      # [C] int32: earlier outputs, oldest first, each followed by SEP


def pack_cache(entries: list[list[int]], capacity: int) -> np.ndarray:
  """The newest entries that fit in `capacity` slots (each takes len + 1), oldest first; an entry
  longer than the capacity keeps its last capacity - 1 tokens."""
  kept, used = [], 0
  for e in reversed([list(e)[-(capacity - 1):] for e in entries if len(e)]):
    if used + len(e) + 1 > capacity:
      break
    kept.append(e)
    used += len(e) + 1
  out = np.full((capacity,), SEP, np.int32)
  pos = 0
  for e in reversed(kept):
    out[pos:pos + len(e)] = e
    pos += len(e) + 1
  return out


def unpack_cache(tokens) -> list[list[int]]:
  entries, cur = [], []
  for t in np.asarray(tokens).tolist():
    if t == SEP:
      if cur:
        entries.append(cur)
      cur = []
    else:
      cur.append(t)
  return entries


@dataclasses.dataclass(frozen=True)
class SuffixDrafter(Drafter):
  num_draft: int
  max_depth: int = 24            # longest suffix match considered
  spec_factor: float = 1.0       # alpha: a match of m tokens proposes <= floor(alpha * m + offset)
  spec_offset: float = 0.0
  min_token_prob: float = 0.1    # stop the path when its probability falls below this
  max_candidates: int = 64       # occurrences per source counted (longest match, then most recent)
  cache_tokens: int = 4096       # global cache capacity in tokens (0: no global cache)
  target_taps: tuple[int, ...] = ()

  def init_params(self) -> SuffixCache | None:
    if self.cache_tokens == 0:
      return None
    return SuffixCache(jnp.full((self.cache_tokens,), SEP, jnp.int32))

  def after_generate(self, params, prompts, outputs):
    """Host-side: the call's outputs join the global cache (oldest entries evicted)."""
    if params is None:
      return None
    entries = unpack_cache(params.tokens) + [list(o) for o in outputs]
    return SuffixCache(jnp.asarray(pack_cache(entries, self.cache_tokens)))

  def init_state(self, params, prompt, ctx: Context, max_len: int):
    return ()

  def commit(self, params, state, ctx: Context):
    return state

  def propose(self, params, state, ctx: Context, key):
    glob = None if params is None else params.tokens

    def row(tokens, length):
      s = tokens.shape[0]
      pos = jnp.arange(s)
      hist = jnp.where(pos < length, tokens, SEP)
      ctx_rev = _context_reversed(tokens, length, self.max_depth)
      own = self._search(hist, ctx_rev, own_end=length - 1)
      if glob is None:
        return own
      other = self._search(glob, ctx_rev, own_end=None)
      better = other[2] > own[2]
      return tuple(jnp.where(better, g, o) for g, o in zip(other, own))

    tokens, length, _ = jax.vmap(row)(ctx.tokens, ctx.length)
    return Draft(tokens=tokens, q=None, length=length), state

  def _search(self, hist, ctx_rev, own_end):
    """Best path over match lengths 1..max_depth in one source. hist [S] (SEP = no token);
    ctx_rev [M] the context's last tokens, newest first (-2 past its start); own_end: the
    context's own end position when hist is the row's history (that occurrence counts toward a
    node but has no continuation), None for the global cache. Returns (tokens [D], length, score)."""
    s = hist.shape[0]
    m_max, d = self.max_depth, self.num_draft
    k = min(self.max_candidates, s)
    # match[e]: common suffix length of hist[..e] and the context, capped at max_depth
    padded = jnp.concatenate([jnp.full((m_max,), -3, hist.dtype), hist])
    eq = jnp.stack([jax.lax.dynamic_slice(padded, (m_max - j,), (s,)) == ctx_rev[j]
                    for j in range(m_max)])                                       # [M, S]
    match = jnp.sum(jnp.cumprod(eq.astype(jnp.int32), axis=0), axis=0)           # [S]
    if own_end is not None:
      match = jnp.where(jnp.arange(s) < own_end, match, 0)
    order = match * s + jnp.arange(s)                     # longest match first, then most recent
    _, cand = jax.lax.top_k(order, k)                                             # [K]
    cand_match = match[cand]
    after = jnp.concatenate([hist, jnp.full((d + 1,), SEP, hist.dtype)])
    nxt = jax.vmap(lambda e: jax.lax.dynamic_slice(after, (e + 1,), (d,)))(cand)  # [K, D]
    self_count = 0 if own_end is None else 1
    limits = np.array([min(d, math.floor(self.spec_factor * m + self.spec_offset))
                       for m in range(1, m_max + 1)], np.int32)

    def path(m, limit):
      members = cand_match >= m                                                   # [K]
      total = jnp.sum(members) + self_count       # the node's count: occurrences of the pattern
      prob, score, n = jnp.float32(1.0), jnp.float32(0.0), jnp.int32(0)
      active = jnp.any(members)
      out = []
      for step in range(d):
        t = nxt[:, step]                          # the token after each occurrence (SEP: none)
        valid = members & (t != SEP)
        counts = jnp.sum((t[:, None] == t[None, :]) & valid[None, :], axis=1)     # [K]
        rank = jnp.where(valid, counts * (1 << _TOKEN_BITS) - t, -1)   # most frequent, then
        best = jnp.argmax(rank)                                           # smallest token id
        x = t[best]
        p = prob * counts[best].astype(jnp.float32) / jnp.maximum(total, 1).astype(jnp.float32)
        active = active & jnp.any(valid) & (step < limit) & (p >= self.min_token_prob)
        out.append(jnp.where(active, x, 0))
        prob = jnp.where(active, p, prob)
        score = score + jnp.where(active, p, 0.0)
        n = n + active.astype(jnp.int32)
        members = members & (t == x)
        total = jnp.sum(members)
      return jnp.stack(out), n, score

    toks, lens, scores = jax.vmap(path)(jnp.arange(1, m_max + 1), jnp.asarray(limits))
    best_m = m_max - 1 - jnp.argmax(scores[::-1])   # ties: the longer match
    return toks[best_m], lens[best_m], scores[best_m]


def _context_reversed(tokens: jax.Array, length: jax.Array, depth: int) -> jax.Array:
  """[depth]: the row's last committed tokens, newest first; -2 (matches nothing) before its start."""
  j = jnp.arange(depth)
  at = jnp.clip(length - 1 - j, 0, tokens.shape[0] - 1)
  return jnp.where(j < length, tokens[at], -2)


def _is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclasses.dataclass(frozen=True)
class SuffixOptions:
  max_tree_depth: int = 24         # longest suffix match (vLLM's suffix_decoding_max_tree_depth)
  max_spec_factor: float = 1.0     # alpha: up to floor(alpha * match length + offset) tokens
  max_spec_offset: float = 0.0
  min_token_prob: float = 0.1      # stop the draft where its estimated probability falls below
  max_candidates: int = 64         # occurrences counted per source (longest match, most recent)
  cache_tokens: int = 4096         # global cache of earlier outputs, in tokens (0 disables it)

  def __post_init__(self):
    problems = []
    if not _is_int(self.max_tree_depth) or not 1 <= self.max_tree_depth <= 256:
      problems.append(f"max_tree_depth must be an integer in [1, 256], got {self.max_tree_depth!r}")
    if not _is_real(self.max_spec_factor) or self.max_spec_factor <= 0:
      problems.append(f"max_spec_factor must be a number > 0, got {self.max_spec_factor!r}")
    if not _is_real(self.max_spec_offset):
      problems.append(f"max_spec_offset must be a finite number, got {self.max_spec_offset!r}")
    if not _is_real(self.min_token_prob) or not 0 <= self.min_token_prob <= 1:
      problems.append(f"min_token_prob must be in [0, 1], got {self.min_token_prob!r}")
    if not _is_int(self.max_candidates) or not 1 <= self.max_candidates <= 1024:
      problems.append(f"max_candidates must be an integer in [1, 1024], got "
                      f"{self.max_candidates!r}")
    if not _is_int(self.cache_tokens) or self.cache_tokens < 0 or self.cache_tokens == 1:
      problems.append(f"cache_tokens must be 0 (no global cache) or an integer >= 2, got "
                      f"{self.cache_tokens!r}")
    if problems:
      raise ValueError("suffix decoding: " + "; ".join(problems))


def _build(o: SuffixOptions, d: int, target, draft_model=None):
  vocab = target.config.vocab_size
  if vocab >= 1 << _TOKEN_BITS:
    raise ValueError(f"suffix decoding supports vocabularies below {1 << _TOKEN_BITS}, got {vocab}")
  drafter = SuffixDrafter(d, o.max_tree_depth, float(o.max_spec_factor), float(o.max_spec_offset),
                          float(o.min_token_prob), o.max_candidates, o.cache_tokens)
  return drafter, drafter.init_params()


registry.register(registry.Method(
    "suffix", SuffixOptions, _build,
    help="suffix decoding: frequency-scored continuations of the longest suffix match in the row "
         "and in a global cache of earlier outputs",
    cli_flags=(registry.CliFlag("--suffix-depth", "max_tree_depth", int, "longest suffix match"),
               registry.CliFlag("--suffix-factor", "max_spec_factor", float,
                                "draft up to factor x match length tokens"),
               registry.CliFlag("--suffix-min-prob", "min_token_prob", float,
                                "stop where the estimated probability falls below this"),
               registry.CliFlag("--suffix-cache-tokens", "cache_tokens", int,
                                "global cache of earlier outputs, tokens (0: off)"))))
