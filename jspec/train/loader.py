"""The checkpointable grain loader that training reads: batches of a data dir's token shards
(jspec.train.shards), with the target's cached features (jspec.train.features) where asked."""

from __future__ import annotations

import json

import numpy as np

from jspec.train.shards import PackedRows, ReplyWindows, TokenShards
from jspec.train.features import FeatureShards

HOLDOUT_SEED = 12345   # the fixed permutation that sets held-out sequences aside


def _source(data_dir: str, seq_len: int, features: str | None):
  if features is None:
    return TokenShards(data_dir, seq_len)
  return FeatureShards(data_dir, seq_len, features)


def _holdout_order(n: int):
  """The sequence ids in the held-out permutation (the same one `_split` applies to the items:
  grain's shuffle depends only on length and seed)."""
  import grain
  return grain.MapDataset.source(range(n)).shuffle(seed=HOLDOUT_SEED)


def _split(source, holdout: int, windows: bool = False, pack: bool = False):
  """(training MapDataset, held-out items): `holdout` sequences of a fixed permutation are held
  out (their first seq_len tokens); the rest train, as whole-sequence windows (`ReplyWindows`)
  when `windows`, packed several to a row (`PackedRows`, of windows when `windows` too) when
  `pack`, else their first seq_len tokens."""
  import grain
  if holdout < 0 or holdout >= len(source):
    raise ValueError(f"holdout must be in [0, {len(source)}) sequences, got {holdout}")
  perm = grain.MapDataset.source(source).shuffle(seed=HOLDOUT_SEED)
  held = [perm[i] for i in range(holdout)]
  if not (windows or pack):
    return perm[holdout:], held
  order = _holdout_order(len(source))
  train = [order[i] for i in range(holdout, len(source))]
  rows = PackedRows(source, train, windows) if pack else ReplyWindows(source, train)
  return grain.MapDataset.source(rows), held


def make_dataset(data_dir: str, *, seq_len: int, batch_size: int, seed: int,
                 num_epochs: int | None = None, holdout: int = 0, features: str | None = None,
                 windows: bool = False, pack: bool = False):
  """grain.MapDataset: TokenShards minus `holdout` held-out sequences (as `ReplyWindows` when
  `windows`, so every reply token is labelled; as `PackedRows` when `pack`, of the windows when
  both) -> shuffle(seed;
  reshuffled each epoch) ->
  repeat(num_epochs; None = forever) -> batch(batch_size, drop_remainder=True).
  Batches are dicts of stacked arrays: tokens [B, seq_len], loss_mask [B, seq_len], length [B]
  (and feats [B, seq_len, K+1, H] from a feature cache folder, jspec.train.features)."""
  train, _ = _split(_source(data_dir, seq_len, features), holdout, windows, pack)
  if len(train) < batch_size:
    raise ValueError(f"{data_dir} has {len(train)} training items (after holding out "
                     f"{holdout} sequences), fewer than batch_size={batch_size}; regenerate more "
                     "data or lower them")
  return train.shuffle(seed=seed).repeat(num_epochs).batch(batch_size, drop_remainder=True)


def heldout_batches(data_dir: str, *, seq_len: int, batch_size: int, holdout: int,
                    features: str | None = None,
                    windows: bool = False) -> list[dict[str, np.ndarray]]:
  """The `holdout` sequences make_dataset sets aside, as batches (the last may be smaller): their
  first seq_len tokens, or every reply window of them (`ReplyWindows`, unpacked) when `windows`,
  so a windowed run is evaluated on every held-out reply token, as it trains."""
  source = _source(data_dir, seq_len, features)
  _, held = _split(source, holdout)
  if windows and holdout:
    order = _holdout_order(len(source))
    rows = ReplyWindows(source, [order[i] for i in range(holdout)])
    held = [rows[i] for i in range(len(rows))]
  if not held:
    return []
  return [{k: np.stack([r[k] for r in held[i:i + batch_size]]) for k in held[0]}
          for i in range(0, len(held), batch_size)]


def make_iterator(data_dir: str, *, seq_len: int, batch_size: int, seed: int,
                  num_epochs: int | None = None, holdout: int = 0, features: str | None = None,
                  windows: bool = False, pack: bool = False, num_threads: int = 2,
                  prefetch: int = 8):
  """A grain DatasetIterator over `make_dataset(...)`. Its state is `it.get_state()` (a small
  JSON dict) and `it.set_state(state)` restores it; orbax checkpoints it directly with
  `grain.checkpoint.CheckpointSave(it)` / `CheckpointRestore(it)` in a `CheckpointManager`."""
  import grain
  ds = make_dataset(data_dir, seq_len=seq_len, batch_size=batch_size, seed=seed,
                    num_epochs=num_epochs, holdout=holdout, features=features,
                    windows=windows, pack=pack)
  return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads,
                                                   prefetch_buffer_size=prefetch)))


def iterator_state(it) -> dict:
  """The iterator's position as a JSON-serialisable dict (a copy)."""
  return json.loads(json.dumps(it.get_state()))


def restore_iterator(data_dir: str, state: dict, **kwargs):
  """A new iterator (same kwargs as make_iterator) positioned where `state` was taken: it yields
  exactly the batches the saved iterator would have yielded next."""
  it = make_iterator(data_dir, **kwargs)
  it.set_state(state)
  return it
