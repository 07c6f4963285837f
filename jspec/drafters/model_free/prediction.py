"""Predicted outputs: the caller gives the expected output per row (`generate(prediction=...)`, e.g.
the code being edited) and each round drafts the prediction's next D tokens. After a divergence the
drafter re-synchronises by searching the prediction for the last k committed tokens (longest k
first, preferring the first occurrence at or after where it diverged); rows without a prediction,
or not synchronised, fall back to n-gram prompt lookup. Deterministic: q = None.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jspec.drafters import registry
from jspec.drafters.base import Context, Draft, Drafter
from jspec.drafters.model_free.ngram import NgramDrafter, NgramOptions


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prediction:
  tokens: jax.Array      # [B, L] predicted output tokens, right-padded
  length: jax.Array      # [B] (0: no prediction for the row)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PredictionState:
  prediction: Prediction
  pos: jax.Array         # [B] the prediction index the next committed token should equal; -1 when
                         # not synchronised
  hint: jax.Array        # [B] where the last divergence happened: re-synchronise at or after it


def _bucket(n: int) -> int:
  return max(16, 1 << max(0, n - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class PredictionDrafter(Drafter):
  num_draft: int
  resync_min: int = 1
  resync_max: int = 4
  lookup_min: int = 1            # the n-gram fallback's sizes
  lookup_max: int = 4
  target_taps: tuple[int, ...] = ()

  def make_request(self, prediction: Sequence | None, batch_size: int, *, vocab_size: int,
                   tokenizer=None) -> Prediction:
    """Host-side, before any compilation: one entry per row (text, token ids or None)."""
    if prediction is None:
      rows = [[]] * batch_size
    else:
      if isinstance(prediction, (str, bytes)) or not isinstance(prediction, Sequence):
        raise ValueError("prediction must be a list with one entry per prompt (text, token ids "
                         "or None)")
      if len(prediction) != batch_size:
        raise ValueError(f"prediction has {len(prediction)} entries for {batch_size} prompts; "
                         "give one per prompt (None for a row without one)")
      rows = [self._encode(p, i, vocab_size, tokenizer) for i, p in enumerate(prediction)]
    width = _bucket(max(len(r) for r in rows))
    tokens = np.zeros((batch_size, width), np.int32)
    for i, r in enumerate(rows):
      tokens[i, :len(r)] = r
    return Prediction(tokens=tokens, length=np.asarray([len(r) for r in rows], np.int32))

  @staticmethod
  def _encode(p, i: int, vocab_size: int, tokenizer) -> list[int]:
    if p is None:
      return []
    if isinstance(p, str):
      if tokenizer is None:
        raise ValueError(f"prediction {i} is text: pass tokenizer= to SpecDecoder, or give "
                         "token ids")
      ids = list(tokenizer.encode(p)) if p else []
      bos = getattr(tokenizer, "bos_id", None)
      if ids and getattr(tokenizer, "add_bos", False) and ids[0] == bos:
        ids = ids[1:]
      return ids
    try:
      ids = [int(t) for t in p]
      ok = all(float(t) == int(t) for t in p)
    except (TypeError, ValueError):
      ok = False
    if not ok:
      raise ValueError(f"prediction {i} must be text, a list of token ids or None")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
      raise ValueError(f"prediction {i} has token id {bad[0]} outside the vocabulary "
                       f"[0, {vocab_size})")
    return ids

  def init_state(self, params, prompt, ctx: Context, max_len: int) -> PredictionState:
    pred = ctx.request
    b = prompt.shape[0]
    if pred is None:     # a caller driving the engine by hand without predictions
      pred = Prediction(jnp.zeros((b, 16), jnp.int32), jnp.zeros((b,), jnp.int32))
    pred = Prediction(jnp.asarray(pred.tokens, jnp.int32), jnp.asarray(pred.length, jnp.int32))
    # the output is expected to start with the prediction: synchronised if the first token agrees
    first = ctx.tokens[jnp.arange(b), ctx.length - 1]
    pos = jnp.where((pred.length > 0) & (first == pred.tokens[:, 0]), 1, -1).astype(jnp.int32)
    return PredictionState(pred, pos, jnp.zeros((b,), jnp.int32))

  def propose(self, params, state: PredictionState, ctx: Context, key):
    fallback = NgramDrafter(self.num_draft, self.lookup_min, self.lookup_max)

    def row(tokens, length, pred, pred_len, pos, hint):
      start = jnp.where((pos >= 0) & (pos < pred_len), pos, self._resync(tokens, length, pred,
                                                                         pred_len, hint))
      d = self.num_draft
      cont = jax.lax.dynamic_slice(jnp.concatenate([pred, jnp.zeros((d,), pred.dtype)]),
                                   (jnp.maximum(start, 0),), (d,))
      n = jnp.clip(pred_len - start, 0, d)
      ng = fallback._propose_row(tokens, length)
      use = start >= 0
      return (jnp.where(use, cont, ng.tokens), jnp.where(use, n, ng.length).astype(jnp.int32),
              start)

    p = state.prediction
    toks, lens, pos = jax.vmap(row)(ctx.tokens, ctx.length, p.tokens, p.length, state.pos,
                                    state.hint)
    return Draft(tokens=toks, q=None, length=lens), dataclasses.replace(state, pos=pos)

  def _resync(self, tokens, length, pred, pred_len, hint):
    """Where the prediction continues the committed tokens: after the longest suffix
    (resync_max .. resync_min tokens) found in it with a continuation; the first occurrence at or
    after `hint`, else the first. -1 when none is found."""
    lp = pred.shape[0]
    i = jnp.arange(lp)
    padded = jnp.concatenate([pred, jnp.full((self.resync_max,), -1, pred.dtype)])
    found = jnp.int32(-1)
    for n in range(self.resync_min, self.resync_max + 1):   # a longer match overrides
      suffix = jax.lax.dynamic_slice(jnp.concatenate([jnp.zeros((n,), tokens.dtype), tokens]),
                                     (length,), (n,))       # tokens[length - n:length]
      hit = (i + n < pred_len) & (length >= n)
      for k in range(n):
        hit &= jax.lax.dynamic_slice(padded, (k,), (lp,)) == suffix[k]
      after = hit & (i + n >= hint)
      first = jnp.where(jnp.any(after), jnp.argmax(after), jnp.argmax(hit)).astype(jnp.int32)
      found = jnp.where(jnp.any(hit), first + n, found)
    return found

  def commit(self, params, state: PredictionState, ctx: Context) -> PredictionState:
    """Stays synchronised while the committed tokens equal the prediction; else remembers where
    they diverged."""
    d1 = self.num_draft + 1
    p = state.prediction

    def row(tokens, length, num_new, pred, pos, hint):
      j = jnp.arange(d1)
      new = jax.lax.dynamic_slice(jnp.concatenate([tokens, jnp.zeros((d1,), tokens.dtype)]),
                                  (jnp.maximum(length - num_new, 0),), (d1,))
      want = jax.lax.dynamic_slice(jnp.concatenate([pred, jnp.full((d1,), -1, pred.dtype)]),
                                   (jnp.maximum(pos, 0),), (d1,))
      agree = jnp.sum(jnp.cumprod(((new == want) | (j >= num_new)).astype(jnp.int32)))
      synced = (pos >= 0) & (agree >= d1)
      return (jnp.where(synced, pos + num_new, -1),
              jnp.where((pos >= 0) & ~synced, pos + agree, hint).astype(jnp.int32))

    pos, hint = jax.vmap(row)(ctx.tokens, ctx.length, ctx.num_new, p.tokens, state.pos,
                              state.hint)
    return dataclasses.replace(state, pos=pos.astype(jnp.int32), hint=hint)


@dataclasses.dataclass(frozen=True)
class PredictionOptions:
  resync_min: int = 1              # re-synchronise on the last k committed tokens, k from
  resync_max: int = 4              # resync_max down to resync_min
  prompt_lookup_min: int | None = None   # the n-gram fallback (default 1 .. 4)
  prompt_lookup_max: int | None = None

  def __post_init__(self):
    lo, hi = self.resync_min, self.resync_max
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi)) or \
        not 1 <= lo <= hi:
      raise ValueError(f"predicted outputs need integers 1 <= resync_min <= resync_max, got "
                       f"{lo!r}, {hi!r}")
    NgramOptions(self.prompt_lookup_min, self.prompt_lookup_max)   # validates the fallback's


def _build(o: PredictionOptions, d: int, target, draft_model=None) -> tuple[Any, None]:
  ng = NgramOptions(o.prompt_lookup_min, o.prompt_lookup_max)
  return PredictionDrafter(d, o.resync_min, o.resync_max, ng.prompt_lookup_min,
                           ng.prompt_lookup_max), None


registry.register(registry.Method(
    "prediction", PredictionOptions, _build,
    help="predicted outputs: draft from a caller-given expected output (generate(prediction=...), "
         "jspec generate --prediction FILE); n-gram lookup elsewhere",
    cli_flags=(registry.CliFlag("--resync-min", "resync_min", int,
                                "shortest committed suffix searched in the prediction"),
               registry.CliFlag("--resync-max", "resync_max", int,
                                "longest committed suffix searched in the prediction"))))
