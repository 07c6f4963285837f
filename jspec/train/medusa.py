"""Medusa training: the target's final normed hidden state teacher-forced over the data (or read
from the feature cache's last slot), head k trained with cross-entropy on token t+k+2, weighted
0.8^k (Medusa-1: frozen target), plus per-head accuracy and a greedy chain acceptance estimate.

Labels follow the EAGLE-3 task: a position counts for head k where token t+k+2 is a reply token
inside the sequence and in the draft vocabulary (other tokens can never be proposed).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jspec.drafters.medusa import MedusaConfig, MedusaHead, attach_target_rows
from jspec.train.shared import digest, shift, take_at
from models.kv_cache import KVCache
from models.llama import Llama


def init_head(target: Llama, ids: np.ndarray, *, num_heads: int = 4, num_layers: int = 1,
              seed: int = 0, dtype=jnp.float32, lm_head: str = "own") -> MedusaHead:
  """Fresh heads for `target` over draft vocabulary `ids`: ResBlocks at identity and every LM head
  the target's own rows of the draft vocabulary (trainable copies, or with lm_head="target" the
  rows themselves, frozen), so each head starts as the target's next-token prediction."""
  cfg = MedusaConfig.for_target(target.config, draft_vocab_size=len(ids), num_heads=num_heads,
                                num_layers=num_layers, lm_head=lm_head)
  head = MedusaHead(cfg, dtype=dtype, rngs=nnx.Rngs(seed))
  ids = jnp.asarray(ids, jnp.int32)
  head.draft_to_target[...] = ids
  if lm_head == "own":
    rows = target.head_rows(ids).T.astype(dtype)                               # [H, Vd]
    head.lm_head[...] = jnp.broadcast_to(rows, head.lm_head[...].shape)
  else:
    attach_target_rows(head, target)
  return head


def final_hidden(target: Llama, tokens: jax.Array, cached: jax.Array | None = None) -> jax.Array:
  """The target's final normed hidden state [B, N, H] float32 over tokens [B, N] (teacher-forced,
  no gradient), or read from a feature cache [B, N, K+1, H] (its last slot, whatever its taps)."""
  if cached is not None:
    return jax.lax.stop_gradient(cached[:, :, -1].astype(jnp.float32))
  cfg = target.config
  b, n = tokens.shape
  out = target(tokens, KVCache.init(cfg, b, n, dtype=target.activation_dtype),
               logit_indices=jnp.zeros((b, 1), jnp.int32), taps=(cfg.num_layers,))
  return jax.lax.stop_gradient(target.norm(out.hidden[0]).astype(jnp.float32))


def medusa_loss(head: MedusaHead, hidden: jax.Array, tokens: jax.Array, loss_mask: jax.Array,
                length: jax.Array, *, decay: float = 0.8, max_anchors: int | None = None):
  """Returns (loss, metrics). hidden [B, N, H], tokens / loss_mask [B, N], length [B].

  Head k at position t is labelled with token t+k+2. Only positions with a label for some head are
  computed: the first `max_anchors` per row (default N/2), as in the EAGLE-3 task."""
  b, n = tokens.shape
  cfg = head.config
  ids = head.draft_to_target[...]
  in_vocab = jnp.zeros((cfg.vocab_size,), bool).at[ids].set(True)
  to_draft = jnp.zeros((cfg.vocab_size,), jnp.int32).at[ids].set(
      jnp.arange(cfg.draft_vocab_size, dtype=jnp.int32))
  pos = jnp.arange(n)[None, :]
  labelled = jnp.stack([((pos + 2 + k) < length[:, None]) & (shift(loss_mask, 2 + k) > 0)
                        & in_vocab[shift(tokens, 2 + k)] for k in range(cfg.num_heads)],
                       axis=-1)                                               # [B, N, K]
  m = max_anchors or max(1, n // 2)
  anchors = jax.vmap(lambda x: jnp.nonzero(x, size=m, fill_value=n - 1)[0])(
      jnp.any(labelled, axis=-1)).astype(jnp.int32)                            # [B, M]
  logits = head(take_at(hidden, anchors))                                          # [B, M, K, Vd]
  labels = jnp.stack([to_draft[take_at(tokens, anchors + 2 + k)] for k in range(cfg.num_heads)],
                     axis=-1)                                                  # [B, M, K]
  w = take_at(labelled, anchors).astype(jnp.float32)                               # [B, M, K]
  # fill anchors (past a row's labelled positions) repeat position n-1, which has no label
  ce = -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), labels[..., None], -1)[..., 0]
  counts = w.sum((0, 1))                                                       # [K]
  per_head = jnp.sum(ce * w, (0, 1)) / jnp.maximum(counts, 1.0)
  hit = jnp.argmax(logits, -1) == labels                                       # [B, M, K]
  acc = jnp.sum(hit * w, (0, 1)) / jnp.maximum(counts, 1.0)
  weights = jnp.asarray([decay ** k for k in range(cfg.num_heads)], jnp.float32)
  loss = jnp.sum(weights * per_head)
  # Greedy chain AL with D = K where every head has a label: 1 + the accepted run of heads.
  wf = jnp.all(w > 0, axis=-1).astype(jnp.float32)                             # [B, M]
  run = jnp.cumprod(hit.astype(jnp.float32), axis=-1)                          # [B, M, K]
  accept_at = jnp.sum(run * wf[..., None], (0, 1)) / jnp.maximum(wf.sum(), 1.0)
  metrics = dict(loss=loss, step_loss=per_head, step_acc=acc, step_count=counts,
                 accept_at=accept_at, al=1.0 + accept_at.sum(), al_count=wf.sum())
  return loss, metrics


def medusa_task(target: Llama, draft_ids: np.ndarray, *, num_heads: int = 4, num_layers: int = 1,
                decay: float = 0.8, seed: int = 0, head: MedusaHead | None = None,
                lm_head: str = "own"):
  """The Medusa `Task` for jspec.train.trainer: trainable = the heads' Params; aux = the frozen
  target and the heads' draft vocabulary (and the target's LM-head rows, lm_head="target")."""
  from jspec.train.trainer import Task

  head = head if head is not None else init_head(target, draft_ids, num_heads=num_heads,
                                                 num_layers=num_layers, seed=seed,
                                                 lm_head=lm_head)
  graphdef, params, rest = nnx.split(head, nnx.Param, ...)
  tgraph, tweights = nnx.split(target)

  def loss(params, aux, batch):
    tweights, rest = aux
    h = nnx.merge(graphdef, params, rest)
    hidden = final_hidden(nnx.merge(tgraph, tweights), batch["tokens"], batch.get("feats"))
    return medusa_loss(h, hidden, batch["tokens"], batch["loss_mask"], batch["length"],
                       decay=decay)

  meta = dict(head=dataclasses.asdict(head.config), decay=decay,
              draft_vocab_sha=digest(np.asarray(head.draft_to_target[...])),
              target=dict(layers=target.config.num_layers, hidden=target.config.hidden_size,
                          vocab=target.config.vocab_size))
  task = Task(name="medusa", params=params, aux=(tweights, rest), loss=loss, meta=meta)
  task.module = lambda p: nnx.merge(graphdef, p, rest)
  return task


def rank_accuracy(head: MedusaHead, hidden: jax.Array, tokens: jax.Array, reply: jax.Array,
                  ranks: int) -> np.ndarray:
  """How often each head's rank-r candidate is the token that follows, [K, ranks], for choosing a
  static tree (`jspec.drafters.static_tree.best_tree`). hidden [B, N, H] the target's final normed
  hidden states over tokens [B, N]; reply [B, N] bool, the positions whose tokens count (a
  position counts for head k where token t+k+2 is a reply token)."""
  b, n = tokens.shape
  k_heads = head.config.num_heads
  logp = head(hidden)                                                          # [B, N, K, Vd]
  _, idx = jax.lax.top_k(logp, ranks)
  cand = head.draft_to_target[...][idx]                                        # [B, N, K, R]
  out = np.zeros((k_heads, ranks))
  for k in range(k_heads):
    nxt = shift(tokens, 2 + k)                                                # [B, N]
    ok = np.asarray(shift(reply.astype(jnp.int32), 2 + k) > 0) & \
        (np.arange(n)[None, :] + 2 + k < n)
    hit = np.asarray(cand[:, :, k] == nxt[:, :, None])                         # [B, N, R]
    out[k] = hit[ok].mean(0) if ok.any() else 0.0
  return out
