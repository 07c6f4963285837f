"""The training loop learned drafters share: grain data (iterator state checkpointed, so a resume
restores the data order), optax AdamW with warm-up, cosine decay and clipping, orbax
`CheckpointManager` (periodic saves, keep-last-N, resume), a progress bar, held-out evaluation.

A drafter plugs in a `Task`: its trainable module, the jitted loss, and the export of the result.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  steps: int = 2000
  batch_size: int = 8
  seq_len: int = 512
  lr: float = 3e-4
  warmup: int = 100
  final_lr_fraction: float = 0.1
  weight_decay: float = 0.0
  clip: float = 0.5
  b1: float = 0.9
  b2: float = 0.95
  save_every: int = 100
  keep: int = 3
  eval_every: int = 200
  holdout: int = 32            # sequences held out of training for evaluation
  seed: int = 0
  reply_windows: bool = False  # True: windows that label every reply token (ReplyWindows);
                               # False: each sequence's first seq_len tokens
  pack: bool = False           # True: several sequences (windows with reply_windows) per row
                               # (PackedRows), for losses that keep them apart (Task.packs)

  def __post_init__(self):
    for name in ("steps", "batch_size", "seq_len", "save_every", "keep", "eval_every"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"training {name} must be an integer >= 1, got {v!r}")
    if self.warmup < 0 or self.warmup > self.steps:
      raise ValueError(f"warmup must be in [0, steps={self.steps}], got {self.warmup}")
    if not self.lr > 0:
      raise ValueError(f"lr must be > 0, got {self.lr}")
    if self.holdout < 0:
      raise ValueError(f"holdout must be >= 0, got {self.holdout}")


def optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, cfg.lr, max(cfg.warmup, 1), max(cfg.steps, cfg.warmup + 1),
      end_value=cfg.lr * cfg.final_lr_fraction)
  return optax.chain(optax.clip_by_global_norm(cfg.clip),
                     optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay))


@dataclasses.dataclass
class Task:
  """What a drafter brings to the loop. `loss(params, aux, batch) -> (loss, metrics)` is traced
  inside the jitted step: params is the trainable state, aux every other array it reads (the
  frozen target's weights, buffers), passed as an argument so nothing large becomes a constant.
  Metrics must hold step_count, step_acc, accept_at, al_count (see `evaluate`)."""
  name: str
  params: Any                                   # trainable state (nnx.State); updated by train
  aux: Any
  loss: Callable[[Any, Any, dict], tuple[jax.Array, dict]]
  meta: dict                                    # JSON: everything that must match on resume
  packs: bool = False                           # its loss reads packed rows' segments/positions


def _manager(ckpt_dir: str, cfg: TrainConfig):
  import orbax.checkpoint as ocp
  return ocp.CheckpointManager(
      os.path.abspath(ckpt_dir),
      options=ocp.CheckpointManagerOptions(max_to_keep=cfg.keep, save_interval_steps=1,
                                           create=True, enable_async_checkpointing=False))


def train(task: Task, data_dir: str, out_dir: str, cfg: TrainConfig, *, progress: bool = True,
          stop_after: int | None = None, features: str | None = None,
          log: Callable[[str], None] | None = None) -> list[dict]:
  """Trains `task` on data_dir's shards for cfg.steps, checkpointing into out_dir/checkpoints and
  resuming from the latest checkpoint there. Returns the per-step metrics of this run (host
  floats). stop_after: end after that many steps of this run (tests, time budgets). features: a
  feature-cache folder (jspec.train.features); batches then carry `feats`."""
  import grain
  import orbax.checkpoint as ocp
  from tqdm import tqdm

  from jspec.io import check_writable
  from jspec.train.loader import heldout_batches, make_iterator
  log = log or (lambda s: print(s, file=sys.stderr))
  if cfg.pack and not task.packs:
    raise ValueError(f"{task.name} training cannot read packed rows (its loss does not keep "
                     "packed sequences apart); train it without packing")
  if cfg.pack and features is None:
    raise ValueError("packed rows need a feature cache (--features or --cache-features): the "
                     "target's own pass over a packed row would let its sequences see each other")
  os.makedirs(out_dir, exist_ok=True)
  check_writable(os.path.join(out_dir, "train_log.jsonl"))
  it = make_iterator(data_dir, seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.seed,
                     holdout=cfg.holdout, features=features, windows=cfg.reply_windows,
                     pack=cfg.pack,
                     num_threads=1, prefetch=4)
  eval_batches = heldout_batches(data_dir, seq_len=cfg.seq_len, batch_size=cfg.batch_size,
                                 holdout=cfg.holdout, features=features,
                                 windows=cfg.reply_windows)
  opt = optimizer(cfg)
  params, opt_state = task.params, opt.init(task.params)
  meta = dict(task=task.name, config=dataclasses.asdict(cfg), cached_features=features is not None,
              **task.meta)
  mngr = _manager(os.path.join(out_dir, "checkpoints"), cfg)
  start = 0
  if mngr.latest_step() is not None:
    start = mngr.latest_step()
    saved = mngr.restore(start, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    same = json.loads(json.dumps(meta))          # as saved: tuples become lists
    for k, v in dataclasses.asdict(TrainConfig()).items():   # a setting added since, at its
      saved.get("config", {}).setdefault(k, v)               # default, matches what ran before
    if saved != same:
      diff = sorted(k for k in set(saved) | set(same) if saved.get(k) != same.get(k))
      raise ValueError(f"{out_dir} holds checkpoints of another run (differs in {diff}); use "
                       "another output folder or the same settings to resume")
    restored = mngr.restore(start, args=ocp.args.Composite(
        state=ocp.args.StandardRestore({"params": params, "opt": opt_state}),
        data=grain.checkpoint.CheckpointRestore(it)))
    params, opt_state = restored["state"]["params"], restored["state"]["opt"]
    log(f"resumed {task.name} training from step {start} in {out_dir}")

  @jax.jit
  def step_fn(params, opt_state, aux, batch):
    (loss, m), grads = jax.value_and_grad(task.loss, has_aux=True)(params, aux, batch)
    updates, opt_state = opt.update(grads, opt_state, params)
    m = dict(m, grad_norm=optax.tree.norm(grads))
    return optax.apply_updates(params, updates), opt_state, m

  eval_fn = jax.jit(lambda params, aux, batch: task.loss(params, aux, batch)[1])

  def save(step):
    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave({"params": params, "opt": opt_state}),
        data=grain.checkpoint.CheckpointSave(it), meta=ocp.args.JsonSave(meta)))
    mngr.wait_until_finished()

  end = cfg.steps if stop_after is None else min(cfg.steps, start + stop_after)
  history = []
  bar = tqdm(total=cfg.steps, initial=start, desc=f"train {task.name}", unit="step",
             file=sys.stderr, disable=not progress)
  t0, tokens = time.perf_counter(), 0
  log_path = os.path.join(out_dir, "train_log.jsonl")
  try:
    for step in range(start, end):
      batch = next(it)
      params, opt_state, m = step_fn(params, opt_state, task.aux,
                                     {k: jnp.asarray(v) for k, v in batch.items()})
      m = jax.tree_util.tree_map(lambda x: np.asarray(x).tolist(), m)
      tokens += int(np.sum(batch["length"]))
      rate = tokens / (time.perf_counter() - t0)
      row = dict(step=step + 1, **m, tokens_per_s=rate)
      if (step + 1) % cfg.eval_every == 0 or step + 1 == end:
        row["eval"] = evaluate(eval_fn, params, task.aux, eval_batches)
      history.append(row)
      with open(log_path, "a") as f:
        f.write(json.dumps(row) + "\n")
      bar.update(1)
      post = dict(loss=f"{m['loss']:.3f}", acc="/".join(f"{a:.2f}" for a in m["step_acc"]),
                  tok_s=f"{rate:.0f}")
      if "eval" in row:
        post["heldout_AL"] = f"{row['eval']['al']:.2f}"
      bar.set_postfix(post)
      if (step + 1) % cfg.save_every == 0 or step + 1 == end:
        save(step + 1)
  except KeyboardInterrupt:
    bar.close()
    last = mngr.latest_step()
    raise KeyboardInterrupt(f"training interrupted; the last checkpoint is step {last} in "
                            f"{out_dir}/checkpoints; run the same command again to resume") from None
  bar.close()
  task.params = params
  return history


def evaluate(eval_fn, params, aux, batches) -> dict:
  """Held-out metrics, weighted by their counts: loss, per-step accuracy, greedy AL estimate."""
  if not batches:
    return {}
  ms = [jax.tree_util.tree_map(np.asarray, eval_fn(params, aux, {k: jnp.asarray(v)
                                                                  for k, v in b.items()}))
        for b in batches]
  cnt = np.stack([m["step_count"] for m in ms])                 # [batches, J]
  acc = (np.stack([m["step_acc"] for m in ms]) * cnt).sum(0) / np.maximum(cnt.sum(0), 1)
  alc = np.asarray([m["al_count"] for m in ms])
  accept = (np.stack([m["accept_at"] for m in ms]) * alc[:, None]).sum(0) / max(alc.sum(), 1)
  return dict(loss=float(np.mean([m["loss"] for m in ms])), step_acc=acc.tolist(),
              accept_at=accept.tolist(), al=float(1 + accept.sum()))
