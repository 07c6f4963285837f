"""Mixture-of-experts layer (top-k softmax router, SwiGLU experts on the grouped GEMM): unsharded
reference and an expert-parallel version over shard_map that sends each token's rows only to the
shards holding its experts (ragged all_to_all on GPU/TPU, capacity-bounded blocks elsewhere).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from pallas_kernels.moe_gemm.api import gmm


class MoEParams(NamedTuple):
  router: jax.Array   # [D, E]
  w_gate: jax.Array   # [E, D, F]
  w_up: jax.Array     # [E, D, F]
  w_down: jax.Array   # [E, F, D]


def init_moe_params(key: jax.Array, d_model: int, d_ff: int, num_experts: int,
                    dtype=jnp.float32) -> MoEParams:
  """Gaussian weights scaled by 1/sqrt(fan_in)."""
  k_r, k_g, k_u, k_d = jax.random.split(key, 4)
  normal = lambda k, shape, fan_in: (jax.random.normal(k, shape) / math.sqrt(fan_in)).astype(dtype)
  return MoEParams(router=normal(k_r, (d_model, num_experts), d_model),
                   w_gate=normal(k_g, (num_experts, d_model, d_ff), d_model),
                   w_up=normal(k_u, (num_experts, d_model, d_ff), d_model),
                   w_down=normal(k_d, (num_experts, d_ff, d_model), d_ff))


def route(router: jax.Array, x: jax.Array, top_k: int,
          normalize: bool = True) -> tuple[jax.Array, jax.Array]:
  """x [T, D] -> (experts [T, k] int32, gates [T, k] f32): the top-k of the softmax over all E
  experts, renormalised to sum 1 when `normalize` (= a softmax over the k top logits)."""
  logits = jnp.dot(x.astype(jnp.float32), router.astype(jnp.float32))           # [T, E]
  top_logits, experts = jax.lax.top_k(logits, top_k)
  if normalize:
    gates = jax.nn.softmax(top_logits, axis=-1)
  else:
    gates = jnp.exp(top_logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True))
  return experts.astype(jnp.int32), gates


def expert_mlp(params: MoEParams, rows: jax.Array, group_sizes: jax.Array, matmul) -> jax.Array:
  """SwiGLU per expert over rows sorted by expert: rows [R, D] -> [R, D]; padding rows give 0."""
  h = jax.nn.silu(matmul(rows, params.w_gate, group_sizes)) * matmul(rows, params.w_up, group_sizes)
  return matmul(h, params.w_down, group_sizes)                                   # [R, D]


def _combine(y: jax.Array, gates: jax.Array, out_dtype) -> jax.Array:
  """y [T, k, D] expert outputs, gates [T, k] -> [T, D] gate-weighted sum in f32."""
  return jnp.sum(y.astype(jnp.float32) * gates[..., None], axis=1).astype(out_dtype)


def moe_reference(params: MoEParams, x: jax.Array, *, top_k: int, keep: jax.Array | None = None,
                  impl: str = "reference", normalize: bool = True) -> jax.Array:
  """Unsharded MoE: x [T, D] -> [T, D]; tokens sorted by expert, then one grouped GEMM per weight.

  keep [T, k] bool zeroes dropped assignments (to state `moe_ep`'s drops). impl: the grouped GEMM
  (`api.gmm`; default lax.ragged_dot), so a test can run both layers on the same matmul.
  normalize: the router's rule (`route`).
  """
  t, d = x.shape
  num_experts = params.router.shape[1]
  experts, gates = route(params.router, x, top_k, normalize)                     # [T, k]
  if keep is not None:
    gates = jnp.where(keep, gates, 0.0)
  flat = experts.reshape(-1)                                                     # [T*k]
  order = jnp.argsort(flat, stable=True)
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)               # [E]
  matmul = functools.partial(gmm, impl=impl)
  y_sorted = expert_mlp(params, x[order // top_k], sizes, matmul)                # [T*k, D]
  y = jnp.zeros_like(y_sorted).at[order].set(y_sorted)
  return _combine(y.reshape(t, top_k, d), gates, x.dtype)


def shard_capacity(tokens_per_shard: int, top_k: int, num_experts: int, shards: int,
                   capacity_factor: float | None) -> int:
  """Rows each source shard may send each destination shard; the policy is in `moe_ep`'s
  docstring. Without a capacity factor: the most a shard can ever need, T_local * min(k, E/n) (a
  token picks an expert at most once, so it sends at most min(k, E/n) rows to one shard)."""
  most = tokens_per_shard * min(top_k, num_experts // shards)
  if capacity_factor is None:
    return most
  if capacity_factor <= 0:
    raise ValueError(f"capacity_factor={capacity_factor} must be > 0 (or None for no drops).")
  return max(1, min(most, math.ceil(capacity_factor * tokens_per_shard * top_k / shards)))


def rows_per_token(dispatch: str, tokens_per_shard: int, top_k: int, num_experts: int,
                   shards: int, capacity_factor: float | None = None) -> float:
  """Token rows one dispatch all_to_all moves per local token: n * C / T_local for the padded
  buffers (min(n*k, E) without a capacity factor), at most k (the routed rows) for ragged."""
  if dispatch == "ragged":
    return float(top_k)
  c = shard_capacity(tokens_per_shard, top_k, num_experts, shards, capacity_factor)
  return shards * c / tokens_per_shard


def shard_slots(dest: jax.Array, shards: int, capacity: int) -> tuple[jax.Array, jax.Array]:
  """dest [T, k] destination shard of each assignment -> (slot [T, k], keep [T, k]): the row in
  that shard's block, filled in choice-major order (all first choices by token, then second
  choices, ...); keep: slot < capacity."""
  onehot = jax.nn.one_hot(dest.T, shards, dtype=jnp.int32)                       # [k, T, n]
  k, t, _ = onehot.shape
  flat = onehot.reshape(k * t, shards)
  slot = jnp.sum((jnp.cumsum(flat, axis=0) - 1) * flat, axis=1).reshape(k, t).T   # [T, k]
  return slot, slot < capacity


def emulated_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets,
                               recv_sizes, *, axis_name: str, block: int):
  """`lax.ragged_all_to_all` for backends without it (XLA:CPU), for slices of at most `block`
  rows: every shard's operand and offsets are all-gathered, then each shard writes the slices sent
  to it. Same result; it moves every row, so it saves nothing and exists to test the ragged path."""
  del recv_sizes   # implied by the senders' sizes
  me = jax.lax.axis_index(axis_name)
  operands = jax.lax.all_gather(operand, axis_name)                               # [n, N, D]
  in_off, sizes, out_off = (jax.lax.all_gather(v, axis_name)[:, me]
                            for v in (input_offsets, send_sizes, output_offsets))  # [n] from s
  rows = jnp.arange(block)[:, None]
  for src in range(operands.shape[0]):
    piece = jax.lax.dynamic_slice_in_dim(operands[src], in_off[src], block)      # [block, D]
    old = jax.lax.dynamic_slice_in_dim(output, out_off[src], block)
    output = jax.lax.dynamic_update_slice_in_dim(
        output, jnp.where(rows < sizes[src], piece, old), out_off[src], 0)
  return output


def _exchange(buf, counts, *, axis: str, capacity: int, ragged: str | None):
  """Block j of buf [n*C, ...] (counts[j] valid rows) goes to shard j; returns the blocks received
  ([n*C, ...], block s from shard s) and their counts. ragged: None (tiled all_to_all of whole
  blocks), "native" (lax.ragged_all_to_all: only the valid rows move) or "emulated"."""
  recv_counts = jax.lax.all_to_all(counts, axis, 0, 0, tiled=True)                # [n]
  if ragged is None:
    return jax.lax.all_to_all(buf, axis, 0, 0, tiled=True), recv_counts
  n = counts.shape[0]
  offsets = jnp.arange(n, dtype=jnp.int32) * capacity
  me = jax.lax.axis_index(axis).astype(jnp.int32)
  args = (buf, jnp.zeros_like(buf), offsets, counts,
          jnp.full((n,), me * capacity, jnp.int32), recv_counts)   # my block's place at shard j
  if ragged == "native":
    return jax.lax.ragged_all_to_all(*args, axis_name=axis), recv_counts
  return emulated_ragged_all_to_all(*args, axis_name=axis, block=capacity), recv_counts


def _ep_shard(params: MoEParams, x: jax.Array, *, top_k: int, capacity: int, axis: str,
              impl: str, normalize: bool, ragged: str | None) -> jax.Array:
  """One shard: x [Tl, D] local tokens; params hold all of the router and the El local experts."""
  t, d = x.shape
  e_local = params.w_gate.shape[0]
  num_experts = params.router.shape[1]
  n = num_experts // e_local
  c = capacity
  experts, gates = route(params.router, x, top_k, normalize)                     # [Tl, k]
  dest = experts // e_local                                                      # [Tl, k]
  slot, keep = shard_slots(dest, n, c)
  # Send-buffer row of each assignment, [Tl*k]; n*C (out of range) = dropped.
  row = jnp.where(keep, dest * c + slot, n * c).reshape(-1)
  send = jnp.zeros((n * c, d), x.dtype).at[row].set(jnp.repeat(x, top_k, axis=0), mode="drop")
  ids = jnp.full((n * c,), e_local, jnp.int32).at[row].set(
      (experts % e_local).reshape(-1), mode="drop")                              # e_local: empty
  counts = jnp.zeros((n,), jnp.int32).at[dest.reshape(-1)].add(
      keep.reshape(-1).astype(jnp.int32))                                        # [n] rows sent

  # Dispatch: block s of the result came from shard s, its first recv_counts[s] rows valid.
  recv, recv_counts = _exchange(send, counts, axis=axis, capacity=c, ragged=ragged)
  recv_ids, _ = _exchange(ids[:, None], counts, axis=axis, capacity=c, ragged=ragged)
  valid = (jnp.arange(c)[None, :] < recv_counts[:, None]).reshape(-1)            # [n*C]
  key = jnp.where(valid, recv_ids[:, 0], e_local)
  # Compact the valid rows into expert-major groups; the empty slots go to the padding tail.
  perm = jnp.argsort(key, stable=True)
  sizes = jnp.bincount(key, length=e_local + 1)[:e_local].astype(jnp.int32)      # [El]
  matmul = functools.partial(gmm, impl=impl)
  y_sorted = expert_mlp(params, recv[perm], sizes, matmul)                       # [n*C, D]
  y = jnp.zeros_like(y_sorted).at[perm].set(y_sorted)

  # Combine: every source shard gets its rows back, in the blocks it sent them in.
  back, _ = _exchange(y, recv_counts, axis=axis, capacity=c, ragged=ragged)      # [n*C, D]
  picked = back[jnp.minimum(row, n * c - 1)].reshape(t, top_k, d)                # [Tl, k, D]
  return _combine(picked, jnp.where(keep, gates, 0.0), x.dtype)


def expert_mesh(num_devices: int | None = None, axis: str = "expert") -> jax.sharding.Mesh:
  """A 1-D mesh over the first num_devices devices (all by default), with Auto axis typing."""
  n = num_devices or jax.device_count()
  return jax.make_mesh((n,), (axis,), axis_types=(jax.sharding.AxisType.Auto,))


def moe_ep(params: MoEParams, x: jax.Array, *, mesh: jax.sharding.Mesh, top_k: int,
           capacity_factor: float | None = None, impl: str = "auto",
           axis: str = "expert", normalize: bool = True, dispatch: str = "auto") -> jax.Array:
  """Expert-parallel MoE: x [T, D] -> [T, D], tokens and experts sharded over mesh axis `axis`.

  Dispatch. Each shard packs its tokens' rows by destination shard (the shard holding the chosen
  expert) into n blocks of C rows, sends block j to shard j, which groups what it received by local
  expert for the grouped GEMM and sends the results back the same way. dispatch="ragged"
  (`lax.ragged_all_to_all`, GPU and TPU) moves only the rows routed (k per token, fewer when some
  drop); "padded" (a tiled all_to_all of the whole blocks; XLA:CPU has no ragged all_to_all) moves
  n*C rows per shard, min(n*k, E) per token without a capacity factor (`rows_per_token`); "auto"
  picks ragged on GPU/TPU and padded elsewhere; "emulated" runs the ragged path through all_gathers
  (for tests off GPU/TPU).

  Capacity policy. C = min(T_local*min(k, E/n), ceil(capacity_factor * T_local * k / n)), or
  C = T_local*min(k, E/n) when capacity_factor is None: the most any shard can need, so nothing
  can drop. Rows fill each destination's block in priority order: every token's first choice (in
  token order), then every second choice, ... An assignment past its destination's C rows is
  dropped: it contributes zero expert output and the token's other gate weights stay as they are
  (no renormalisation), so a token whose assignments all drop gets zero from the layer and passes
  on through the residual connection around it. Without drops the result equals `moe_reference`.
  Buffers are static ([n*C, D] per shard). impl: the grouped GEMM (`api.gmm`); normalize: the
  router's rule (`route`). Give a mesh with AxisType.Auto axes (`expert_mesh`), or the abstract
  mesh of a `jax.set_mesh` context, or inputs already sharded to match.
  """
  n = mesh.shape[axis]
  t = x.shape[0]
  num_experts = params.router.shape[1]
  if num_experts % n or t % n:
    raise ValueError(f"moe_ep: experts ({num_experts}) and tokens ({t}) must both divide by the "
                     f"{n} devices on mesh axis {axis!r}.")
  if not 1 <= top_k <= num_experts:
    raise ValueError(f"moe_ep: top_k={top_k} must be in [1, {num_experts}].")
  if dispatch not in ("auto", "ragged", "padded", "emulated"):
    raise ValueError(f"moe_ep: dispatch={dispatch!r}; choose auto, ragged, padded or emulated.")
  if dispatch == "auto":
    dispatch = "ragged" if jax.default_backend() in ("gpu", "tpu") else "padded"
  ragged = {"ragged": "native", "emulated": "emulated", "padded": None}[dispatch]
  capacity = shard_capacity(t // n, top_k, num_experts, n, capacity_factor)
  body = functools.partial(_ep_shard, top_k=top_k, capacity=capacity, axis=axis, impl=impl,
                           normalize=normalize, ragged=ragged)
  param_specs = MoEParams(router=P(), w_gate=P(axis), w_up=P(axis), w_down=P(axis))
  # check_vma=False: a pallas_call's out_shape carries no varying-axes type (its spelling differs
  # between jax versions), and every value in the body varies over `axis` anyway.
  return jax.shard_map(body, mesh=mesh, in_specs=(param_specs, P(axis)), out_specs=P(axis),
                       check_vma=False)(params, x)
