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


def shard_number(entry: dict) -> int:
  """The number in a manifest shard's file name (`shard_00024.npz` -> 24): a data folder resumed
  with `--first-shard` numbers its shards from there."""
  name = os.path.basename(entry["file"])
  digits = name.removeprefix("shard_").split(".")[0]
  if not digits.isdigit():
    raise ValueError(f"unexpected shard file name {name!r}")
  return int(digits)


def snapshot(out_dir: str, sources: Sequence[tuple[str, "int | tuple[int, int | None] | None"]]
             ) -> dict:
  """A training-data folder made of finished shards of one or more regenerated folders
  (`sources`: (folder, which): `which` is the number of shards to take from the start, None for
  all finished, or (first, last) shard numbers as in the file names, both included, last None
  for every finished one from first on), linked, not copied: a fixed dataset to train on while a
  regeneration goes on, a prefix for a data-scaling run, the shards no earlier run read, or
  greedy and sampled replies together. Returns its manifest (complete, with a `snapshot` record
  of the sources); the loaders read it like any other data folder."""
  if not sources:
    raise ValueError("give at least one source folder")
  if os.path.exists(out_dir) and os.listdir(out_dir):
    raise ValueError(f"{out_dir} exists and is not empty; give a new folder for the snapshot")
  picked, taps = [], None
  for src, which in sources:
    manifest = read_manifest(src)
    have = manifest["shards"]
    if isinstance(which, tuple):
      first, last = which
      numbers = [shard_number(e) for e in have]
      chosen = [e for e, k in zip(have, numbers) if k >= first and (last is None or k <= last)]
      if not chosen or (last is not None and last < first):
        span = f"{numbers[0]}-{numbers[-1]}" if numbers else "none"
        raise ValueError(f"{src} has no finished shard numbered {first}-{'' if last is None else last}"
                         f" (its finished shards: {span})")
    else:
      n = len(have) if which is None else which
      if not 1 <= n <= len(have):
        raise ValueError(f"{src} has {len(have)} finished shards; take between 1 and {len(have)}, "
                         f"not {n}")
      chosen = have[:n]
    src_taps = list(manifest["config"].get("taps") or [])
    if taps is not None and src_taps != taps:
      raise ValueError(f"{src} captured features at taps {src_taps}, an earlier source at {taps}; "
                       "snapshot sources must agree")
    taps = src_taps
    picked.append((src, manifest, chosen))
  os.makedirs(out_dir, exist_ok=True)
  shards, record = [], []
  for src, manifest, chosen in picked:
    for s in chosen:
      k = len(shards)
      s = dict(s)
      for key, name in (("file", f"shard_{k:05d}.npz"), ("features", f"shard_{k:05d}.features.npy")):
        if key in s:
          target = os.path.relpath(os.path.join(os.path.abspath(src), s[key]),
                                   os.path.abspath(out_dir))
          os.symlink(target, os.path.join(out_dir, name))
          s[key] = name
      shards.append(s)
    record.append(dict(source=os.path.abspath(src), shards=len(chosen),
                       numbers=[shard_number(e) for e in chosen], config=manifest["config"]))
  manifest = dict(format=FORMAT, config=dict(picked[0][1]["config"], taps=taps), complete=True,
                  snapshot=record, shards=shards)
  summarise(manifest)
  write_json(os.path.join(out_dir, MANIFEST), manifest)
  return manifest


class TokenShards:
  """A grain random-access data source over every shard of a data dir (held in memory).

  Item i: tokens int32 [seq_len] (right-padded with 0, truncated to the first seq_len tokens),
  loss_mask int32 [seq_len] (0 on padding), length int32 [] (the unpadded length, <= seq_len).
  `window(...)` cuts any other part of a sequence; `ReplyWindows` uses it to reach every reply
  token of sequences longer than seq_len.
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
    return self.window(i, 0, 0, self.offsets[i + 1] - self.offsets[i])

  def window(self, i: int, start: int, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Sequence i's tokens [start, start + seq_len) as an item, its loss_mask kept only at
    positions lo <= p < hi of the sequence (the reply tokens this window labels)."""
    toks, mask = self.sequence(int(i))
    n = max(0, min(len(toks) - start, self.seq_len))
    tokens = np.zeros(self.seq_len, np.int32)
    loss_mask = np.zeros(self.seq_len, np.int32)
    tokens[:n] = toks[start:start + n]
    keep = np.arange(start, start + n)
    loss_mask[:n] = np.where((keep >= lo) & (keep < hi), mask[start:start + n], 0)
    return dict(tokens=tokens, loss_mask=loss_mask, length=np.int32(n))

  def __repr__(self) -> str:
    return f"TokenShards({self.data_dir!r}, seq_len={self.seq_len}, sequences={len(self)})"


def reply_windows(mask: np.ndarray, seq_len: int, per_window: int) -> list[tuple[int, int, int]]:
  """(start, lo, hi) windows among which each reply token (mask > 0) of one sequence is labelled
  in exactly one: the reply tokens are taken in order, `per_window` at a time (fewer where the next
  one lies seq_len or more after the group's first), and each group ends its window, so the
  tokens before it fill the rest as context. A sequence that fits in seq_len with at most
  per_window reply tokens gives the single window (0, 0, len)."""
  pos = np.flatnonzero(mask)
  if len(pos) == 0:
    return []
  out, a = [], 0
  while a < len(pos):
    b = min(a + per_window, int(np.searchsorted(pos, pos[a] + seq_len)))
    last = int(pos[b - 1])
    lo = 0 if a == 0 else int(pos[a])
    hi = len(mask) if b == len(pos) else int(pos[b])
    out.append((max(0, last + 1 - seq_len), lo, hi))
    a = b
  return out


class ReplyWindows:
  """A grain data source: the windows (`reply_windows`) of chosen sequences of a TokenShards, so
  training labels every reply token once per epoch, not only those in each sequence's first
  seq_len tokens. Each window labels at most seq_len // 2 reply tokens, the anchors a training
  step takes per row (EAGLE-3's later TTT steps label from up to ttt_steps - 1 more anchors, so
  a full window may lose that many step-0 labels at its end)."""

  def __init__(self, source: TokenShards, sequences: Sequence[int]):
    self.source = source
    rows = []
    for i in sequences:
      _, mask = source.sequence(int(i))
      rows += [(int(i),) + w for w in reply_windows(mask, source.seq_len,
                                                    max(1, source.seq_len // 2))]
    self.rows = np.asarray(rows, np.int64).reshape(-1, 4)

  def __len__(self) -> int:
    return len(self.rows)

  def __getitem__(self, k) -> dict[str, np.ndarray]:
    return self.source.window(*(int(x) for x in self.rows[int(k)]))

  def __repr__(self) -> str:
    return f"ReplyWindows({self.source!r}, windows={len(self)})"


def pack_rows(lengths: np.ndarray, labels: np.ndarray, seq_len: int,
              label_budget: int, min_room: int = 16) -> list[list[int]]:
  """First-fit decreasing: indices into `lengths` grouped into rows of at most seq_len tokens and
  at most label_budget labels (`labels`, per sequence) each; a sequence over either limit gets a
  row of its own. A row with fewer than min_room tokens left takes no more (so the search stays
  short). Deterministic (ties kept in index order)."""
  order = np.lexsort((np.arange(len(lengths)), -np.asarray(lengths)))
  rows, room, budget, open_rows = [], [], [], []
  for i in order:
    n, lab = int(lengths[i]), int(labels[i])
    for r in open_rows:
      if room[r] >= n and budget[r] >= lab:
        break
    else:
      r = len(rows)
      rows.append([])
      room.append(seq_len)
      budget.append(label_budget)
      open_rows.append(r)
    rows[r].append(int(i))
    room[r] -= n
    budget[r] -= lab
    if room[r] < min_room or budget[r] <= 0:
      open_rows.remove(r)
  return rows


class PackedRows:
  """A grain data source: several sequences of a TokenShards packed into one row, so a training
  step spends no positions on padding and its anchor budget on labels (`pack_rows`: at most
  seq_len tokens and seq_len // 2 labelled anchors, a piece's reply tokens plus the two a TTT step
  may add, per row). The pieces are each sequence's first seq_len tokens, as unpacked, or with
  `windows` its reply windows (`reply_windows`, as `ReplyWindows`), so that an epoch labels every
  reply token once.

  Items add `segments` int32 [seq_len] (1, 2, ... per packed piece, 0 on padding) and
  `positions` int32 [seq_len] (each token's position in its own piece); a loss that reads them
  keeps pieces apart (attention, labels, RoPE). `length` is the row's token count. `rows` lists
  each row's pieces as (sequence, start, lo, hi) for `TokenShards.window`."""

  def __init__(self, source: TokenShards, sequences: Sequence[int], windows: bool = False):
    self.source = source
    n = source.seq_len
    pieces, lengths, labels = [], [], []
    for i in sequences:
      _, mask = source.sequence(int(i))
      wins = (reply_windows(mask, n, max(1, n // 2)) if windows else [(0, 0, len(mask))])
      for start, lo, hi in wins:
        m = min(len(mask) - start, n)
        at = np.arange(start, start + m)
        pieces.append((int(i), int(start), int(lo), int(hi)))
        lengths.append(m)
        labels.append(int(np.count_nonzero(mask[start:start + m] * ((at >= lo) & (at < hi)))) + 2)
    self.rows = [[pieces[k] for k in r]
                 for r in pack_rows(np.asarray(lengths), np.asarray(labels), n, max(1, n // 2))]

  def __len__(self) -> int:
    return len(self.rows)

  def __getitem__(self, k) -> dict[str, np.ndarray]:
    items = [self.source.window(*piece) for piece in self.rows[int(k)]]
    n = self.source.seq_len
    out = {key: np.zeros_like(v) for key, v in items[0].items() if key != "length"}
    out["segments"] = np.zeros(n, np.int32)
    out["positions"] = np.zeros(n, np.int32)
    at = 0
    for seg, item in enumerate(items, start=1):
      m = int(item["length"])
      for key in out:
        if key in item:
          out[key][at:at + m] = item[key][:m]
      out["segments"][at:at + m] = seg
      out["positions"][at:at + m] = np.arange(m)
      at += m
    out["length"] = np.int32(at)
    return out

  def __repr__(self) -> str:
    return f"PackedRows({self.source!r}, rows={len(self)})"


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
