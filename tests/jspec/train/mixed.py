"""Checks shared by the mixed-precision training tests of each head."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dot_dtypes(jaxpr) -> list:
  """Every dot_general of a jaxpr and its sub-jaxprs: (operand dtypes, result dtype)."""
  out = []
  for e in jaxpr.eqns:
    if e.primitive.name == "dot_general":
      out.append((tuple(v.aval.dtype for v in e.invars), e.outvars[0].aval.dtype))
    for p in e.params.values():
      for sub in (p if isinstance(p, (tuple, list)) else (p,)):
        inner = getattr(sub, "jaxpr", None)
        if inner is not None:
          out += dot_dtypes(getattr(inner, "jaxpr", inner))
  return out


def check_mixed_matches_float32(make_task, batch, min_products: int = 10) -> None:
  """make_task(compute_dtype) -> Task. The bfloat16 task's loss and gradients equal the float32
  task's up to bfloat16 rounding; every product with a bfloat16 operand returns float32 (a
  bfloat16 result runs as a float32 product on XLA:CPU, at half the speed), forward and
  backward; the params stay float32 (the optimiser's master copy)."""
  got = {}
  for dt in (jnp.float32, jnp.bfloat16):
    task = make_task(dt)
    f = jax.value_and_grad(task.loss, has_aux=True)
    (loss, _), g = f(task.params, task.aux, batch)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(task.params))
    low = [d for d in dot_dtypes(jax.make_jaxpr(f)(task.params, task.aux, batch).jaxpr)
           if jnp.bfloat16 in d[0]]
    if dt == jnp.bfloat16:
      assert len(low) >= min_products and all(out == jnp.float32 for _, out in low), low
    else:
      assert not low
    got[jnp.dtype(dt).name] = (float(loss), jax.tree_util.tree_leaves(g))
  (l32, g32), (l16, g16) = got["float32"], got["bfloat16"]
  assert abs(l16 - l32) < 0.01 * abs(l32), (l16, l32)
  num = sum(float(jnp.sum((a - b) ** 2)) for a, b in zip(g32, g16))
  den = sum(float(jnp.sum(a ** 2)) for a in g32)
  assert 0 < (num / den) ** 0.5 < 0.05, (num / den) ** 0.5
