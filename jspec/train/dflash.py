"""DFlash and DSpark training over the target's teacher-forced taps (or the feature cache).

Per row, up to `max_anchors` anchors are drawn at random among the positions whose next token is a
reply token (a fresh draw per batch, keyed by the batch's tokens). Each anchor a opens a block
[token a, MASK x (bs-1)] at positions a .. a+bs-1 whose queries see the context features of
positions < a and their own block (bidirectionally): exactly what drafting sees, where the context
holds the committed positions before the anchor. All blocks of a batch run in one packed forward.

Labels: DFlash slot k >= 1 predicts the token at a+k (cross-entropy against the data, i.e. the
target's regenerated reply), DSpark slot k >= 0 the token at a+k+1 with the Markov bias of the
ground-truth token before it; DSpark adds the L1 distance to the target's distribution and the
confidence head's BCE against 1 - TV (paper Eqs. 9-12, weights 0.1 / 0.9 / 1.0). Slots are weighted
exp(-(j-1)/gamma) by their draft index j = 1 .. D. A slot counts where its label is a reply token
inside the sequence and in the draft vocabulary.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jspec.drafters.dflash import DFlashConfig, DFlashModule
from jspec.drafters.dspark import DSparkModule
from jspec.train.shared import (digest, mixed_matmul, take_at, target_features,
                                training_graphdef)
from models.llama import Llama


def init_module(target: Llama, ids: np.ndarray, kind: str, *, num_layers: int = 1,
                block_size: int = 8, mask_token_id: int = 0, taps=None, markov_rank: int = 256,
                markov_gated: bool = False, sliding_window: int = 0, seed: int = 0,
                dtype=jnp.float32):
  """A fresh DFlash ("dflash") or DSpark ("dspark") module over draft vocabulary `ids`. Its draft
  layers start as copies of the target's last `num_layers` layers and its final norm as the
  target's (the block's hidden states then start in the space the target's LM head reads)."""
  dspark = kind == "dspark"
  cfg = DFlashConfig.for_target(target.config, draft_vocab_size=len(ids), taps=taps,
                                mask_token_id=mask_token_id, num_layers=num_layers,
                                block_size=block_size, sample_from_anchor=dspark,
                                markov_rank=markov_rank if dspark else 0,
                                markov_gated=markov_gated and dspark, confidence=dspark,
                                sliding_window=sliding_window)
  module = (DSparkModule if dspark else DFlashModule)(cfg, dtype=dtype, rngs=nnx.Rngs(seed))
  backbone = module.backbone if dspark else module
  backbone.draft_to_target[...] = jnp.asarray(ids, jnp.int32)
  n = target.config.num_layers
  if num_layers <= n:
    for i, blk in enumerate(backbone.layers):
      src = nnx.state(target.layers[n - num_layers + i], nnx.Param)
      nnx.update(blk, jax.tree_util.tree_map(lambda x: x.astype(dtype), src))
  backbone.norm.scale[...] = target.norm.scale[...].astype(dtype)
  return module


def sample_anchors(key: jax.Array, valid: jax.Array, m: int) -> tuple[jax.Array, jax.Array]:
  """Up to m distinct random positions per row among valid [B, N] (bool), sorted: (anchors [B, M],
  used [B, M] bool: False for fill-ins where a row has fewer than m valid positions)."""
  score = jnp.where(valid, jax.random.uniform(key, valid.shape), -1.0)
  top, idx = jax.lax.top_k(score, m)
  order = jnp.argsort(jnp.where(top >= 0, idx, valid.shape[1] + idx), axis=-1)
  idx, top = jnp.take_along_axis(idx, order, -1), jnp.take_along_axis(top, order, -1)
  return idx.astype(jnp.int32), top >= 0


def packed_attend(q, k_ctx, v_ctx, k_blk, v_blk, anchors: jax.Array, bs: int,
                  window: int = 0) -> jax.Array:
  """Queries of M blocks [B, M*bs, Hq, Dh]; context keys/values [B, N, KVH, Dh] at positions
  0..N-1, visible to block j where position < anchors[:, j] (and, window > 0, > the query's
  position - window); block keys [B, M*bs, KVH, Dh], each visible only inside its own block.
  Returns [B, M*bs, Hq, Dh]."""
  b, t, hq, dh = q.shape
  n, kvh = k_ctx.shape[1], k_ctx.shape[2]
  m = t // bs
  g = hq // kvh
  scale = dh ** -0.5
  qg = q.reshape(b, t, kvh, g, dh).astype(jnp.float32)
  s_ctx = jnp.einsum("btkgd,bskd->bkgts", qg, k_ctx.astype(jnp.float32)) * scale   # [B,K,G,T,N]
  start = jnp.repeat(anchors, bs, axis=1)[:, :, None]                          # [B, T, 1]
  seen = jnp.arange(n)[None, None, :] < start                                  # [B, T, N]
  if window:
    qpos = start + jnp.tile(jnp.arange(bs), m)[None, :, None]
    seen = seen & (jnp.arange(n)[None, None, :] > qpos - window)
  s_ctx = jnp.where(seen[:, None, None], s_ctx, -jnp.inf)
  qb = qg.reshape(b, m, bs, kvh, g, dh)
  kb = k_blk.reshape(b, m, bs, kvh, dh).astype(jnp.float32)
  s_blk = jnp.einsum("bmtkgd,bmskd->bkgmts", qb, kb).reshape(b, kvh, g, t, bs) * scale
  probs = jax.nn.softmax(jnp.concatenate([s_ctx, s_blk], axis=-1), axis=-1)
  out = jnp.einsum("bkgts,bskd->btkgd", probs[..., :n], v_ctx.astype(jnp.float32))
  pb = probs[..., n:].reshape(b, kvh, g, m, bs, bs)
  vb = v_blk.reshape(b, m, bs, kvh, dh).astype(jnp.float32)
  out = out + jnp.einsum("bkgmts,bmskd->bmtkgd", pb, vb).reshape(b, t, kvh, g, dh)
  return out.reshape(b, t, hq, dh).astype(q.dtype)


def block_forward(backbone: DFlashModule, embed: jax.Array, taps: tuple[jax.Array, ...],
                  tokens: jax.Array, anchors: jax.Array) -> jax.Array:
  """The normed hidden states [B, M, bs, H] of the blocks opened at anchors [B, M]."""
  cfg = backbone.config
  bs = cfg.block_size
  b, n = tokens.shape
  m = anchors.shape[1]
  ctx = backbone.context(taps)                                                 # [B, N, H]
  ks, vs = backbone.context_kv(ctx, jnp.broadcast_to(jnp.arange(n)[None], (b, n)))
  block = jnp.full((b, m, bs), cfg.mask_token_id, jnp.int32).at[:, :, 0].set(take_at(tokens, anchors))
  positions = (anchors[:, :, None] + jnp.arange(bs)[None, None]).reshape(b, m * bs)
  x = embed[block.reshape(b, m * bs)]

  def attend(i, q, k, v):
    return packed_attend(q, ks[i], vs[i], k, v, anchors, bs, cfg.sliding_window)

  return backbone(x, positions, attend).reshape(b, m, bs, -1)


def slot_weights(num: int, gamma: float) -> np.ndarray:
  """exp(-(j-1)/gamma) for draft slots j = 1 .. num."""
  return np.exp(-np.arange(num, dtype=np.float64) / gamma).astype(np.float32)


def block_loss(module, embed: jax.Array, rows: jax.Array, taps, target_logits: jax.Array,
               tokens: jax.Array, loss_mask: jax.Array, length: jax.Array, key: jax.Array, *,
               gamma: float, max_anchors: int, weights=(0.1, 0.9, 1.0), outputs: bool = False,
               dtype=jnp.float32):
  """Returns (loss, metrics) for a DFlashModule or DSparkModule. rows: the target's LM-head rows of
  the draft vocabulary [Vd, H]; target_logits [B, N, Vd] the target's logits there (position i
  predicts token i+1); tokens / loss_mask [B, N], length [B]. weights: DSpark's (CE, L1, BCE).
  outputs: also return {"hit", "w", "confidence" (DSpark's logits)}, each [B, M, D], for the
  confidence calibration. dtype: the operands of the LM-head product (bfloat16: mixed precision,
  float32 results)."""
  dspark = isinstance(module, DSparkModule)
  backbone = module.backbone if dspark else module
  cfg = backbone.config
  b, n = tokens.shape
  d = cfg.max_draft
  first = 0 if dspark else 1                # the first predicting slot
  shift = 1 if dspark else 0                # slot k predicts the token at a + k + shift
  ids = backbone.draft_to_target[...]
  in_vocab = jnp.zeros((cfg.vocab_size,), bool).at[ids].set(True)
  to_draft = jnp.zeros((cfg.vocab_size,), jnp.int32).at[ids].set(
      jnp.arange(cfg.draft_vocab_size, dtype=jnp.int32))
  pos = jnp.arange(n)[None, :]
  valid = (pos + 1 < length[:, None]) & (jnp.roll(loss_mask, -1, axis=1) > 0) & (pos + 1 < n)
  anchors, used = sample_anchors(key, valid, max_anchors)                       # [B, M]
  h = block_forward(backbone, embed, taps, tokens, anchors)[:, :, first:]     # [B, M, D, H]
  lab_pos = anchors[:, :, None] + first + shift + jnp.arange(d)[None, None]    # [B, M, D]
  flat = lambda x: x.reshape(b, -1)
  labels = take_at(tokens, flat(lab_pos)).reshape(lab_pos.shape)
  w = (used[:, :, None] & (lab_pos < length[:, None, None]) & (lab_pos < n)
       & (take_at(loss_mask, flat(lab_pos)).reshape(lab_pos.shape) > 0) & in_vocab[labels])
  w = w.astype(jnp.float32)
  logits = (backbone.draft_logits(h, rows) if jnp.dtype(dtype) == jnp.float32 else
            mixed_matmul(h, rows.T, dtype))                                    # [B, M, D, Vd]
  p_t = jax.nn.softmax(take_at(target_logits, flat(lab_pos - 1)).reshape(logits.shape), -1)
  if dspark:
    prev = module.draft_index(take_at(tokens, flat(lab_pos - 1)).reshape(lab_pos.shape))
    bias, e = module.markov_bias(h, prev)
    logits = logits + bias
    conf_logit = module.confidence_logit(h, e)                                 # [B, M, D]
  logp = jax.nn.log_softmax(logits, -1)
  ce = -jnp.take_along_axis(logp, to_draft[labels][..., None], -1)[..., 0]     # [B, M, D]
  counts = w.sum((0, 1))
  per_slot = lambda x: jnp.sum(x * w, (0, 1)) / jnp.maximum(counts, 1.0)       # [D]
  sw = jnp.asarray(slot_weights(d, gamma))
  step_loss = per_slot(ce)
  loss = jnp.sum(sw * step_loss) / jnp.sum(sw)
  extra = {}
  if dspark:
    l1 = jnp.sum(jnp.abs(jnp.exp(logp) - p_t), -1)                             # [B, M, D]
    soft = jax.lax.stop_gradient(1.0 - 0.5 * l1)
    bce = (jnp.maximum(conf_logit, 0) - conf_logit * soft
           + jnp.log1p(jnp.exp(-jnp.abs(conf_logit))))
    a_ce, a_l1, a_conf = weights
    loss = (a_ce * loss + a_l1 * jnp.sum(sw * per_slot(l1)) / jnp.sum(sw)
            + a_conf * jnp.sum(sw * per_slot(bce)) / jnp.sum(sw))
    extra = dict(l1=per_slot(l1), confidence=per_slot(jax.nn.sigmoid(conf_logit)),
                 survival=per_slot(soft))
  hit = jnp.argmax(logits, -1) == jnp.argmax(p_t, -1)                          # [B, M, D]
  acc = per_slot(hit.astype(jnp.float32))
  # Greedy AL with D drafts where every slot has a label: 1 + the accepted run.
  wf = jnp.all(w > 0, axis=-1).astype(jnp.float32)                             # [B, M]
  run = jnp.cumprod(hit.astype(jnp.float32), axis=-1)
  accept_at = jnp.sum(run * wf[..., None], (0, 1)) / jnp.maximum(wf.sum(), 1.0)
  metrics = dict(loss=loss, step_loss=step_loss, step_acc=acc, step_count=counts,
                 accept_at=accept_at, al=1.0 + accept_at.sum(), al_count=wf.sum(), **extra)
  if outputs:
    return loss, metrics, dict(hit=hit, w=w, confidence=conf_logit if dspark else None)
  return loss, metrics


def batch_key(tokens: jax.Array, seed: int) -> jax.Array:
  """A PRNG key that differs between batches (a hash of their tokens) for the anchor draw."""
  idx = jnp.arange(tokens.size, dtype=jnp.uint32).reshape(tokens.shape)
  mix = jnp.sum(tokens.astype(jnp.uint32) * (idx * jnp.uint32(2654435761) + jnp.uint32(1)))
  return jax.random.fold_in(jax.random.key(seed), mix)


def block_task(target: Llama, draft_ids: np.ndarray, kind: str, *, num_layers: int = 1,
               block_size: int = 8, mask_token_id: int = 0, taps=None, markov_rank: int = 256,
               markov_gated: bool = False, sliding_window: int = 0, gamma: float = 4.0,
               max_anchors: int = 64, seed: int = 0, module=None, compute_dtype=jnp.float32):
  """The DFlash / DSpark `Task` for jspec.train.trainer: trainable = the module's Params; aux = the
  frozen target and the module's draft vocabulary. compute_dtype bfloat16: mixed precision
  (float32 params, products in bfloat16 with float32 results; `jspec.train.shared.MixedDot`)."""
  from jspec.train.trainer import Task

  if kind not in ("dflash", "dspark"):
    raise ValueError(f"kind must be 'dflash' or 'dspark', got {kind!r}")
  if gamma <= 0:
    raise ValueError(f"gamma (the slot loss decay) must be > 0, got {gamma}")
  if max_anchors < 1:
    raise ValueError(f"max_anchors must be >= 1, got {max_anchors}")
  module = module if module is not None else init_module(
      target, draft_ids, kind, num_layers=num_layers, block_size=block_size,
      mask_token_id=mask_token_id, taps=taps, markov_rank=markov_rank,
      markov_gated=markov_gated, sliding_window=sliding_window, seed=seed)
  cfg = module.config
  cfg.check_target(target.config, kind)
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  compute_dtype = jnp.dtype(compute_dtype)
  train_graph = training_graphdef(module, compute_dtype)
  tgraph, tweights = nnx.split(target)
  taps = tuple(cfg.taps)

  def loss(params, aux, batch):
    tweights, rest = aux
    tgt = nnx.merge(tgraph, tweights)
    mod = nnx.merge(train_graph, params, rest)
    ids = (mod.backbone if kind == "dspark" else mod).draft_to_target[...]
    tokens = batch["tokens"]
    feats = target_features(tgt, tokens, taps, ids, batch.get("feats"), dtype=compute_dtype)
    return block_loss(mod, tgt.embed_table(), tgt.head_rows(ids), feats.taps,
                      feats.target_logits, tokens, batch["loss_mask"], batch["length"],
                      batch_key(tokens, seed), gamma=gamma, max_anchors=max_anchors,
                      dtype=compute_dtype)

  meta = dict(head=dataclasses.asdict(cfg), gamma=gamma, max_anchors=max_anchors,
              compute_dtype=compute_dtype.name,
              draft_vocab_sha=digest(np.asarray(draft_ids)),
              target=dict(layers=target.config.num_layers, hidden=target.config.hidden_size,
                          vocab=target.config.vocab_size))
  task = Task(name=kind, params=params, aux=(tweights, rest), loss=loss, meta=meta)
  task.module = lambda p: nnx.merge(graphdef, p, rest)
  return task

