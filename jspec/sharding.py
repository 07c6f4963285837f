"""Sharded decoding on JAX's own Mesh: a mesh from "data=2,model=4", the placement of a model's
weights with NamedSharding (Megatron-style tensor parallelism for attention heads and MLP columns,
experts over the expert axis, or the model axis when there is none), and the KV cache's placement.

The jitted programs run under `jax.set_mesh(mesh)` with the weights already placed, so XLA's SPMD
partitioner keeps each weight where it is (no all-gather of weights) and inserts the all-reduces of
the row-parallel products. Axes: "data" shards the batch (rows of the cache and of every per-row
array), "model" the heads / MLP columns / vocabulary, "expert" the experts of MoE layers (which then
run through the expert-parallel layer, `pallas_kernels.moe_gemm.moe_ep`). A weight whose dimension
does not divide by its axis stays replicated, and `describe` says which.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from models.moe import expert_axis

AXES = ("data", "model", "expert")


def parse_mesh(spec: str | dict[str, int], devices=None) -> Mesh:
  """"data=2,model=4" (or {"data": 2, "model": 4}) -> a Mesh over the first prod(sizes) devices,
  with Auto axis types. Axes not named have size 1; every axis is present in the mesh."""
  if isinstance(spec, str):
    sizes = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
      name, sep, value = part.partition("=")
      if not sep or not value.strip().isdigit():
        raise ValueError(f"mesh spec {spec!r}: write axis=size pairs such as 'data=2,model=4'")
      sizes[name.strip()] = int(value)
  else:
    sizes = dict(spec)
  unknown = sorted(set(sizes) - set(AXES))
  if unknown:
    raise ValueError(f"mesh axes {unknown} are not known; use {list(AXES)}")
  if any(v < 1 for v in sizes.values()):
    raise ValueError(f"mesh axis sizes must be >= 1, got {sizes}")
  shape = tuple(sizes.get(a, 1) for a in AXES)
  devices = list(devices if devices is not None else jax.devices())
  need = int(np.prod(shape))
  if need > len(devices):
    raise ValueError(f"mesh {dict(zip(AXES, shape))} needs {need} devices, {len(devices)} are "
                     "visible (on CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N)")
  return jax.make_mesh(shape, AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES),
                       devices=devices[:need])


def _axis(mesh, name: str, dim: int) -> str | None:
  """`name` if the mesh splits it (> 1) and dim divides by it, else None (replicated)."""
  size = dict(zip(mesh.axis_names, mesh.axis_sizes)).get(name, 1)
  return name if size > 1 and dim % size == 0 else None


def weight_spec(path: tuple, shape: tuple, config, mesh) -> P:
  """The PartitionSpec of one weight, from its path in the model's nnx state."""
  names = [p for p in path if isinstance(p, str)]
  leaf = names[-1] if names else ""
  module = names[-2] if len(names) > 1 else ""
  m = lambda dim: _axis(mesh, "model", dim)
  heads_ok = (m(config.num_heads) is not None and m(config.num_kv_heads) is not None)
  if module in ("q_proj", "k_proj", "v_proj"):            # column-parallel over heads
    if not heads_ok:
      return P()
    return P(None, "model") if leaf == "kernel" else P("model")
  if module == "o_proj":                                  # row-parallel over heads
    return P("model", None) if heads_ok else P()
  if module in ("gate_proj", "up_proj", "shared_gate_proj", "shared_up_proj"):
    return P(None, m(shape[1]))
  if module in ("down_proj", "shared_down_proj"):
    return P(m(shape[0]), None)
  if leaf in ("w_gate", "w_up", "w_down"):                # [E, ...]: expert-parallel
    return P(expert_axis(mesh, shape[0])[0], None, None)
  if module == "lm_head":                                 # vocabulary-parallel logits
    return P(None, m(shape[1]))
  return P()                                              # embedding, norms, router: replicated


def weight_shardings(weights, config, mesh) -> Any:
  """A pytree of NamedShardings matching `weights` (the state of `nnx.split(model)`)."""
  def one(path, leaf):   # (DictKey("layers"), DictKey(0), ..., GetAttrKey("value")) -> names
    keys = tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey))
    return NamedSharding(mesh, weight_spec(keys, leaf.shape, config, mesh))
  return jax.tree_util.tree_map_with_path(one, weights)


def shard_weights(weights, config, mesh):
  """`weights` placed on the mesh."""
  return jax.device_put(weights, weight_shardings(weights, config, mesh))


def describe(weights, config, mesh) -> dict[str, str]:
  """Path -> PartitionSpec string for every weight (what is sharded how; "P()" = replicated)."""
  out = {}
  for path, sh in jax.tree_util.tree_flatten_with_path(
      weight_shardings(weights, config, mesh))[0]:
    out[".".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))] = str(sh.spec)
  return out


def as_mesh(mesh: Mesh | str | dict | None) -> Mesh | None:
  """A Mesh from a Mesh, a spec string / dict (`parse_mesh`) or None."""
  return parse_mesh(mesh) if isinstance(mesh, (str, dict)) else mesh


def on_mesh(mesh: Mesh | None):
  """The context the jitted programs run in: `jax.set_mesh(mesh)`, or nothing without a mesh."""
  return jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()


def to_host(x) -> np.ndarray:
  """A jax.Array as a numpy array on this host; one spread over other processes' devices is
  all-gathered first (a collective: every process calls it in the same order)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


def initialize_from_env() -> bool:
  """`jax.distributed.initialize` from JSPEC_COORDINATOR / JSPEC_NUM_PROCESSES / JSPEC_PROCESS_ID
  (set by `python -m jspec.launch`); False, doing nothing, when they are not set. Call it before
  any other jax work."""
  address = os.environ.get("JSPEC_COORDINATOR")
  if not address:
    return False
  try:
    num, rank = int(os.environ["JSPEC_NUM_PROCESSES"]), int(os.environ["JSPEC_PROCESS_ID"])
  except (KeyError, ValueError) as e:
    raise ValueError("JSPEC_COORDINATOR is set, so JSPEC_NUM_PROCESSES and JSPEC_PROCESS_ID must "
                     f"be integers too ({e})") from e
  jax.distributed.initialize(address, num_processes=num, process_id=rank)
  return True


def output_specs(lowered, compiled):
  """ShapeDtypeStructs of a program's outputs as they come out, placement included (the lowered
  program's shapes, the compiled one's shardings): what a next program is compiled for ahead of
  time, so that an output passed on is not resharded or refused."""
  return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                      lowered.out_info, compiled.output_shardings)
