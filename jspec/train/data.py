"""Regeneration: the target answers the prompts (and, for a share of them, a second user turn it
writes itself) into resumable token shards (jspec.train.shards), with its hidden-state taps where
asked; `build_dataset` runs the whole step (Magpie prompts, then regeneration) resumably.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import time
from collections import Counter
from typing import Sequence

import numpy as np

from jspec.slots import Request, SlotDecoder
from jspec.train.chat import clean_user_turn, encode_piece, prompt_ids, turn_glue
from jspec.train.prompts.magpie import synthesize_prompts
from jspec.train.shards import (FORMAT, MANIFEST, derive_seed, progress_bar, read_manifest,
                                summarise, unpack_model, write_json, write_npy, write_npz)

DEFAULT_MAX_LEN = 2048        # tokens per regeneration slot (prompt + replies)


def _check_prompts(prompts: Sequence[dict]) -> None:
  if not prompts:
    raise ValueError("no prompts given")
  seen = set()
  for n, p in enumerate(prompts):
    where = f"prompt {n} ({p.get('id')!r})" if isinstance(p, dict) else f"prompt {n}"
    if not isinstance(p, dict) or not isinstance(p.get("id"), str) or \
        not isinstance(p.get("messages"), (list, tuple)) or not p["messages"]:
      raise ValueError(f"{where}: need a dict with 'id' (str) and 'messages' (a non-empty list)")
    if p["id"] in seen:
      raise ValueError(f"{where}: id used twice; prompt ids must be unique")
    seen.add(p["id"])
    for m in p["messages"]:
      if not isinstance(m, dict) or not {"role", "content"} <= set(m) or \
          not isinstance(m["content"], str):
        raise ValueError(f"{where}: each message needs 'role' and 'content' (str), got {m!r:.80}")
    if p["messages"][-1]["role"] != "user":
      raise ValueError(f"{where}: the last message must be the user's (the target answers it)")


def _prompts_digest(prompts: Sequence[dict]) -> str:
  h = hashlib.sha256()
  for p in prompts:
    h.update(json.dumps([p["id"], list(p["messages"])], sort_keys=True).encode())
  return h.hexdigest()


def regenerate(model, tokenizer, prompts: Sequence[dict], out_dir: str, *, shard_size: int = 256,
               batch_size: int = 64, max_new_tokens: int = 512, temperature: float = 0.0,
               seed: int = 0, multi_turn: float = 0.0, user_max_new_tokens: int = 96,
               user_temperature: float = 1.0, user_top_p: float = 0.95,
               max_len: int | None = None, taps: Sequence[int] = (), model_name: str | None = None,
               first_shard: int = 0, progress: bool = True) -> dict:
  """Answers every prompt with the target and writes `out_dir/shard_%05d.npz` + `manifest.json`;
  returns the manifest.

  Shard k holds prompts[k*shard_size : (k+1)*shard_size], in order, one sequence each (prompts of
  max_len tokens or more are skipped and listed in the manifest):
    tokens     int32 [total]  the chat-templated conversations (prompt + reply, + turn 2), joined
    offsets    int64 [n+1]    sequence i is tokens[offsets[i]:offsets[i+1]]
    loss_mask  uint8 [total]  1 on tokens the target generated as an assistant reply (the EOS it
                              stopped on included), 0 on prompt, template and user tokens
    prompt_ids str   [n]      the prompt records' ids
    turns      uint8 [n]      assistant replies in the sequence (2 = continued for a sampled turn)
    stopped    uint8 [n]      1 where the last reply ended with EOS (0: cut at max_new_tokens)
  With `taps`, also `shard_%05d.features.npy`: bfloat16 bits (uint16) [total, K + 1, H] aligned
  with `tokens`: each token's K taps and final normed hidden state, captured while generating
  (`jspec.slots`), so training needs no second pass of the target.

  Generation is `jspec.slots.SlotDecoder` over `batch_size` slots of max_len tokens (default
  DEFAULT_MAX_LEN or the model's context if shorter): when a reply
  ends, the next prompt takes its slot. A fraction `multi_turn` of conversations whose reply ended
  with EOS is continued: a user turn is sampled from the target after the reply (Magpie; user_*
  settings), then answered, in the same stream. Every request is seeded by (seed, shard, turn,
  prompt), so its tokens do not depend on the batching. Resumable: shards listed in the manifest
  are skipped, and shard k always makes the same requests in the same order, so a resumed run
  writes the same bytes as an uninterrupted one. `first_shard` = k starts at shard k (the earlier
  shards are not made): fresh prompts for a head trained on another folder's first k shards, with
  the same bytes as that folder's shard k onwards.
  """
  model, name = unpack_model(model, model_name)
  _check_prompts(prompts)
  max_len = min(DEFAULT_MAX_LEN, model.config.max_position) if max_len is None else max_len
  if shard_size < 1 or batch_size < 1 or max_new_tokens < 1:
    raise ValueError("shard_size, batch_size and max_new_tokens must be >= 1")
  num_shards = -(-len(prompts) // shard_size)
  if not 0 <= first_shard < num_shards:
    raise ValueError(f"first_shard must be in [0, {num_shards}) for {len(prompts)} prompts in "
                     f"shards of {shard_size}, got {first_shard}")
  if not max_new_tokens < max_len <= model.config.max_position:
    raise ValueError(f"need max_new_tokens < max_len <= the model's context "
                     f"({model.config.max_position}), got {max_new_tokens} and {max_len}")
  if not 0.0 <= multi_turn <= 1.0:
    raise ValueError(f"multi_turn is a fraction in [0, 1], got {multi_turn}")
  config = dict(model=name, temperature=float(temperature), max_new_tokens=int(max_new_tokens),
                seed=int(seed), multi_turn=float(multi_turn), shard_size=int(shard_size),
                batch_size=int(batch_size), max_len=int(max_len), taps=[int(t) for t in taps],
                user_max_new_tokens=int(user_max_new_tokens),
                user_temperature=float(user_temperature), user_top_p=float(user_top_p),
                num_prompts=len(prompts), prompts_sha256=_prompts_digest(prompts))
  if first_shard:        # absent at 0, so folders made before the option still resume
    config["first_shard"] = int(first_shard)
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, MANIFEST)
  if os.path.exists(path):
    manifest = read_manifest(out_dir)
    diff = {k: (manifest["config"].get(k), config.get(k))
            for k in {**manifest["config"], **config}
            if manifest["config"].get(k) != config.get(k)}
    if diff:
      raise ValueError(f"{out_dir} holds data made with another config ("
                       + ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
                       + "); use another out_dir (or the same settings to resume)")
    for s in manifest["shards"]:
      for f in (s["file"],) + ((s["features"],) if "features" in s else ()):
        if not os.path.isfile(os.path.join(out_dir, f)):
          raise ValueError(f"{out_dir}: the manifest lists {f} but the file is missing; "
                           "restore it or start over in another out_dir")
  else:
    manifest = dict(format=FORMAT, config=config, complete=False, shards=[])
  dec = SlotDecoder(model, eos_ids=tokenizer.eos_ids, slots=batch_size, max_len=max_len,
                    max_new_tokens=max(max_new_tokens, user_max_new_tokens), taps=taps)
  skipped = first_shard * shard_size
  bar = progress_bar(progress, total=len(prompts) - skipped, unit="seq",
                     desc=f"regenerate {out_dir}",
                     initial=min(len(manifest["shards"]) * shard_size, len(prompts) - skipped))
  t0 = time.perf_counter()
  # One request stream over every shard left: the next shard's prompts join the queue before the
  # current one's last rows end, so the slots never drain between shards. Shards are written in
  # order as soon as all their sequences are done.
  todo = iter(range(first_shard + len(manifest["shards"]), num_shards))
  work: dict[int, _ShardWork] = {}
  queue: collections.deque = collections.deque()
  started = {}

  def top_up():
    while len(queue) < 2 * batch_size:
      k = next(todo, None)
      if k is None:
        return
      work[k] = _ShardWork(tokenizer, prompts[k * shard_size:(k + 1) * shard_size], k, config)
      started[k] = (time.perf_counter(), dec.stats["generated_tokens"])
      queue.extend(work[k].first_requests())

  def write_finished():
    while work and min(work) in work and work[min(work)].finished:
      k = min(work)
      arrays, feats, stats = work.pop(k).result()
      t_start, g_start = started.pop(k)
      stats["file"] = f"shard_{k:05d}.npz"
      stats["seconds"] = round(time.perf_counter() - t_start, 2)      # overlaps its neighbours
      stats["generated_tokens"] = stats.pop("generated")
      if feats is not None:
        stats["features"] = f"shard_{k:05d}.features.npy"
        write_npy(os.path.join(out_dir, stats["features"]), feats)
      write_npz(os.path.join(out_dir, stats["file"]), arrays)
      manifest["shards"].append(stats)
      manifest["tokens_per_s"] = round(
          (dec.stats["generated_tokens"]) / max(time.perf_counter() - t0, 1e-9), 1)
      summarise(manifest)
      write_json(path, manifest)

  top_up()
  for res in dec.stream(queue):
    k = res.index[0]
    if work[k].take(res, queue):
      _tick(bar, dec, t0)
    write_finished()
    top_up()
  write_finished()
  bar.close()
  manifest["complete"] = first_shard + len(manifest["shards"]) == num_shards
  summarise(manifest)
  write_json(path, manifest)
  return manifest


def _tick(bar, dec: SlotDecoder, t0: float):
  bar.update(1)
  rate = dec.stats["generated_tokens"] / max(time.perf_counter() - t0, 1e-9)
  bar.set_postfix(tok_s=f"{rate:.0f}")


def _next_user_context(tokenizer, messages, seq: list[int]) -> tuple[list[int], str]:
  """seq = the prompt for `messages` + the target's reply -> (token ids up to where the next user
  turn's content begins, template text after that content up to the next reply)."""
  after_reply, after_user = turn_glue(tokenizer, messages)
  closing = tokenizer.decode([seq[-1]])
  if seq[-1] in tokenizer.eos_ids and after_reply.startswith(closing):
    after_reply = after_reply[len(closing):]     # the reply's EOS already closed the turn
  return seq + encode_piece(tokenizer, after_reply), after_user


class _ShardWork:
  """The requests of one shard and what came back: turn 1 for each prompt, then for a fraction
  `multi_turn` of the conversations whose reply ended with EOS a sampled user turn and its answer.
  Every request is tagged (shard, prompt, turn) and seeded by (seed, shard, turn, prompt)."""

  def __init__(self, tokenizer, chunk: Sequence[dict], k: int, config: dict):
    self.tok, self.chunk, self.k, self.config = tokenizer, list(chunk), k, config
    self.eos = set(tokenizer.eos_ids)
    self.limit = config["max_len"]
    # turn 1: the prompt as the library renders it, answered by the target
    self.prompt = [prompt_ids(tokenizer, p["messages"]) for p in self.chunk]
    self.live = [i for i, ids in enumerate(self.prompt) if len(ids) < self.limit]
    self.draw = np.random.default_rng([config["seed"], k, 7]).random(len(self.chunk))
    self.seqs, self.masks, self.turns, self.stopped, self.feats = {}, {}, {}, {}, {}
    self.pending: dict = {}
    self.open = len(self.live)            # conversations not finished yet
    self.generated = 0

  @property
  def finished(self) -> bool:
    return self.open == 0

  def _answer(self, ids, turn: int, i: int):
    cfg = self.config
    return (self.k, i, turn), Request(ids, min(cfg["max_new_tokens"], self.limit - len(ids)),
                                      cfg["temperature"],
                                      seed=derive_seed(cfg["seed"], self.k, turn, i))

  def first_requests(self) -> list:
    return [self._answer(self.prompt[i], 0, i)
            for i in sorted(self.live, key=lambda i: (-len(self.prompt[i]), i))]

  def take(self, res, queue) -> bool:
    """Records a result; a follow-up request goes to the front of the queue (a conversation
    left open holds its whole shard back from being written). True when it ended a
    conversation."""
    _, i, turn = res.index
    cfg, tok = self.config, self.tok
    self.generated += len(res.token_ids)
    if turn == 0:
      reply = res.token_ids
      self.seqs[i] = self.prompt[i] + reply
      self.masks[i] = [0] * len(self.prompt[i]) + [1] * len(reply)
      self.turns[i], self.stopped[i] = 1, bool(reply) and reply[-1] in self.eos
      self.feats[i] = res.features
      # turn 2 for a fraction of the conversations: a sampled user turn, then the target's answer
      if self.draw[i] < cfg["multi_turn"] and self.stopped[i]:
        ctx, glue_after_user = _next_user_context(tok, self.chunk[i]["messages"], self.seqs[i])
        if len(ctx) + 2 < self.limit:
          self.pending[i] = ctx, glue_after_user
          queue.appendleft(((self.k, i, 1), Request(
              ctx, min(cfg["user_max_new_tokens"], self.limit - len(ctx)),
              cfg["user_temperature"], top_p=cfg["user_top_p"],
              seed=derive_seed(cfg["seed"], self.k, 1, i))))
          return False
    elif turn == 1:
      ctx, glue_after_user = self.pending.pop(i)
      text, _ = clean_user_turn(tok, res.token_ids, drop_truncated=True)
      if text is not None:
        p2 = ctx + encode_piece(tok, text) + encode_piece(tok, glue_after_user)
        if len(p2) < self.limit:
          self.pending[i] = p2
          queue.appendleft(self._answer(p2, 2, i))
          return False
    else:
      p2, a = self.pending.pop(i), res.token_ids
      self.masks[i] = self.masks[i] + [0] * (len(p2) - len(self.seqs[i])) + [1] * len(a)
      self.seqs[i], self.turns[i] = p2 + a, 2
      self.stopped[i], self.feats[i] = bool(a) and a[-1] in self.eos, res.features
    self.open -= 1
    return True

  def result(self) -> tuple[dict, np.ndarray | None, dict]:
    live, seqs, masks, turns = self.live, self.seqs, self.masks, self.turns
    lengths = [len(seqs[i]) for i in live]
    arrays = dict(
        tokens=np.asarray([t for i in live for t in seqs[i]], np.int32),
        offsets=np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64),
        loss_mask=np.asarray([m for i in live for m in masks[i]], np.uint8),
        prompt_ids=np.asarray([self.chunk[i]["id"] for i in live], dtype=str),
        turns=np.asarray([turns[i] for i in live], np.uint8),
        stopped=np.asarray([self.stopped[i] for i in live], np.uint8))
    features = None
    if self.config["taps"] and live:
      features = np.concatenate([self.feats[i] for i in live], axis=0).view(np.uint16)
    cats: dict[str, Counter] = {}
    for i in live:
      c = cats.setdefault(self.chunk[i].get("category", "none"), Counter())
      c.update(sequences=1, tokens=len(seqs[i]), response_tokens=sum(masks[i]),
               multi_turn=int(turns[i] == 2))
    skipped = [p["id"] for p, ids in zip(self.chunk, self.prompt) if len(ids) >= self.limit]
    stats = dict(prompts=len(self.chunk), sequences=len(live), tokens=int(sum(lengths)),
                 response_tokens=int(arrays["loss_mask"].sum()),
                 multi_turn=sum(t == 2 for t in turns.values()), skipped=skipped,
                 categories={c: dict(v) for c, v in sorted(cats.items())},
                 generated=self.generated)
    return arrays, features, stats


def load_prompt_records(path: str) -> list[dict]:
  """A prompt file in the benchmark suite's format -> records (validated by jspec.prompt_suite)."""
  from jspec import prompt_suite
  return [dict(id=p.id, category=p.category, messages=[dict(m) for m in p.messages],
               source=p.source) for p in prompt_suite.load(path)]


def build_dataset(model, out_dir: str, *, prompt_files: Sequence[str], num_magpie: int,
                  magpie_batch_size: int = 32, magpie_max_new_tokens: int = 96,
                  magpie_temperature: float = 1.0, magpie_top_p: float = 0.95,
                  shard_size: int = 256, batch_size: int = 64, max_new_tokens: int = 512,
                  temperature: float = 0.0, multi_turn: float = 0.0, max_len: int | None = None,
                  taps: Sequence[int] = (), shuffle: bool = False, seed: int = 0,
                  first_shard: int = 0, progress: bool = True) -> dict:
  """Samples `num_magpie` Magpie prompts into out_dir/magpie.jsonl, then regenerates answers to
  the prompt files' prompts followed by the Magpie ones (all in a seeded random order with
  `shuffle`, so that every shard holds each kind of prompt in proportion) into out_dir's shards;
  returns the manifest. `model` is a registered name / path (loaded here) or a
  models.LoadedModel. Rerunning the same command resumes both steps; changing any setting needs
  another out_dir."""
  import models
  lm = models.load(model, quiet=not progress) if isinstance(model, str) else model
  os.makedirs(out_dir, exist_ok=True)
  prompts, per_file = [], {}
  for path in prompt_files:
    recs = load_prompt_records(path)
    per_file[path] = len(recs)
    prompts += recs
  magpie_path = os.path.join(out_dir, "magpie.jsonl")
  if num_magpie > 0:
    magpie = synthesize_prompts(lm, lm.tokenizer, magpie_path, num_prompts=num_magpie,
                                batch_size=magpie_batch_size, max_new_tokens=magpie_max_new_tokens,
                                temperature=magpie_temperature, top_p=magpie_top_p, seed=seed,
                                progress=progress)
    per_file[magpie_path] = len(magpie)
    prompts += magpie
  ids = Counter(p["id"] for p in prompts)
  dup = [i for i, c in ids.items() if c > 1]
  if dup:
    raise ValueError(f"prompt ids used in more than one file: {dup[:5]}; ids must be unique")
  if shuffle:
    prompts = [prompts[j] for j in np.random.default_rng([seed, 11]).permutation(len(prompts))]
  manifest = regenerate(lm, lm.tokenizer, prompts, out_dir, shard_size=shard_size,
                        batch_size=batch_size, max_new_tokens=max_new_tokens,
                        temperature=temperature, seed=seed, multi_turn=multi_turn,
                        max_len=max_len, taps=taps, first_shard=first_shard,
                        progress=progress)
  manifest["prompt_files"] = per_file
  manifest["prompt_order"] = f"shuffled (seed {seed})" if shuffle else "as in the files"
  write_json(os.path.join(out_dir, MANIFEST), manifest)
  return manifest
