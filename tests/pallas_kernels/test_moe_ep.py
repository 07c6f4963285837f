"""Expert-parallel MoE on 8 host devices against the unsharded reference, in a subprocess (the
device count must be set before jax starts): no drops equal the reference, drops as documented,
gradients (router, experts, tokens) equal the reference's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

T, D, F, E, TOP_K, SHARDS = 64, 32, 48, 16, 2, 8
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def expected_keep(experts: np.ndarray, capacity: int) -> np.ndarray:
  """The documented drop rule, by loops: per shard, first choices in token order, then second ..."""
  keep = np.zeros(experts.shape, bool)
  t_local = experts.shape[0] // SHARDS
  for s in range(SHARDS):
    used = np.zeros(E, int)
    for j in range(experts.shape[1]):
      for t in range(s * t_local, (s + 1) * t_local):
        e = experts[t, j]
        keep[t, j] = used[e] < capacity
        used[e] += 1
  return keep


def _child() -> dict:
  import jax
  import jax.numpy as jnp
  jax.config.update("jax_default_matmul_precision", "highest")
  from pallas_kernels.moe_gemm import ep

  mesh = ep.expert_mesh(SHARDS)
  params = ep.init_moe_params(jax.random.key(0), D, F, E)
  x = jax.random.normal(jax.random.key(1), (T, D))
  layer = jax.jit(ep.moe_ep, static_argnames=("mesh", "top_k", "capacity_factor", "impl"))
  ref = jax.jit(ep.moe_reference, static_argnames=("top_k", "impl"))
  res = {"devices": jax.device_count()}

  # No drops, both layers on the Pallas kernel: identical per-row arithmetic, so bitwise equal.
  y = layer(params, x, mesh=mesh, top_k=TOP_K, impl="pallas")
  res["pallas_equal"] = bool(jnp.array_equal(y, ref(params, x, top_k=TOP_K, impl="pallas")))
  # No drops on lax.ragged_dot: XLA:CPU densifies over the E (vs E/8 local) groups, which reorders
  # the fp32 sums, so equal to rounding only.
  y_ref = ref(params, x, top_k=TOP_K)
  res["ragged_max_err"] = float(jnp.max(jnp.abs(layer(params, x, mesh=mesh, top_k=TOP_K,
                                                       impl="reference") - y_ref)))
  res["ref_max_abs"] = float(jnp.max(jnp.abs(y_ref)))

  # Drops: capacity_factor 1 -> C = ceil(8 * 2 / 16) = 1 slot per (shard, expert).
  capacity = ep.expert_capacity(T // SHARDS, TOP_K, E, 1.0)
  experts, _ = ep.route(params.router, x, TOP_K)
  keep = expected_keep(np.asarray(experts), capacity)
  y_drop = np.asarray(layer(params, x, mesh=mesh, top_k=TOP_K, capacity_factor=1.0,
                            impl="reference"))
  y_keep = np.asarray(ref(params, x, top_k=TOP_K, keep=jnp.asarray(keep)))
  res.update(capacity=capacity, dropped=int((~keep).sum()), all_dropped=int((~keep.any(1)).sum()),
             drop_max_err=float(np.max(np.abs(y_drop - y_keep))),
             all_dropped_rows_zero=bool(np.all(y_drop[~keep.any(1)] == 0)),
             differs_from_no_drop=float(np.max(np.abs(y_drop - np.asarray(y_ref)))))

  # Gradients (router, every expert weight, the tokens) through the sharded layer, both matmuls.
  cot = jax.random.normal(jax.random.key(2), (T, D))
  loss = lambda fn, **kw: lambda p, x: jnp.vdot(fn(p, x, top_k=TOP_K, **kw), cot)
  want = jax.grad(loss(ref), argnums=(0, 1))(params, x)
  for impl in ("reference", "pallas"):
    got = jax.jit(jax.grad(loss(ep.moe_ep, mesh=mesh, impl=impl), argnums=(0, 1)))(params, x)
    errs = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))),
                        got, want)
    res[f"grad_rel_err_{impl}"] = max(jax.tree.leaves(errs))
  return res


def test_expert_parallel_matches_unsharded_reference():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  res = json.loads(proc.stdout.strip().splitlines()[-1])
  assert res["devices"] == SHARDS
  assert res["pallas_equal"]
  assert res["ragged_max_err"] <= 1e-6 * res["ref_max_abs"]
  assert res["capacity"] == 1 and res["dropped"] > 0 and res["all_dropped"] > 0
  assert res["drop_max_err"] <= 1e-6 * res["ref_max_abs"]
  assert res["all_dropped_rows_zero"]
  assert res["differs_from_no_drop"] > 1e-2
  assert res["grad_rel_err_reference"] < 1e-5 and res["grad_rel_err_pallas"] < 1e-5


if __name__ == "__main__":
  print(json.dumps(_child()))
