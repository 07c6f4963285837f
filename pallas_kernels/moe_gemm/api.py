"""Public grouped GEMM: `gmm` picks the Pallas kernel on GPU and `lax.ragged_dot` elsewhere.

`impl=` overrides the choice; inputs are validated here with errors that say what to change.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.moe_gemm import kernel
from pallas_kernels.moe_gemm.reference import gmm_reference

IMPLS = ("auto", "pallas", "reference")


def _validate(lhs, rhs, group_sizes) -> None:
  if lhs.ndim != 2:
    raise ValueError(f"gmm: lhs must be [M, K]; got shape {lhs.shape}.")
  if rhs.ndim != 3:
    raise ValueError(f"gmm: rhs must be [E, K, N]; got shape {rhs.shape}.")
  if lhs.shape[1] != rhs.shape[1]:
    raise ValueError(f"gmm: contraction mismatch, lhs {lhs.shape} has K={lhs.shape[1]} but rhs "
                     f"{rhs.shape} has K={rhs.shape[1]}.")
  if group_sizes.shape != (rhs.shape[0],):
    raise ValueError(f"gmm: group_sizes must be [E] = [{rhs.shape[0]}] (one size per rhs group); "
                     f"got shape {group_sizes.shape}.")
  if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise ValueError(f"gmm: group_sizes must be integers (int32); got {group_sizes.dtype}.")


def resolve_impl(impl: str) -> str:
  """'auto' -> 'pallas' on a GPU backend, 'reference' on CPU/TPU."""
  if impl not in IMPLS:
    raise ValueError(f"gmm: impl={impl!r}; choose one of {IMPLS}.")
  if impl == "auto":
    return "pallas" if jax.default_backend() == "gpu" else "reference"
  return impl


def gmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, impl: str = "auto",
        interpret: bool | None = None, tiling: kernel.Tiling | None = None) -> jax.Array:
  """Grouped GEMM over rows sorted by group: lhs [M, K], rhs [E, K, N], group_sizes [E] -> [M, N].

  Row r of group g (rows sum(sizes[:g]) .. sum(sizes[:g+1]) - 1) gets lhs[r] @ rhs[g]; rows past
  sum(group_sizes) (which must be <= M) are padding and come out zero. Differentiable in lhs, rhs.
  impl: "pallas" (the Triton-style kernel; interpret mode off-GPU unless `interpret` says
  otherwise), "reference" (lax.ragged_dot), or "auto". tiling: kernel blocks (pallas only).
  """
  _validate(lhs, rhs, group_sizes)
  impl = resolve_impl(impl)
  if impl == "reference":
    return gmm_reference(lhs, rhs, group_sizes)
  on_gpu = jax.default_backend() == "gpu"
  if interpret is None:
    interpret = not on_gpu
  if not interpret and not on_gpu:
    raise ValueError("gmm: impl='pallas' with interpret=False needs a GPU backend; pass "
                     "interpret=True (slow, for tests) or impl='reference'.")
  return kernel.gmm(lhs, rhs, group_sizes, tiling=tiling, interpret=interpret)
