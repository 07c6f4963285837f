"""Public grouped GEMM: `gmm` picks the backend's Pallas kernel (the Triton-style kernel on GPU,
jax's megablox on TPU) and `lax.ragged_dot` elsewhere.

`impl=` overrides the choice; inputs are validated here with errors that say what to change.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.moe_gemm import kernel_gpu as kernel
from pallas_kernels.moe_gemm import kernel_tpu
from pallas_kernels.moe_gemm.reference import gmm_reference

IMPLS = ("auto", "pallas", "pallas_gpu", "pallas_tpu", "reference")


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
  """'auto' -> the backend's kernel on GPU ('pallas_gpu') and TPU ('pallas_tpu'), 'reference'
  elsewhere; 'pallas' -> the backend's kernel ('pallas_tpu' on TPU, else 'pallas_gpu')."""
  if impl not in IMPLS:
    raise ValueError(f"gmm: impl={impl!r}; choose one of {IMPLS}.")
  backend = jax.default_backend()
  if impl == "pallas":
    return "pallas_tpu" if backend == "tpu" else "pallas_gpu"
  if impl == "auto":
    return f"pallas_{backend}" if backend in ("gpu", "tpu") else "reference"
  return impl


def gmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, impl: str = "auto",
        interpret: bool | None = None,
        tiling: kernel.Tiling | tuple[int, int, int] | None = None) -> jax.Array:
  """Grouped GEMM over rows sorted by group: lhs [M, K], rhs [E, K, N], group_sizes [E] -> [M, N].

  Row r of group g (rows sum(sizes[:g]) .. sum(sizes[:g+1]) - 1) gets lhs[r] @ rhs[g]; rows past
  sum(group_sizes) (which must be <= M) are padding and come out zero. Differentiable in lhs, rhs.
  impl: "auto" (the backend's kernel on GPU / TPU, else reference), "pallas" (the backend's
  kernel), "pallas_gpu" (the Triton-style kernel), "pallas_tpu" (megablox), "reference"
  (lax.ragged_dot). interpret: run the kernel in interpret mode (default: off its own backend).
  tiling: kernel blocks, a `Tiling` for pallas_gpu, a (tm, tk, tn) tuple for pallas_tpu.
  """
  _validate(lhs, rhs, group_sizes)
  impl = resolve_impl(impl)
  if impl == "reference":
    return gmm_reference(lhs, rhs, group_sizes)
  backend = impl.removeprefix("pallas_")
  on_backend = jax.default_backend() == backend
  if interpret is None:
    interpret = not on_backend
  if not interpret and not on_backend:
    raise ValueError(f"gmm: impl={impl!r} with interpret=False needs a {backend.upper()} backend; "
                     "pass interpret=True (slow, for tests) or impl='reference'.")
  if backend == "tpu":
    if tiling is not None and not isinstance(tiling, tuple):
      raise ValueError(f"gmm: impl='pallas_tpu' takes tiling=(tm, tk, tn), got {tiling!r}.")
    return kernel_tpu.gmm(lhs, rhs, group_sizes, tiling=tiling, interpret=interpret)
  if tiling is not None and not isinstance(tiling, kernel.Tiling):
    raise ValueError(f"gmm: impl='pallas_gpu' takes tiling=Tiling(...), got {tiling!r}.")
  return kernel.gmm(lhs, rhs, group_sizes, tiling=tiling, interpret=interpret)
