"""Mixture-of-experts layer (top-k softmax router, SwiGLU experts on the grouped GEMM): unsharded
reference and an expert-parallel version over shard_map with fixed-capacity all_to_all dispatch.
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


def expert_capacity(tokens_per_shard: int, top_k: int, num_experts: int,
                    capacity_factor: float | None) -> int:
  """Slots per (source shard, expert); the policy is in `moe_ep`'s docstring."""
  if capacity_factor is None:
    return tokens_per_shard
  if capacity_factor <= 0:
    raise ValueError(f"capacity_factor={capacity_factor} must be > 0 (or None for no drops).")
  wanted = math.ceil(capacity_factor * tokens_per_shard * top_k / num_experts)
  return max(1, min(tokens_per_shard, wanted))


def capacity_slots(experts: jax.Array, num_experts: int,
                   capacity: int) -> tuple[jax.Array, jax.Array]:
  """experts [T, k] -> (slot [T, k], keep [T, k]): slot in the expert's buffer, filled in
  choice-major order (all first choices by token, then second choices, ...); keep: slot < C."""
  onehot = jax.nn.one_hot(experts.T, num_experts, dtype=jnp.int32)               # [k, T, E]
  k, t, _ = onehot.shape
  flat = onehot.reshape(k * t, num_experts)
  slot = jnp.sum((jnp.cumsum(flat, axis=0) - 1) * flat, axis=1).reshape(k, t).T   # [T, k]
  return slot, slot < capacity


def _ep_shard(params: MoEParams, x: jax.Array, *, top_k: int, capacity: int, axis: str,
              impl: str, normalize: bool) -> jax.Array:
  """One shard: x [Tl, D] local tokens; params hold all of the router and the El local experts."""
  t, d = x.shape
  e_local = params.w_gate.shape[0]
  num_experts = params.router.shape[1]
  n = num_experts // e_local
  c = capacity
  experts, gates = route(params.router, x, top_k, normalize)                     # [Tl, k]
  slot, keep = capacity_slots(experts, num_experts, c)
  # Send-buffer row of each assignment, [Tl*k]; E*C (out of range) = dropped.
  dest = jnp.where(keep, experts * c + slot, num_experts * c).reshape(-1)
  send = jnp.zeros((num_experts * c, d), x.dtype).at[dest].set(
      jnp.repeat(x, top_k, axis=0), mode="drop")                                 # [E*C, D]
  counts = jnp.zeros((num_experts,), jnp.int32).at[experts.reshape(-1)].add(
      keep.reshape(-1).astype(jnp.int32))                                        # [E] kept rows

  # Dispatch: block s of the result came from shard s, ordered (local expert, slot).
  recv = jax.lax.all_to_all(send, axis, 0, 0, tiled=True).reshape(n, e_local, c, d)
  recv_counts = jax.lax.all_to_all(counts, axis, 0, 0, tiled=True).reshape(n, e_local)

  # Compact valid rows into expert-major groups; the empty slots go to the padding tail.
  rows = recv.transpose(1, 0, 2, 3).reshape(e_local * n * c, d)                   # [El*n*C, D]
  valid = jnp.arange(c)[None, None, :] < recv_counts.T[:, :, None]               # [El, n, C]
  key = jnp.where(valid, jnp.arange(e_local)[:, None, None], e_local).reshape(-1)
  perm = jnp.argsort(key, stable=True)
  sizes = jnp.sum(valid, axis=(1, 2), dtype=jnp.int32)                           # [El]
  matmul = functools.partial(gmm, impl=impl)
  y_sorted = expert_mlp(params, rows[perm], sizes, matmul)                       # [El*n*C, D]
  y = jnp.zeros_like(y_sorted).at[perm].set(y_sorted)

  # Combine: send each source shard its rows back; the result is [E, C, D] in global expert order.
  y = y.reshape(e_local, n, c, d).transpose(1, 0, 2, 3).reshape(n * e_local * c, d)
  back = jax.lax.all_to_all(y, axis, 0, 0, tiled=True)                           # [E*C, D]
  picked = back[jnp.minimum(dest, num_experts * c - 1)].reshape(t, top_k, d)     # [Tl, k, D]
  return _combine(picked, jnp.where(keep, gates, 0.0), x.dtype)


def expert_mesh(num_devices: int | None = None, axis: str = "expert") -> jax.sharding.Mesh:
  """A 1-D mesh over the first num_devices devices (all by default), with Auto axis typing."""
  n = num_devices or jax.device_count()
  return jax.make_mesh((n,), (axis,), axis_types=(jax.sharding.AxisType.Auto,))


def moe_ep(params: MoEParams, x: jax.Array, *, mesh: jax.sharding.Mesh, top_k: int,
           capacity_factor: float | None = None, impl: str = "auto",
           axis: str = "expert", normalize: bool = True) -> jax.Array:
  """Expert-parallel MoE: x [T, D] -> [T, D], tokens and experts sharded over mesh axis `axis`.

  Capacity policy. Each shard sends each expert at most C token copies,
  C = min(T_local, ceil(capacity_factor * T_local * top_k / E)), or C = T_local when
  capacity_factor is None (a token picks an expert at most once, so nothing can drop). Slots fill
  in priority order: every token's first choice (in token order), then every second choice, ...
  An assignment past its expert's C slots is dropped: it contributes zero expert output and the
  token's other gate weights stay as they are (no renormalisation), so a token whose assignments
  all drop gets zero from the layer and passes on through the residual connection around it.
  Without drops the result equals `moe_reference`. Buffers are static ([E, C, D] per shard)
  because ragged_all_to_all does not run on XLA:CPU; received rows are compacted by expert before
  the grouped GEMM, so empty slots cost no expert FLOPs. impl: the grouped GEMM (`api.gmm`);
  normalize: the router's rule (`route`).
  Give a mesh with AxisType.Auto axes (`expert_mesh`) or inputs already sharded to match.
  """
  n = mesh.shape[axis]
  t = x.shape[0]
  num_experts = params.router.shape[1]
  if num_experts % n or t % n:
    raise ValueError(f"moe_ep: experts ({num_experts}) and tokens ({t}) must both divide by the "
                     f"{n} devices on mesh axis {axis!r}.")
  if not 1 <= top_k <= num_experts:
    raise ValueError(f"moe_ep: top_k={top_k} must be in [1, {num_experts}].")
  capacity = expert_capacity(t // n, top_k, num_experts, capacity_factor)
  body = functools.partial(_ep_shard, top_k=top_k, capacity=capacity, axis=axis, impl=impl,
                           normalize=normalize)
  param_specs = MoEParams(router=P(), w_gate=P(axis), w_up=P(axis), w_down=P(axis))
  # check_vma=False: a pallas_call's out_shape carries no varying-axes type (its spelling differs
  # between jax versions), and every value in the body varies over `axis` anyway.
  return jax.shard_map(body, mesh=mesh, in_specs=(param_specs, P(axis)), out_specs=P(axis),
                       check_vma=False)(params, x)
