"""Expert-parallel MoE on 8 host devices against the unsharded reference, in a subprocess (the
device count must be set before jax starts): no drops equal the reference, drops as documented,
gradients (router, experts, tokens) equal the reference's, for the padded dispatch and the ragged
one (emulated: XLA:CPU has no ragged all_to_all); the rows each all_to_all moves per token."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import numpy as np

T, D, F, E, TOP_K, SHARDS = 64, 32, 48, 16, 2, 8
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def expected_keep(experts: np.ndarray, capacity: int) -> np.ndarray:
  """The documented drop rule, by loops: per source shard and destination shard (the one holding
  the expert), first choices in token order, then second choices, ..., C rows at most."""
  keep = np.zeros(experts.shape, bool)
  t_local = experts.shape[0] // SHARDS
  for s in range(SHARDS):
    used = np.zeros(SHARDS, int)
    for j in range(experts.shape[1]):
      for t in range(s * t_local, (s + 1) * t_local):
        dest = experts[t, j] // (E // SHARDS)
        keep[t, j] = used[dest] < capacity
        used[dest] += 1
  return keep


def all_to_all_rows(fn, *args) -> list[int]:
  """Leading sizes of the float operands of every all_to_all in fn's jaxpr (the token rows)."""
  import jax
  import jax.extend
  rows = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "all_to_all" and eqn.invars[0].aval.dtype.kind == "f":
        rows.append(eqn.invars[0].aval.shape[0])
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)
  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return rows


def _child() -> dict:
  import jax
  import jax.numpy as jnp
  jax.config.update("jax_default_matmul_precision", "highest")
  from pallas_kernels.moe_gemm import ep

  mesh = ep.expert_mesh(SHARDS)
  params = ep.init_moe_params(jax.random.key(0), D, F, E)
  x = jax.random.normal(jax.random.key(1), (T, D))
  layer = jax.jit(ep.moe_ep, static_argnames=("mesh", "top_k", "capacity_factor", "impl",
                                             "dispatch"))
  ref = jax.jit(ep.moe_reference, static_argnames=("top_k", "impl"))
  res = {"devices": jax.device_count()}
  y_ref = ref(params, x, top_k=TOP_K)
  res["ref_max_abs"] = float(jnp.max(jnp.abs(y_ref)))
  capacity = ep.shard_capacity(T // SHARDS, TOP_K, E, SHARDS, 1.0)
  experts, _ = ep.route(params.router, x, TOP_K)
  keep = expected_keep(np.asarray(experts), capacity)
  y_keep = np.asarray(ref(params, x, top_k=TOP_K, keep=jnp.asarray(keep)))
  res.update(capacity=capacity, dropped=int((~keep).sum()), all_dropped=int((~keep.any(1)).sum()))
  cot = jax.random.normal(jax.random.key(2), (T, D))
  loss = lambda fn, **kw: lambda p, x: jnp.vdot(fn(p, x, top_k=TOP_K, **kw), cot)
  want = jax.grad(loss(ref), argnums=(0, 1))(params, x)
  for dispatch in ("padded", "emulated"):
    run = functools.partial(layer, mesh=mesh, top_k=TOP_K, dispatch=dispatch)
    # No drops, both layers on the Pallas kernel: identical per-row arithmetic, so bitwise equal.
    y = run(params, x, impl="pallas")
    res[f"{dispatch}_pallas_equal"] = bool(jnp.array_equal(y, ref(params, x, top_k=TOP_K,
                                                                  impl="pallas")))
    # No drops on lax.ragged_dot: XLA:CPU densifies over the E (vs E/8 local) groups, which
    # reorders the fp32 sums, so equal to rounding only.
    res[f"{dispatch}_ragged_max_err"] = float(jnp.max(jnp.abs(run(params, x, impl="reference")
                                                              - y_ref)))
    # Drops: capacity_factor 1 -> C = ceil(8 * 2 / 8) = 2 rows per (source, destination) shard.
    y_drop = np.asarray(run(params, x, capacity_factor=1.0, impl="reference"))
    res[f"{dispatch}_drop_max_err"] = float(np.max(np.abs(y_drop - y_keep)))
    res[f"{dispatch}_all_dropped_rows_zero"] = bool(np.all(y_drop[~keep.any(1)] == 0))
    res[f"{dispatch}_differs_from_no_drop"] = float(np.max(np.abs(y_drop - np.asarray(y_ref))))
    # Gradients (router, every expert weight, the tokens) through the sharded layer, both matmuls.
    for impl in ("reference", "pallas"):
      got = jax.jit(jax.grad(loss(ep.moe_ep, mesh=mesh, impl=impl, dispatch=dispatch),
                             argnums=(0, 1)))(params, x)
      errs = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))),
                          got, want)
      res[f"{dispatch}_grad_rel_err_{impl}"] = max(jax.tree.leaves(errs))

  # Rows per token that each token-row all_to_all moves (padded): 64 experts, top-2 on 8 shards
  # send min(n*k, E) = 16 rows per token, where one block per expert (the old layout) sent 64.
  wide = ep.init_moe_params(jax.random.key(3), D, F, 64)
  rows = all_to_all_rows(functools.partial(ep.moe_ep, mesh=mesh, top_k=TOP_K, dispatch="padded",
                                           impl="reference"), wide, x)
  res["padded_rows_per_token"] = [r / (T // SHARDS) for r in rows]
  res["documented_rows_per_token"] = ep.rows_per_token("padded", T // SHARDS, TOP_K, 64, SHARDS)
  # The native ragged path cannot run on XLA:CPU, but it lowers for GPU and TPU: the rows, their
  # expert ids and the results each go through one lax.ragged_all_to_all.
  native = jax.jit(functools.partial(ep.moe_ep, mesh=mesh, top_k=TOP_K, dispatch="ragged",
                                     impl="reference"))
  res["ragged_ops"] = {p: native.trace(params, x).lower(lowering_platforms=(p,)).as_text().count(
      "ragged_all_to_all") for p in ("cuda", "tpu")}
  return res


def test_expert_parallel_matches_unsharded_reference():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  res = json.loads(proc.stdout.strip().splitlines()[-1])
  assert res["devices"] == SHARDS
  assert res["capacity"] == 2 and res["dropped"] > 0 and res["all_dropped"] > 0
  for dispatch in ("padded", "emulated"):
    assert res[f"{dispatch}_pallas_equal"]
    assert res[f"{dispatch}_ragged_max_err"] <= 1e-6 * res["ref_max_abs"]
    assert res[f"{dispatch}_drop_max_err"] <= 1e-6 * res["ref_max_abs"]
    assert res[f"{dispatch}_all_dropped_rows_zero"]
    assert res[f"{dispatch}_differs_from_no_drop"] > 1e-2
    assert res[f"{dispatch}_grad_rel_err_reference"] < 1e-5
    assert res[f"{dispatch}_grad_rel_err_pallas"] < 1e-5
  # dispatch and combine move 16 rows per token each (the result rows come back the same way)
  assert res["padded_rows_per_token"] == [16.0, 16.0] == [res["documented_rows_per_token"]] * 2
  assert res["ragged_ops"] == {"cuda": 3, "tpu": 3}


if __name__ == "__main__":
  print(json.dumps(_child()))
