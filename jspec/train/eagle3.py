"""EAGLE-3 training: the target's taps teacher-forced over the data, training-time test (TTT) over
`ttt_steps` steps with step-decayed soft cross-entropy against the target's distribution on the
draft vocabulary, and a greedy acceptance-length estimate from the same pass.

TTT (EAGLE-3 paper; official `traineagle3/cnets.py`): step 0 runs the head over every position t
with the target's fused feature g_t and the embedding of token t+1, at position t, causally. Step
j > 0 feeds the head's own step j-1 output at t with the embedding of token t+1+j, at position
t+j; its query at t attends to step 0's keys at positions <= t plus the keys of steps 1..j at t
itself: exactly what drafting token t+2+j after anchor t sees.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jspec.drafters.eagle3 import Eagle3Config, Eagle3Head, attach_target_rows
from jspec.train.shared import (Features, digest, shift, take_at, target_features,
                                training_graphdef, ttt_attend)
from models.llama import Llama


def draft_vocab(counts: np.ndarray, size: int) -> np.ndarray:
  """The `size` most frequent token ids (ties to the smaller id), sorted ascending (int32)."""
  if not 1 <= size <= len(counts):
    raise ValueError(f"draft vocabulary size must be in [1, {len(counts)}], got {size}")
  order = np.lexsort((np.arange(len(counts)), -counts))     # by count desc, then id asc
  return np.sort(order[:size]).astype(np.int32)


def size_for_coverage(ranking: np.ndarray, check: np.ndarray, coverage: float,
                      multiple: int = 256) -> tuple[int, float]:
  """The smallest draft-vocabulary size (a multiple of `multiple`, at most the vocabulary) whose
  `draft_vocab(ranking, size)` holds `coverage` of the held-out token counts `check`; returns
  (size, the coverage it reaches)."""
  if not 0 < coverage <= 1:
    raise ValueError(f"vocabulary coverage must be in (0, 1], got {coverage}")
  if check.sum() == 0:
    raise ValueError("no held-out reply tokens to measure coverage on; regenerate more data")
  order = np.lexsort((np.arange(len(ranking)), -ranking))    # as draft_vocab ranks
  reached = np.cumsum(check[order]) / check.sum()
  size = int(np.searchsorted(reached, coverage - 1e-12)) + 1
  size = min(-(-size // multiple) * multiple, len(ranking))
  return size, float(reached[size - 1])


def init_head(target: Llama, ids: np.ndarray, *, taps=None, seed: int = 0, lm_head: str = "own",
              dtype=jnp.float32) -> Eagle3Head:
  """A fresh head for `target` over draft vocabulary `ids`; its LM head (its own, or with
  lm_head="target" the target's rows, frozen) and final norm start as the target's own
  (restricted to the draft vocabulary), which speeds up early training."""
  cfg = Eagle3Config.for_target(target.config, draft_vocab_size=len(ids), taps=taps,
                                lm_head=lm_head)
  head = Eagle3Head(cfg, dtype=dtype, rngs=nnx.Rngs(seed))
  ids = jnp.asarray(ids, jnp.int32)
  head.draft_to_target[...] = ids
  if lm_head == "own":
    head.lm_head.kernel[...] = target.head_rows(ids).T.astype(dtype)
  attach_target_rows(head, target)
  head.norm.scale[...] = target.norm.scale[...].astype(dtype)
  return head


def ttt_forward(head: Eagle3Head, embed: jax.Array, taps: tuple[jax.Array, ...],
                tokens: jax.Array, anchors: jax.Array, ttt_steps: int, dtype=None,
                segments: jax.Array | None = None,
                positions: jax.Array | None = None) -> list[jax.Array]:
  """The head's outputs [B, K, H] per TTT step at anchors [B, K]: step j's output at anchor t
  predicts token t+2+j (step 0 runs over every position, as the later steps attend to it).
  dtype: the operands of the attention products (default the activations'). segments and
  positions [B, N]: a packed row's sequences (`jspec.train.shards.PackedRows`), kept apart."""
  b, n = tokens.shape
  scale = head.config.head_dim ** -0.5
  idx = jnp.broadcast_to(jnp.arange(n)[None], (b, n))
  pos = idx if positions is None else positions
  a, kv0 = head.layer(head.fuse(taps), embed[take_at(tokens, idx + 1)], pos,
                      ttt_attend([], None, scale, dtype, segments))
  outs, prev, feature = [take_at(a, anchors)], [kv0], take_at(a, anchors)
  for j in range(1, ttt_steps):
    a, kv = head.layer(feature, embed[take_at(tokens, anchors + 1 + j)], take_at(pos, anchors) + j,
                       ttt_attend(prev, anchors, scale, dtype, segments))
    prev.append(kv)
    outs.append(a)
    feature = a
  return outs


def ttt_loss(head: Eagle3Head, embed: jax.Array, feats: Features, tokens: jax.Array,
             loss_mask: jax.Array, length: jax.Array, *, ttt_steps: int, decay: float,
             max_anchors: int | None = None, dtype=None, segments: jax.Array | None = None,
             positions: jax.Array | None = None):
  """Returns (loss, metrics). tokens / loss_mask [B, N], length [B]; embed: the target's [V, H].

  Step j's prediction at anchor t is token t+2+j, labelled with the target's distribution at
  position t+1+j (restricted to the draft vocabulary and renormalised); it counts where that
  token is a reply token inside the sequence and in the draft vocabulary. Only anchors with a
  label at some step are computed past step 0: the first `max_anchors` per row (default N/2).
  dtype: the attention products' operands (`ttt_forward`). segments / positions [B, N]: a packed
  row's sequences (labels never cross them); without them a row is one sequence of `length`
  tokens."""
  b, n = tokens.shape
  cfg = head.config
  in_vocab = jnp.zeros((cfg.vocab_size,), bool).at[head.draft_to_target[...]].set(True)
  pos = jnp.arange(n)[None, :]
  seg = (pos < length[:, None]).astype(jnp.int32) if segments is None else segments
  labelled = [(shift(seg, 2 + j) == seg) & (seg > 0) & (shift(loss_mask, 2 + j) > 0)
              & in_vocab[shift(tokens, 2 + j)] for j in range(ttt_steps)]     # [B, N] each
  k = max_anchors or max(1, n // 2)
  anchors = jax.vmap(lambda m: jnp.nonzero(m, size=k, fill_value=n - 1)[0])(
      jnp.any(jnp.stack(labelled), axis=0)).astype(jnp.int32)                  # [B, K]
  outs = ttt_forward(head, embed, feats.taps, tokens, anchors, ttt_steps, dtype, segments,
                     positions)
  losses, accs, counts, accepted = [], [], [], []
  run = jnp.ones(anchors.shape, bool)         # the greedy chain is still accepted at the anchor
  for j, a in enumerate(outs):
    logits = head.draft_logits(a)                                              # [B, K, Vd]
    label_logits = take_at(feats.target_logits, anchors + 1 + j)                   # position t+1+j
    w = take_at(labelled[j], anchors).astype(jnp.float32)
    ce = -jnp.sum(jax.nn.softmax(label_logits, -1) * jax.nn.log_softmax(logits, -1), -1)
    cnt = jnp.maximum(w.sum(), 1.0)
    losses.append(jnp.sum(ce * w) / cnt)
    hit = jnp.argmax(logits, -1) == jnp.argmax(label_logits, -1)
    accs.append(jnp.sum(hit * w) / cnt)
    counts.append(w.sum())
    run = run & hit
    accepted.append(run)
  weights = jnp.asarray([decay ** j for j in range(ttt_steps)], jnp.float32)
  loss = jnp.sum(weights * jnp.stack(losses))
  # Greedy AL with D = ttt_steps over anchors where every step has a label: 1 + accepted run.
  wf = take_at(jnp.all(jnp.stack(labelled), axis=0), anchors).astype(jnp.float32)
  per_pos = jnp.stack([jnp.sum(r * wf) for r in accepted]) / jnp.maximum(wf.sum(), 1.0)
  metrics = dict(loss=loss, step_loss=jnp.stack(losses), step_acc=jnp.stack(accs),
                 step_count=jnp.stack(counts), accept_at=per_pos, al=1.0 + per_pos.sum(),
                 al_count=wf.sum())
  return loss, metrics

def eagle3_task(target: Llama, draft_ids: np.ndarray, *, taps=None, ttt_steps: int = 3,
                decay: float = 0.8, seed: int = 0, lm_head: str = "own",
                head: Eagle3Head | None = None, compute_dtype=jnp.float32):
  """The EAGLE-3 `Task` for jspec.train.trainer: trainable = the head's Params; aux = the frozen
  target and the head's draft vocabulary. compute_dtype bfloat16: mixed precision (the float32
  params are the optimiser's master copy; the head's products run in bfloat16 with float32
  accumulation, norms, softmax and loss in float32)."""
  from jspec.train.trainer import Task

  if ttt_steps < 1:
    raise ValueError(f"ttt_steps must be >= 1, got {ttt_steps}")
  head = head if head is not None else init_head(target, draft_ids, taps=taps, seed=seed,
                                                 lm_head=lm_head)
  graphdef, params, rest = nnx.split(head, nnx.Param, ...)
  compute_dtype = jnp.dtype(compute_dtype)
  train_graph = training_graphdef(head, compute_dtype)
  tgraph, tweights = nnx.split(target)
  taps = tuple(head.config.taps)

  def loss(params, aux, batch):
    tweights, rest = aux
    tgt = nnx.merge(tgraph, tweights)
    h = nnx.merge(train_graph, params, rest)
    feats = target_features(tgt, batch["tokens"], taps, h.draft_to_target[...],
                            batch.get("feats"), dtype=compute_dtype)
    return ttt_loss(h, tgt.embed_table(), feats, batch["tokens"], batch["loss_mask"],
                    batch["length"], ttt_steps=ttt_steps, decay=decay, dtype=compute_dtype,
                    segments=batch.get("segments"), positions=batch.get("positions"))

  meta = dict(head=dataclasses.asdict(head.config), ttt_steps=ttt_steps, decay=decay,
              compute_dtype=compute_dtype.name,
              draft_vocab_sha=digest(np.asarray(head.draft_to_target[...])),
              target=dict(layers=target.config.num_layers, hidden=target.config.hidden_size,
                          vocab=target.config.vocab_size))
  task = Task(name="eagle3", params=params, aux=(tweights, rest), loss=loss, meta=meta,
              packs=True)
  task.module = lambda p: nnx.merge(graphdef, p, rest)
  return task


def draft_predictions(head: Eagle3Head, target: Llama, tokens: jax.Array,
                      num_draft: int) -> jax.Array:
  """tokens [B, N] -> [B, D, N] target ids: at anchor t, the greedy chain draft of token t+2+j
  (j < num_draft) that drafting after the committed tokens 0 .. t+1 makes (`jspec.train.replay`).
  The head may draft further than it was trained (num_draft > its TTT steps)."""
  b, n = tokens.shape
  feats = target_features(target, tokens, tuple(head.config.taps), head.draft_to_target[...])
  anchors = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[None], (b, n))
  outs = ttt_forward(head, target.embed_table(), feats.taps, tokens, anchors, num_draft)
  ids = head.draft_to_target[...]
  return jnp.stack([ids[jnp.argmax(head.draft_logits(a), -1)] for a in outs], axis=1)


def draft_predictor(head: Eagle3Head, target: Llama, num_draft: int):
  """`draft_predictions` jitted with the weights as arguments, not closed over: a closure would
  bake both models' weights into every compiled length as constants (the replay compiles one
  program per padded length; on the default model that held gigabytes per length)."""
  graphdef, state = nnx.split((head, target))
  fn = jax.jit(lambda s, t: draft_predictions(*nnx.merge(graphdef, s), t, num_draft))
  return functools.partial(fn, state)
