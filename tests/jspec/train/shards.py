"""Tiny training data for the learned-drafter training tests: prompts answered greedily by a tiny
target, written as one shard in `jspec train data`'s format."""

import json

import numpy as np

from jspec import Decoder
from jspec.train.shards import FORMAT


def random_prompts(n, vocab_size, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, vocab_size, int(rng.integers(4, 9))).tolist() for _ in range(n)]


def write_greedy_shards(folder, target, prompts, max_new_tokens=40):
  """folder: a pathlib.Path; the replies' tokens are the loss mask."""
  out = Decoder(target).generate(prompts, max_new_tokens=max_new_tokens, eos=False)
  seqs = [p + r for p, r in zip(prompts, out.token_ids)]
  masks = [[0] * len(p) + [1] * len(r) for p, r in zip(prompts, out.token_ids)]
  np.savez(folder / "shard_00000.npz", tokens=np.concatenate(seqs).astype(np.int32),
           offsets=np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64),
           loss_mask=np.concatenate(masks).astype(np.uint8),
           prompt_ids=np.asarray([f"p{i}" for i in range(len(seqs))]),
           turns=np.ones(len(seqs), np.int32))
  (folder / "manifest.json").write_text(json.dumps(
      {"format": FORMAT, "complete": True, "shards": [{"file": "shard_00000.npz"}]}))
