"""Duplicate and contamination filters over prompt texts: exact duplicates (case and whitespace
normalised), near duplicates (MinHash over word 5-gram shingles with LSH banding, confirmed by the
exact Jaccard similarity) and word 13-gram overlap with reference texts.

Words are lowercased `\\w+` runs; a word hashes to 64 bits with BLAKE2b and an n-gram to a
polynomial of its word hashes mod 2^64, so results do not depend on the Python hash seed."""

from __future__ import annotations

import hashlib
import re
from typing import Sequence

import numpy as np

WORD = re.compile(r"\w+")
SHINGLE = 5             # words per shingle for near duplicates
THRESHOLD = 0.8         # Jaccard similarity of shingle sets at or above which texts are near dups
DECONTAM_N = 13         # words per n-gram for contamination
NUM_PERM, BANDS = 64, 16   # MinHash values; LSH bands of 4 rows: P(candidate | J=0.8) > 0.999
_P = np.uint64(0x100000001B3)
_MASK64 = (1 << 64) - 1


def normalize(text: str) -> str:
  return " ".join(text.lower().split())


class _Words:
  """Word -> 64-bit id, cached."""

  def __init__(self):
    self.ids: dict[str, int] = {}

  def __call__(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids of all words of all texts, concatenated; offsets [len(texts) + 1])."""
    ids, offsets = [], [0]
    cache = self.ids
    for t in texts:
      for w in WORD.findall(t.lower()):
        v = cache.get(w)
        if v is None:
          v = cache[w] = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(),
                                        "little")
        ids.append(v)
      offsets.append(len(ids))
    return np.array(ids, dtype=np.uint64), np.array(offsets, dtype=np.int64)


def ngrams(texts: Sequence[str], n: int, words: _Words | None = None,
           whole_if_short: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """(hash of every word n-gram, index of its text). With whole_if_short, a text of fewer than n
  (but at least one) words contributes one hash of all its words."""
  ids, offsets = (words or _Words())(texts)
  lengths = np.diff(offsets)
  m = len(ids) - n + 1
  if m > 0:
    h = np.zeros(m, dtype=np.uint64)
    for j in range(n):
      h = h * _P + ids[j:j + m]
    start = np.arange(m)
    owner = np.searchsorted(offsets, start, side="right") - 1
    ok = start + n <= offsets[owner + 1]
    hashes, owners = [h[ok]], [owner[ok]]
  else:
    hashes, owners = [], []
  if whole_if_short:
    for k in np.flatnonzero((lengths > 0) & (lengths < n)):
      v = 0
      for x in ids[offsets[k]:offsets[k + 1]].tolist():
        v = (v * int(_P) + x) & _MASK64
      hashes.append(np.array([v], dtype=np.uint64))
      owners.append(np.array([k]))
  if not hashes:
    return np.zeros(0, np.uint64), np.zeros(0, np.int64)
  return np.concatenate(hashes), np.concatenate(owners).astype(np.int64)


def exact_duplicates(keys: Sequence[str]) -> np.ndarray:
  """True for every key whose normalised form occurred earlier."""
  seen: set[str] = set()
  out = np.zeros(len(keys), bool)
  for i, k in enumerate(keys):
    k = normalize(k)
    out[i] = k in seen
    seen.add(k)
  return out


def contaminated(texts: Sequence[str], reference: Sequence[str], n: int = DECONTAM_N) -> np.ndarray:
  """True for every text that shares a word n-gram with any reference text."""
  words = _Words()
  ref, _ = ngrams(reference, n, words)
  h, owner = ngrams(texts, n, words)
  hit = np.isin(h, np.unique(ref))
  return np.bincount(owner[hit], minlength=len(texts)) > 0


def _minhash(h: np.ndarray, owner: np.ndarray, count: int, seed: int) -> np.ndarray:
  """[count, NUM_PERM] MinHash signatures; `owner` must be sorted and every text non-empty."""
  rng = np.random.default_rng(seed)
  a = rng.integers(1, 2**63, NUM_PERM, dtype=np.uint64) * np.uint64(2) + np.uint64(1)   # odd
  b = rng.integers(0, 2**63, NUM_PERM, dtype=np.uint64)
  sig = np.empty((count, NUM_PERM), np.uint64)
  starts = np.searchsorted(owner, np.arange(count + 1))
  step = 100_000
  lo = 0
  while lo < count:       # blocks of whole texts, about `step` shingles each
    hi = max(lo + 1, int(np.searchsorted(starts, starts[lo] + step, side="right")) - 1)
    hi = min(hi, count)
    seg = h[starts[lo]:starts[hi]]
    perm = seg[:, None] * a[None, :] + b[None, :]
    sig[lo:hi] = np.minimum.reduceat(perm, starts[lo:hi] - starts[lo], axis=0)
    lo = hi
  return sig


def near_duplicates(texts: Sequence[str], passages: Sequence[str], requests: Sequence[str],
                    threshold: float = THRESHOLD, seed: int = 0) -> np.ndarray:
  """True for every text whose shingle set has Jaccard similarity >= threshold with an earlier
  kept text, except when both quote the same passage (same non-empty `passages` key) with
  different requests: those are different tasks on one passage, which build.py caps in number."""
  count = len(texts)
  h, owner = ngrams(texts, SHINGLE, whole_if_short=True)
  order = np.lexsort((h, owner))
  h, owner = h[order], owner[order]
  keep = np.ones(len(h), bool)
  keep[1:] = (h[1:] != h[:-1]) | (owner[1:] != owner[:-1])    # unique shingles per text
  h, owner = h[keep], owner[keep]
  starts = np.searchsorted(owner, np.arange(count + 1))
  empty = starts[1:] == starts[:-1]
  if empty.any():       # texts without a word: give each a shingle of its own
    h = np.concatenate([h, np.arange(int(empty.sum()), dtype=np.uint64)])
    owner = np.concatenate([owner, np.flatnonzero(empty)])
    order = np.argsort(owner, kind="stable")
    h, owner = h[order], owner[order]
    starts = np.searchsorted(owner, np.arange(count + 1))
  sig = _minhash(h, owner, count, seed)
  rows = NUM_PERM // BANDS
  band_keys = np.zeros((count, BANDS), np.uint64)
  for r in range(rows):
    band_keys = band_keys * _P + sig[:, r::rows][:, :BANDS]
  buckets: list[dict[int, list[int]]] = [{} for _ in range(BANDS)]
  reqs = [normalize(r) for r in requests]
  drop = np.zeros(count, bool)
  for i in range(count):
    keys = band_keys[i].tolist()
    cands = sorted({j for b, k in enumerate(keys) for j in buckets[b].get(k, ())})
    if cands:
      est = (sig[cands] == sig[i]).mean(axis=1)
      mine = h[starts[i]:starts[i + 1]]
      for j in (c for c, e in zip(cands, est) if e >= threshold - 0.2):
        theirs = h[starts[j]:starts[j + 1]]
        inter = len(np.intersect1d(mine, theirs, assume_unique=True))
        if inter / (len(mine) + len(theirs) - inter) >= threshold and not (
            passages[i] and passages[i] == passages[j] and reqs[i] != reqs[j]):
          drop[i] = True
          break
    if not drop[i]:
      for b, k in enumerate(keys):
        buckets[b].setdefault(k, []).append(i)
  return drop
