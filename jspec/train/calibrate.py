"""Calibration saved beside a trained head (`jspec train calibrate`), measured on prompts the head
never saw and that are not the benchmark suite: the target answers them greedily, and
  dspark   every reply position opens a block; position k's confidence temperature is fitted to the
           greedy survival (slots 1..k all equal the target's argmax): calibration.json, read by
           `confidence_schedule=true` (jspec.confidence);
  medusa   how often head k's rank-r candidate is the token that follows: rank_accuracy.json, read
           by `tree_choices="auto"` (jspec.drafters.static_tree.best_tree).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jspec.confidence import fit_temperatures
from jspec.drafters.dflash import checkpoint as dflash_format
from jspec.drafters.dspark import save_calibration
from jspec.drafters.medusa import attach_target_rows
from jspec.drafters.medusa import checkpoint as medusa_format
from jspec.train.dflash import block_loss
from jspec.train.medusa import final_hidden, rank_accuracy
from jspec.train.replay import greedy_replies
from jspec.train.shared import target_features
from models.llama import Llama


@dataclasses.dataclass(frozen=True)
class Replies:
  tokens: np.ndarray      # [N, T] int32 prompt + greedy reply, zero-padded
  reply: np.ndarray       # [N, T] bool: the reply's positions
  length: np.ndarray      # [N] int32 prompt + reply tokens

  @property
  def reply_tokens(self) -> int:
    return int(self.reply.sum())


def pack_replies(target: Llama, prompts: Sequence[Sequence[int]], *, eos_ids=(),
                 max_new_tokens: int = 96) -> Replies:
  """The target's greedy replies to `prompts` (token ids, jspec.train.replay.greedy_replies),
  packed after them."""
  if not prompts:
    raise ValueError("calibration needs at least one prompt")
  replies = greedy_replies(target, [list(p) for p in prompts], max_new_tokens=max_new_tokens,
                           eos_ids=eos_ids)
  n = max(len(p) + len(r) for p, r in zip(prompts, replies))
  tokens = np.zeros((len(prompts), n), np.int32)
  reply = np.zeros((len(prompts), n), bool)
  for i, (p, r) in enumerate(zip(prompts, replies)):
    tokens[i, :len(p) + len(r)] = list(p) + r
    reply[i, len(p):len(p) + len(r)] = True
  length = np.asarray([len(p) + len(r) for p, r in zip(prompts, replies)], np.int32)
  return Replies(tokens, reply, length)


def calibrate_dspark(target: Llama, folder: str, data: Replies, *, source: str = "") -> dict:
  """Fits the DSpark head's per-position confidence temperatures and saves calibration.json in
  its folder. Returns the summary (blocks, temperatures, survival, ECE before / after)."""
  module = dflash_format.load(folder, "dspark")
  ids = module.backbone.draft_to_target[...]
  tokens = jnp.asarray(data.tokens)
  feats = target_features(target, tokens, module.config.taps, ids)
  graphdef, state = nnx.split(module)
  # weights and features go in as arguments: closed over, they would be baked into the program
  _, _, out = jax.jit(lambda s, *a: block_loss(
      nnx.merge(graphdef, s), *a, jax.random.key(0), gamma=4.0,
      max_anchors=min(128, tokens.shape[1]), outputs=True))(
          state, target.embed_table(), target.head_rows(ids), feats.taps, feats.target_logits,
          tokens, jnp.asarray(data.reply.astype(np.int32)), jnp.asarray(data.length))
  d = module.config.max_draft
  full = np.asarray(jnp.all(out["w"] > 0, axis=-1)).reshape(-1)      # blocks with every label
  if not full.any():
    raise ValueError(f"no reply is long enough to open a whole block of {d} drafts; give longer "
                     "replies (max_new_tokens) or more prompts")
  conf = np.asarray(out["confidence"]).reshape(-1, d)[full]
  survived = np.cumprod(np.asarray(out["hit"]).reshape(-1, d)[full], axis=1)
  temps, before, after = fit_temperatures(conf, survived)
  blocks = int(full.sum())
  save_calibration(folder, temps, ece_before=before, ece_after=after,
                   source=f"{source}: {len(data.length)} prompts, {blocks} blocks, greedy survival")
  return {"blocks": blocks, "temperatures": np.round(temps, 3).tolist(),
          "survival": np.round(survived.mean(0), 3).tolist(),
          "ece_before": np.round(before, 4).tolist(), "ece_after": np.round(after, 4).tolist()}


def calibrate_medusa(target: Llama, folder: str, data: Replies, *, ranks: int = 4,
                     source: str = "") -> dict:
  """Measures the Medusa head's rank accuracies [heads, ranks] and saves rank_accuracy.json in its
  folder. Returns the summary."""
  if not (isinstance(ranks, int) and ranks >= 1):
    raise ValueError(f"ranks must be an integer >= 1, got {ranks!r}")
  head = medusa_format.load_medusa(folder)
  attach_target_rows(head, target)
  if ranks > head.config.draft_vocab_size:
    raise ValueError(f"ranks ({ranks}) exceeds the head's draft vocabulary "
                     f"({head.config.draft_vocab_size})")
  tokens = jnp.asarray(data.tokens)
  acc = rank_accuracy(head, final_hidden(target, tokens), tokens, jnp.asarray(data.reply), ranks)
  medusa_format.save_rank_accuracy(folder, acc, source=f"{source}: {len(data.length)} prompts, "
                                   f"{data.reply_tokens} greedy reply tokens")
  return {"rank_accuracy": np.round(acc, 4).tolist()}
