"""Pieces every head's training uses: the target's teacher-forced features, training-time-test
(TTT) attention, position shifts and gathers, and a short array digest."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from models.kv_cache import KVCache
from models.llama import Llama


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Features:
  taps: tuple[jax.Array, ...]   # [B, N, H] each: the residual stream entering the head's layers
  target_logits: jax.Array      # [B, N, Vd] the target's logits on the draft vocabulary


def target_features(target: Llama, tokens: jax.Array, taps: tuple[int, ...],
                    draft_ids: jax.Array, cached: jax.Array | None = None,
                    dtype=jnp.float32) -> Features:
  """Teacher-forced target pass over tokens [B, N] (no gradient), or the same read from a feature
  cache: cached [B, N, K+1, H] holds the K taps and the final normed hidden state. dtype: the
  operands of the draft-vocabulary logits product (accumulated in float32)."""
  cfg = target.config
  if cached is None:
    b, n = tokens.shape
    out = target(tokens, KVCache.init(cfg, b, n, dtype=target.activation_dtype),
                 logit_indices=jnp.zeros((b, 1), jnp.int32), taps=tuple(taps) + (cfg.num_layers,))
    hidden, final = tuple(out.hidden[:-1]), target.norm(out.hidden[-1])      # [B, N, H]
  else:
    cached = cached.astype(jnp.float32)
    hidden, final = tuple(cached[:, :, i] for i in range(len(taps))), cached[:, :, len(taps)]
  rows = target.head_rows(draft_ids)                                           # [Vd, H]
  logits = jnp.einsum("bnh,vh->bnv", final.astype(dtype), rows.astype(dtype),
                      preferred_element_type=jnp.float32)
  return jax.lax.stop_gradient(Features(hidden, logits))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def mixed_matmul(x, w, dtype):
  """x [..., K] @ w [K, N] -> float32, both operands rounded to `dtype`; the backward products
  also take `dtype` operands and give float32 results (then x's and w's dtypes)."""
  return jnp.matmul(x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)


def _mixed_fwd(x, w, dtype):
  return mixed_matmul(x, w, dtype), (x, w)


def _mixed_bwd(dtype, res, g):
  x, w = res
  g = g.astype(dtype)
  dx = jnp.matmul(g, w.astype(dtype).T, preferred_element_type=jnp.float32)
  dw = jnp.matmul(x.reshape(-1, x.shape[-1]).astype(dtype).T, g.reshape(-1, g.shape[-1]),
                  preferred_element_type=jnp.float32)
  return dx.astype(x.dtype), dw.astype(w.dtype)


mixed_matmul.defvjp(_mixed_fwd, _mixed_bwd)


@dataclasses.dataclass(frozen=True)
class MixedDot:
  """`nnx.Linear(dot_general=...)` for mixed-precision training: x @ kernel with both operands in
  `dtype` and float32 results, in the forward pass and in both products of the backward one (a
  product with a bfloat16 result runs as a float32 one on XLA:CPU, at half the speed)."""
  dtype: Any = jnp.bfloat16

  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
               **kwargs):
    (lc, rc), (lb, rb) = dimension_numbers
    if tuple(lc) == (lhs.ndim - 1,) and tuple(rc) == (0,) and not lb and not rb and rhs.ndim == 2:
      return mixed_matmul(lhs, rhs, jnp.dtype(self.dtype))
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type, **kwargs)


def training_graphdef(module, dtype):
  """The graphdef a training loss merges its float32 params into: the module's own, or for a
  lower `dtype` a copy whose every `nnx.Linear` runs through `MixedDot(dtype)`; the module
  itself (exported after training) is left as it is."""
  from flax import nnx
  if jnp.dtype(dtype) == jnp.float32:
    return nnx.split(module, nnx.Param, ...)[0]
  copy = nnx.clone(module)
  for _, m in nnx.iter_graph(copy):
    if isinstance(m, nnx.Linear):
      m.dot_general = MixedDot(jnp.dtype(dtype))
  return nnx.split(copy, nnx.Param, ...)[0]


def ttt_attend(prev: list, anchors: jax.Array | None, scale: float, dtype=None,
               segments: jax.Array | None = None):
  """Attention for TTT step j = len(prev); prev holds the (k, v) of steps 0 .. j-1. Step 0 runs
  over all N positions, causally. Steps j > 0 run over K anchors [B, K] (positions t): their
  queries see step 0's keys at positions <= t and the keys of steps 1..j at the same anchor.
  dtype: the operands of its products (default q's), accumulated in float32. segments [B, N]
  (packed rows, `jspec.train.shards.PackedRows`): a query sees only keys of its own sequence."""
  def attend(q, k, v):
    b, m, hq, dh = q.shape
    kvh = k.shape[2]
    dt = dtype or q.dtype
    qg = q.reshape(b, m, kvh, hq // kvh, dh)                                   # [B, M, KVH, G, Dh]
    dot = lambda spec, x, y: jnp.einsum(spec, x.astype(dt), y.astype(dt),
                                        preferred_element_type=jnp.float32)
    steps = prev + [(k, v)]
    k0, v0 = steps[0]
    n = k0.shape[1]
    t = jnp.broadcast_to(jnp.arange(m)[None], (b, m)) if anchors is None else anchors
    seen = jnp.arange(n)[None, None, :] <= t[:, :, None]                       # [B, M, N]
    if segments is not None:
      seen = seen & (segments[:, None, :] == take_at(segments, t)[:, :, None])
    s0 = dot("btkgd,bskd->bkgts", qg, k0) * scale                              # [B,KVH,G,M,N]
    s0 = jnp.where(seen[:, None, None], s0, -jnp.inf)
    diag = [dot("btkgd,btkd->bkgt", qg, ki)[..., None] * scale
            for ki, _ in steps[1:]]                                            # [B,KVH,G,M,1]
    probs = jax.nn.softmax(jnp.concatenate([s0] + diag, axis=-1), axis=-1)
    out = dot("bkgts,bskd->btkgd", probs[..., :n], v0)
    for i, (_, vi) in enumerate(steps[1:]):
      out = out + jnp.einsum("bkgt,btkd->btkgd", probs[..., n + i], vi.astype(jnp.float32))
    return out.reshape(b, m, hq, dh).astype(dt), (k, v)
  return attend


def shift(x: jax.Array, k: int) -> jax.Array:
  """x[:, t + k] at t (zeros past the end)."""
  return jnp.concatenate([x[:, k:], jnp.zeros_like(x[:, :k])], axis=1)


def take_at(x: jax.Array, idx: jax.Array) -> jax.Array:
  """x [B, N, ...] at per-row positions idx [B, K] (clipped to the sequence)."""
  idx = jnp.clip(idx, 0, x.shape[1] - 1)
  return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)


def digest(a: np.ndarray) -> str:
  """A short content hash of an array (a cache key for data-derived arrays)."""
  return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]
