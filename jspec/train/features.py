"""Target features cached to disk (`jspec train eagle3 --cache-features`): the target's taps and
final normed hidden state of every training token, computed once, so that later epochs pay only
for the drafter (the teacher-forced target pass dominates a step on CPU).

Layout: `features.npy`, a memmap [tokens, K + 1, H] of bfloat16 bits (stored as uint16) aligned
with the whole TokenShards sequences (K taps, then the final normed hidden), so any window of a
sequence (`jspec.train.shards.ReplyWindows`) reads its rows; `features.json` records the taps, the
data's manifest digest and how many sequences are done (resumable).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from jspec.train.shards import MANIFEST, TokenShards, read_manifest
from models.kv_cache import KVCache

DTYPE = ml_dtypes.bfloat16
FORMAT = "jspec-features/2"     # /2: whole sequences (/1 held each one's first seq_len tokens)


def _meta_path(folder):
  return os.path.join(folder, "features.json")


def _spans(source: TokenShards) -> np.ndarray:
  """Start offset of each sequence's features; [n + 1]."""
  return np.concatenate([[0], np.cumsum(np.diff(source.offsets))]).astype(np.int64)


def _digest(data_dir: str) -> str:
  with open(os.path.join(data_dir, MANIFEST), "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()[:16]


@functools.partial(jax.jit, static_argnames=("graphdef", "taps_and_final"))
def _forward(graphdef, weights, tokens, taps_and_final):
  """[B, N] tokens -> bfloat16 [B, N, K+1, H]: the taps, then the final normed hidden state."""
  target = nnx.merge(graphdef, weights)
  b, n = tokens.shape
  out = target(tokens, KVCache.init(target.config, b, n, dtype=target.activation_dtype),
               logit_indices=jnp.zeros((b, 1), jnp.int32), taps=taps_and_final)
  hidden = list(out.hidden[:-1]) + [target.norm(out.hidden[-1])]
  return jnp.stack(hidden, axis=2).astype(jnp.bfloat16)


def cache_features(target, data_dir: str, folder: str, *, taps: tuple[int, ...],
                   batch_size: int = 8, progress: bool = True) -> str:
  """Computes (or finishes) the feature cache in `folder`; returns the path of features.npy."""
  from tqdm import tqdm

  source = TokenShards(data_dir, 2)     # whole sequences are read; the window length is unused
  spans = _spans(source)
  k, h = len(taps) + 1, target.config.hidden_size
  meta = dict(format=FORMAT, taps=list(taps), data=_digest(data_dir), hidden=h,
              sequences=len(source), tokens=int(spans[-1]))
  os.makedirs(folder, exist_ok=True)
  path, mpath = os.path.join(folder, "features.npy"), _meta_path(folder)
  done = 0
  if os.path.isfile(mpath):
    with open(mpath) as f:
      saved = json.load(f)
    if {x: saved.get(x) for x in meta} != meta:
      raise ValueError(f"{folder} caches features of other data or settings; use another folder")
    done = saved["done"]
    arr = np.lib.format.open_memmap(path, mode="r+")
  else:
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16,
                                    shape=(int(spans[-1]), k, h))
  captured = read_manifest(data_dir).get("config", {}).get("taps") or []
  if captured and tuple(captured) == tuple(taps):
    _copy_captured(data_dir, source, spans, arr, done, meta, mpath, progress)
    return path
  graphdef, weights = nnx.split(target)
  # sort by length so that each batch pads to a short power of two
  order = np.argsort(np.diff(spans), kind="stable")
  bar = tqdm(total=len(source), initial=done, desc="target features", unit="seq",
             file=sys.stderr, disable=not progress)
  for start in range(done, len(source), batch_size):
    idx = order[start:start + batch_size]
    n = int(max(spans[i + 1] - spans[i] for i in idx))
    pad = max(n, min(max(16, 1 << (n - 1).bit_length()), target.config.max_position))
    rows = np.stack([np.pad(source.sequence(int(i))[0], (0, pad - int(spans[i + 1] - spans[i])))
                     for i in idx]).astype(np.int32)
    feats = np.asarray(_forward(graphdef, weights, jnp.asarray(rows),
                                tuple(taps) + (target.config.num_layers,))).view(np.uint16)
    for r, i in enumerate(idx):
      arr[spans[i]:spans[i + 1]] = feats[r, :spans[i + 1] - spans[i]]
    arr.flush()
    with open(mpath + ".tmp", "w") as f:
      json.dump(dict(meta, done=min(start + batch_size, len(source))), f)
    os.replace(mpath + ".tmp", mpath)
    bar.update(len(idx))
  bar.close()
  return path


def last_slot_features(target, data_dir: str, folder: str, *, batch_size: int = 8,
                       progress: bool = True) -> str:
  """The feature cache a head that reads only the last slot (the final normed hidden state:
  Medusa, MTP) needs: an existing cache in `folder` is reused (finished if incomplete) whatever
  taps it holds, e.g. an EAGLE-3 run's; otherwise, where the data captured taps while generating
  (`jspec train data --taps`), those are copied (no forward pass); else the final hidden state
  alone is computed."""
  mpath = _meta_path(folder)
  if os.path.isfile(mpath):
    with open(mpath) as f:
      taps = tuple(json.load(f)["taps"])
  else:
    taps = tuple(read_manifest(data_dir).get("config", {}).get("taps") or ())
  return cache_features(target, data_dir, folder, taps=taps, batch_size=batch_size,
                        progress=progress)


def _copy_captured(data_dir, source, spans, arr, done, meta, mpath, progress) -> None:
  """Fills the cache from the features `regenerate(taps=...)` captured while generating (the
  same taps): a copy of each sequence's rows, no forward pass."""
  from tqdm import tqdm
  bar = tqdm(total=len(source), initial=done, desc="captured features", unit="seq",
             file=sys.stderr, disable=not progress)
  first = 0
  for s in read_manifest(data_dir)["shards"]:
    n = s["sequences"]
    if first + n > done:
      feats = np.load(os.path.join(data_dir, s["features"]), mmap_mode="r")
      with np.load(os.path.join(data_dir, s["file"])) as z:
        offsets = z["offsets"]
      for j in range(max(done - first, 0), n):
        i = first + j
        arr[spans[i]:spans[i + 1]] = feats[offsets[j]:offsets[j] + spans[i + 1] - spans[i]]
      arr.flush()
      with open(mpath + ".tmp", "w") as f:
        json.dump(dict(meta, done=first + n), f)
      os.replace(mpath + ".tmp", mpath)
      bar.update(first + n - max(done, first))
    first += n
  bar.close()


class FeatureShards(TokenShards):
  """TokenShards whose items (and windows) also carry `feats` bfloat16 [seq_len, K+1, H] from the
  cache."""

  def __init__(self, data_dir: str, seq_len: int, folder: str):
    super().__init__(data_dir, seq_len)
    with open(_meta_path(folder)) as f:
      meta = json.load(f)
    if meta.get("format") != FORMAT or meta["data"] != _digest(data_dir) or \
        meta["done"] != len(self):
      raise ValueError(f"the feature cache in {folder} does not match {data_dir}, is of an "
                       "older format or is incomplete; rebuild it (or give another folder)")
    self.feats = np.load(os.path.join(folder, "features.npy"), mmap_mode="r")
    self.spans = _spans(self)

  def window(self, i: int, start: int, lo: int, hi: int):
    item = super().window(i, start, lo, hi)
    first = self.spans[int(i)] + start
    n = int(item["length"])
    feats = np.zeros((self.seq_len,) + self.feats.shape[1:], DTYPE)
    feats[:n] = self.feats[first:first + n].view(DTYPE)
    item["feats"] = feats
    return item
