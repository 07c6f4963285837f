"""Token shards, the training data's format on disk (`jspec train data` writes them): the manifest,
byte-deterministic atomic writers, fixed snapshots of a growing corpus, a grain data source over
the shards (its iterator: jspec.train.loader) and token statistics; and the small helpers the data
steps share.

On disk: `shard_%05d.npz` (tokens, loss_mask, offsets, prompt_ids, turns; see
jspec.train.data.regenerate) and `manifest.json` (config, per-shard and per-category counts,
`complete`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import warnings
import zipfile
from collections import Counter
from typing import Sequence

import numpy as np

FORMAT = "jspec-token-shards/1"
MANIFEST = "manifest.json"


def unpack_model(model, model_name: str | None):
  """(Llama, name) from a Llama or a models.LoadedModel."""
  if hasattr(model, "model") and hasattr(model, "tokenizer"):
    return model.model, model_name or model.name
  return model, model_name or "unnamed-model"


def derive_seed(*parts: int) -> int:
  """A 63-bit seed derived from integers (a request's, a batch's): the same parts, the same seed."""
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] >> 1)


def progress_bar(progress: bool, **kw):
  """A tqdm bar on stderr (disabled when progress is False)."""
  from tqdm import tqdm
  return tqdm(file=sys.stderr, disable=not progress, dynamic_ncols=True, **kw)


def write_atomic(path: str, data: bytes) -> None:
  """Writes through a temporary file and a rename: readers see the old file or the new one."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)


def write_json(path: str, obj) -> None:
  write_atomic(path, (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode())


def write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
  """np.savez-compatible, but byte-deterministic (fixed zip timestamps) and atomic."""
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
    for name, arr in arrays.items():
      member = io.BytesIO()
      np.lib.format.write_array(member, np.asarray(arr), allow_pickle=False)
      zf.writestr(zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0)),
                  member.getvalue())
  write_atomic(path, buf.getvalue())


def write_npy(path: str, arr: np.ndarray) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    np.lib.format.write_array(f, arr, allow_pickle=False)
  os.replace(tmp, path)


def read_jsonl(path: str) -> list[dict]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def read_manifest(data_dir: str) -> dict:
  path = os.path.join(data_dir, MANIFEST)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{data_dir!r} has no {MANIFEST}; build it with regenerate() or "
                            "build_dataset() first")
  with open(path) as f:
    manifest = json.load(f)
  if manifest.get("format") != FORMAT:
    raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
  return manifest


def summarise(manifest: dict) -> None:
  """Adds the shards' totals and per-category counts to a manifest."""
  keys = ("sequences", "tokens", "response_tokens", "multi_turn")
  total = {k: sum(s[k] for s in manifest["shards"]) for k in keys}
  total["skipped"] = sum(len(s["skipped"]) for s in manifest["shards"])
  by_cat: dict[str, Counter] = {}
  for s in manifest["shards"]:
    for cat, c in s["categories"].items():
      by_cat.setdefault(cat, Counter()).update(c)
  manifest["totals"] = total
  manifest["categories"] = {c: dict(v) for c, v in sorted(by_cat.items())}


def snapshot(out_dir: str, sources: Sequence[tuple[str, int | None]]) -> dict:
  """A training-data folder made of the first finished shards of one or more regenerated folders
  (`sources`: (folder, number of shards or None for all finished)), linked, not copied: a fixed
  dataset to train on while a regeneration goes on, a prefix for a data-scaling run, or greedy and
  sampled replies together. Returns its manifest (complete, with a `snapshot` record of the
  sources); the loaders read it like any other data folder."""
  if not sources:
    raise ValueError("give at least one source folder")
  if os.path.exists(out_dir) and os.listdir(out_dir):
    raise ValueError(f"{out_dir} exists and is not empty; give a new folder for the snapshot")
  picked, taps = [], None
  for src, n in sources:
    manifest = read_manifest(src)
    have = len(manifest["shards"])
    n = have if n is None else n
    if not 1 <= n <= have:
      raise ValueError(f"{src} has {have} finished shards; take between 1 and {have}, not {n}")
    src_taps = list(manifest["config"].get("taps") or [])
    if taps is not None and src_taps != taps:
      raise ValueError(f"{src} captured features at taps {src_taps}, an earlier source at {taps}; "
                       "snapshot sources must agree")
    taps = src_taps
    picked.append((src, manifest, n))
  os.makedirs(out_dir, exist_ok=True)
  shards, record = [], []
  for src, manifest, n in picked:
    for s in manifest["shards"][:n]:
      k = len(shards)
      s = dict(s)
      for key, name in (("file", f"shard_{k:05d}.npz"), ("features", f"shard_{k:05d}.features.npy")):
        if key in s:
          target = os.path.relpath(os.path.join(os.path.abspath(src), s[key]),
                                   os.path.abspath(out_dir))
          os.symlink(target, os.path.join(out_dir, name))
          s[key] = name
      shards.append(s)
    record.append(dict(source=os.path.abspath(src), shards=n, config=manifest["config"]))
  manifest = dict(format=FORMAT, config=dict(picked[0][1]["config"], taps=taps), complete=True,
                  snapshot=record, shards=shards)
  summarise(manifest)
  write_json(os.path.join(out_dir, MANIFEST), manifest)
  return manifest


class TokenShards:
  """A grain random-access data source over every shard of a data dir (held in memory).

  Item i: tokens int32 [seq_len] (right-padded with 0, truncated to the first seq_len tokens),
  loss_mask int32 [seq_len] (0 on padding), length int32 [] (the unpadded length, <= seq_len).
  """

  def __init__(self, data_dir: str, seq_len: int):
    if seq_len < 2:
      raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    manifest = read_manifest(data_dir)
    if not manifest["complete"]:
      warnings.warn(f"{data_dir}: the regeneration is not complete; using the "
                    f"{len(manifest['shards'])} shards written so far")
    if not manifest["shards"]:
      raise ValueError(f"{data_dir} has no shards yet")
    self.data_dir, self.seq_len = data_dir, seq_len
    tokens, masks, offsets, ids, turns, base = [], [], [], [], [], 0
    for s in manifest["shards"]:
      with np.load(os.path.join(data_dir, s["file"])) as z:
        tokens.append(z["tokens"])
        masks.append(z["loss_mask"])
        offsets.append(z["offsets"][:-1] + base)
        base += len(z["tokens"])
        ids.append(z["prompt_ids"])
        turns.append(z["turns"])
    self.tokens = np.concatenate(tokens)
    self.loss_mask = np.concatenate(masks)
    self.offsets = np.concatenate(offsets + [np.asarray([base], np.int64)])
    self.prompt_ids = np.concatenate(ids)
    self.turns = np.concatenate(turns)

  def __len__(self) -> int:
    return len(self.offsets) - 1

  def sequence(self, i: int) -> tuple[np.ndarray, np.ndarray]:
    """The whole sequence i: (tokens int32, loss_mask uint8), untruncated."""
    lo, hi = self.offsets[i], self.offsets[i + 1]
    return self.tokens[lo:hi], self.loss_mask[lo:hi]

  def __getitem__(self, i) -> dict[str, np.ndarray]:
    i = int(i)
    if not 0 <= i < len(self):
      raise IndexError(f"sequence {i} of {len(self)}")
    toks, mask = self.sequence(i)
    n = min(len(toks), self.seq_len)
    tokens = np.zeros(self.seq_len, np.int32)
    loss_mask = np.zeros(self.seq_len, np.int32)
    tokens[:n] = toks[:n]
    loss_mask[:n] = mask[:n]
    return dict(tokens=tokens, loss_mask=loss_mask, length=np.int32(n))

  def __repr__(self) -> str:
    return f"TokenShards({self.data_dir!r}, seq_len={self.seq_len}, sequences={len(self)})"


VOCAB_CHECK_SHARE = 10     # token_counts(part="check"): the sequences whose id hashes to 0 mod 10


def in_check_part(prompt_id: str) -> bool:
  return int(hashlib.sha256(prompt_id.encode()).hexdigest()[:8], 16) % VOCAB_CHECK_SHARE == 0


def token_counts(data_dir: str, vocab_size: int, replies_only: bool = True,
                 part: str | None = None) -> np.ndarray:
  """int64 [vocab_size]: how often each token occurs where loss_mask == 1 (the target's replies;
  every token with replies_only=False), over all shards; for choosing a reduced vocabulary.
  part: None (every sequence), "check" (a fixed tenth of the sequences, chosen by a hash of the
  prompt id: held out to measure a vocabulary's coverage) or "fit" (the rest)."""
  if part not in (None, "fit", "check"):
    raise ValueError(f"part must be None, 'fit' or 'check', got {part!r}")
  counts = np.zeros(vocab_size, np.int64)
  for s in read_manifest(data_dir)["shards"]:
    with np.load(os.path.join(data_dir, s["file"])) as z:
      toks, mask = z["tokens"], z["loss_mask"] == 1
      if part is not None:
        check = np.asarray([in_check_part(str(i)) for i in z["prompt_ids"]])
        keep = np.repeat(check if part == "check" else ~check, np.diff(z["offsets"]))
        toks, mask = toks[keep], mask[keep]
      toks = toks[mask] if replies_only else toks
    if len(toks) and (toks.min() < 0 or toks.max() >= vocab_size):
      raise ValueError(f"{s['file']} has token ids outside [0, {vocab_size}); wrong vocab_size?")
    counts += np.bincount(toks, minlength=vocab_size)
  return counts
