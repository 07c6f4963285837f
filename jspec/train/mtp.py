"""MTP training (FastMTP-style, arXiv 2509.18362): one MTP module used recursively for K steps over
the target's teacher-forced final hidden states, soft cross-entropy against the target's
distribution on a draft vocabulary, step weights beta^(k-1) normalised, and a greedy
acceptance-length estimate.

Step k at anchor i consumes the step-(k-1) output (step 1: the target's final normed hidden h_i)
with the ground-truth token t_{i+k} at position i+k-1 and predicts t_{i+k+1}. Its attention is
EAGLE-3's training-time test (`jspec.train.shared.ttt_attend`): step 1's keys at positions <= i
plus the keys of steps 2..k at anchor i, exactly what drafting sees through the module's cache.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jspec.drafters.mtp import MTPConfig, MTPModule
from jspec.train.shared import (digest, mixed_matmul, shift, take_at, training_graphdef,
                                ttt_attend)
from models.kv_cache import KVCache
from models.llama import Llama


def init_module(target: Llama, ids: np.ndarray, *, seed: int = 0,
                dtype=jnp.float32) -> MTPModule:
  """A fresh module for `target` over draft vocabulary `ids` (sorted target ids)."""
  module = MTPModule(MTPConfig.for_target(target.config, draft_vocab_size=len(ids)), dtype=dtype,
                     rngs=nnx.Rngs(seed))
  module.draft_to_target[...] = jnp.asarray(ids, jnp.int32)
  return module


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Features:
  final: jax.Array              # [B, N, H] the target's final normed hidden state (h^0)
  target_logits: jax.Array      # [B, N, Vd] its logits on the draft vocabulary


def target_features(target: Llama, tokens: jax.Array, draft_ids: jax.Array,
                    cached: jax.Array | None = None, dtype=jnp.float32) -> Features:
  """Teacher-forced target pass over tokens [B, N] (no gradient), or the same read from a feature
  cache (`jspec.train.features`): cached [B, N, K+1, H], whose last slot is the final normed
  hidden state whatever taps it also holds. dtype: the operands of the logits product."""
  cfg = target.config
  if cached is None:
    b, n = tokens.shape
    out = target(tokens, KVCache.init(cfg, b, n, dtype=target.activation_dtype),
                 logit_indices=jnp.zeros((b, 1), jnp.int32), taps=(cfg.num_layers,))
    final = target.norm(out.hidden[0]).astype(jnp.float32)
  else:
    final = cached[:, :, -1].astype(jnp.float32)
  rows = target.head_rows(draft_ids)                                          # [Vd, H]
  logits = jnp.einsum("bnh,vh->bnv", final.astype(dtype), rows.astype(dtype),
                      preferred_element_type=jnp.float32)
  return jax.lax.stop_gradient(Features(final, logits))


def mtp_forward(module: MTPModule, embed: jax.Array, norm_scale: jax.Array, final: jax.Array,
                tokens: jax.Array, anchors: jax.Array, steps: int,
                dtype=None, segments: jax.Array | None = None,
                positions: jax.Array | None = None) -> list[jax.Array]:
  """The module's normed outputs [B, K, H] per step at anchors [B, K]: step k's output at anchor
  i predicts token i+k+1 (step 1 runs over every position, as the later steps attend to it).
  dtype: the operands of the attention products (default the activations'). segments and
  positions [B, N]: a packed row's sequences (`jspec.train.shards.PackedRows`), kept apart."""
  b, n = tokens.shape
  scale = module.config.head_dim ** -0.5
  idx = jnp.broadcast_to(jnp.arange(n)[None], (b, n))
  pos = idx if positions is None else positions
  a, kv1 = module(final, embed[take_at(tokens, idx + 1)], pos,
                  ttt_attend([], None, scale, dtype, segments))
  prev = module.shared_norm(take_at(a, anchors), norm_scale)
  outs, kvs = [prev], [kv1]
  for k in range(2, steps + 1):
    a, kv = module(prev, embed[take_at(tokens, anchors + k)], take_at(pos, anchors) + k - 1,
                   ttt_attend(kvs, anchors, scale, dtype, segments))
    kvs.append(kv)
    prev = module.shared_norm(a, norm_scale)
    outs.append(prev)
  return outs


def step_weights(steps: int, beta: float) -> np.ndarray:
  """FastMTP's beta^(k-1) for k = 1..steps, normalised to sum 1 (beta 0.6: 0.51 / 0.31 / 0.18)."""
  w = beta ** np.arange(steps, dtype=np.float64)
  return (w / w.sum()).astype(np.float32)


def mtp_loss(module: MTPModule, embed: jax.Array, norm_scale: jax.Array, rows: jax.Array,
             feats: Features, tokens: jax.Array, loss_mask: jax.Array, length: jax.Array, *,
             steps: int, beta: float, max_anchors: int | None = None, dtype=jnp.float32,
             segments: jax.Array | None = None, positions: jax.Array | None = None):
  """Returns (loss, metrics). tokens / loss_mask [B, N], length [B]; embed, norm_scale and rows
  (the LM head's draft-vocabulary rows [Vd, H]): the target's. dtype: the operands of the
  LM-head and attention products (bfloat16: mixed precision, float32 results). segments /
  positions [B, N]: a packed row's sequences (labels never cross them); without them a row is
  one sequence of `length` tokens.

  Step k's prediction at anchor i is token i+k+1, labelled with the target's distribution at
  position i+k (restricted to the draft vocabulary and renormalised); it counts where that token
  is a reply token inside the sequence and in the draft vocabulary (EAGLE-3's mask). Only anchors
  with a label at some step are computed past step 1: the first `max_anchors` per row (N/2)."""
  n = tokens.shape[1]
  cfg = module.config
  in_vocab = jnp.zeros((cfg.vocab_size,), bool).at[module.draft_to_target[...]].set(True)
  pos = jnp.arange(n)[None, :]
  seg = (pos < length[:, None]).astype(jnp.int32) if segments is None else segments
  labelled = [(shift(seg, 1 + k) == seg) & (seg > 0) & (shift(loss_mask, 1 + k) > 0)
              & in_vocab[shift(tokens, 1 + k)] for k in range(1, steps + 1)]   # [B, N] each
  m = max_anchors or max(1, n // 2)
  anchors = jax.vmap(lambda x: jnp.nonzero(x, size=m, fill_value=n - 1)[0])(
      jnp.any(jnp.stack(labelled), axis=0)).astype(jnp.int32)                  # [B, M]
  mixed = jnp.dtype(dtype) != jnp.float32
  outs = mtp_forward(module, embed, norm_scale, feats.final, tokens, anchors, steps,
                     dtype if mixed else None, segments, positions)
  losses, accs, counts, accepted = [], [], [], []
  run = jnp.ones(anchors.shape, bool)         # the greedy chain is still accepted at the anchor
  for k, normed in enumerate(outs, start=1):
    logits = (mixed_matmul(normed, rows.T, dtype) if mixed else
              module.draft_logits(normed, rows))                               # [B, M, Vd]
    label_logits = take_at(feats.target_logits, anchors + k)                       # position i+k
    w = take_at(labelled[k - 1], anchors).astype(jnp.float32)
    ce = -jnp.sum(jax.nn.softmax(label_logits, -1) * jax.nn.log_softmax(logits, -1), -1)
    cnt = jnp.maximum(w.sum(), 1.0)
    losses.append(jnp.sum(ce * w) / cnt)
    hit = jnp.argmax(logits, -1) == jnp.argmax(label_logits, -1)
    accs.append(jnp.sum(hit * w) / cnt)
    counts.append(w.sum())
    run = run & hit
    accepted.append(run)
  loss = jnp.sum(jnp.asarray(step_weights(steps, beta)) * jnp.stack(losses))
  # Greedy AL with D = steps over anchors where every step has a label: 1 + accepted run.
  wf = take_at(jnp.all(jnp.stack(labelled), axis=0), anchors).astype(jnp.float32)
  per_pos = jnp.stack([jnp.sum(r * wf) for r in accepted]) / jnp.maximum(wf.sum(), 1.0)
  metrics = dict(loss=loss, step_loss=jnp.stack(losses), step_acc=jnp.stack(accs),
                 step_count=jnp.stack(counts), accept_at=per_pos, al=1.0 + per_pos.sum(),
                 al_count=wf.sum())
  return loss, metrics


def mtp_task(target: Llama, draft_ids: np.ndarray, *, steps: int = 3, beta: float = 0.6,
             seed: int = 0, module: MTPModule | None = None, compute_dtype=jnp.float32):
  """The MTP `Task` for jspec.train.trainer: trainable = the module's Params; aux = the frozen
  target and the module's draft vocabulary. compute_dtype bfloat16: mixed precision (float32
  params, products in bfloat16 with float32 results; `jspec.train.shared.MixedDot`)."""
  from jspec.train.trainer import Task

  if steps < 1:
    raise ValueError(f"MTP training steps must be >= 1, got {steps}")
  if not 0 < beta <= 1:
    raise ValueError(f"beta (the step weight decay) must be in (0, 1], got {beta}")
  module = module if module is not None else init_module(target, draft_ids, seed=seed)
  module.config.check_target(target.config)
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  compute_dtype = jnp.dtype(compute_dtype)
  train_graph = training_graphdef(module, compute_dtype)
  tgraph, tweights = nnx.split(target)

  def loss(params, aux, batch):
    tweights, rest = aux
    tgt = nnx.merge(tgraph, tweights)
    mod = nnx.merge(train_graph, params, rest)
    ids = mod.draft_to_target[...]
    feats = target_features(tgt, batch["tokens"], ids, batch.get("feats"), dtype=compute_dtype)
    return mtp_loss(mod, tgt.embed_table(), tgt.norm.scale[...], tgt.head_rows(ids),
                    feats, batch["tokens"], batch["loss_mask"], batch["length"], steps=steps,
                    beta=beta, dtype=compute_dtype, segments=batch.get("segments"),
                    positions=batch.get("positions"))

  meta = dict(mtp=dataclasses.asdict(module.config), steps=steps, beta=beta,
              compute_dtype=compute_dtype.name,
              draft_vocab_sha=digest(np.asarray(module.draft_to_target[...])),
              target=dict(layers=target.config.num_layers, hidden=target.config.hidden_size,
                          vocab=target.config.vocab_size))
  task = Task(name="mtp", params=params, aux=(tweights, rest), loss=loss, meta=meta, packs=True)
  task.module = lambda p: nnx.merge(graphdef, p, rest)
  return task
