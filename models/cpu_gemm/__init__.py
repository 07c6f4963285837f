"""Small-M matrix products for XLA:CPU: one pass over the weights for a decode step or a verify
block, from float32 weights or from weights kept in a stored format.

XLA:CPU streams a weight matrix once for a single row (GEMV), but its M >= 2 path re-reads it, so a
(1+D)-token verify forward costs far more than a decode step although the weights are the same
(benchmarks/REPORT.md, "Verification cost on CPU"). `kernel.cc` holds jax.ffi kernels that read
each weight once in address order: `matmul` (fp32, w [K, N] or [N, K]) and `qmatmul` (bf16, int8
and GGUF Q8_0/Q4_0/Q4_1 weights as stored, `models.weight_formats`, dequantised four rows at a
time into L1). Off CPU, or for taller products, the references (XLA's dot; `reference_matmul`,
which dequantises first) run instead.

The C++ is compiled on first use with the system compiler (`$CXX`, default `c++`, `-O3
-march=native`) and cached by `pallas_kernels.ffi_build`, so it always matches the jax in use.
Without a compiler, or with `JSPEC_CPU_GEMM=0`, every product falls back to the reference with one
warning. `python -m models.cpu_gemm` builds it ahead of time.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from models.weight_formats import CODES, QuantTensor, reference_matmul
from pallas_kernels import ffi_build

SOURCE = Path(__file__).with_name("kernel.cc")
NAME = "jspec_cpu_gemm"
MAX_ROWS = 16        # above this, XLA's GEMM is the faster kernel (benchmarks/results/gemm_crossover)
Q_MAX_ROWS = 128     # stored formats: above this, dequantising once for XLA's GEMM is faster
IMPLS = ("auto", "ffi", "xla")
_TARGETS = {False: "jspec_cpu_gemm_nn", True: "jspec_cpu_gemm_nt"}
_Q_TARGET = "jspec_cpu_gemm_q"
_ALL_TARGETS = (*_TARGETS.values(), _Q_TARGET)
_warned: list = []

CpuGemmBuildError = ffi_build.FfiBuildError


def build(force: bool = False) -> Path:
  """Compiles kernel.cc into the cache unless it is there; returns its path."""
  return ffi_build.build(SOURCE, NAME, force)


def _register() -> bool:
  """Builds, loads and registers the kernels once per process; False (after one warning) when
  they are unavailable."""
  if os.environ.get("JSPEC_CPU_GEMM", "1") == "0":
    return False
  ok, why = ffi_build.register(SOURCE, NAME, _ALL_TARGETS)
  if not ok and not _warned:
    _warned.append(why)
    warnings.warn(f"jspec: the CPU small-M matmul kernel is unavailable, using XLA's dot "
                  f"(multi-token verification will cost more): {why}", RuntimeWarning,
                  stacklevel=3)
  return ok


def _why_not() -> str:
  if os.environ.get("JSPEC_CPU_GEMM", "1") == "0":
    return "disabled by JSPEC_CPU_GEMM=0"
  return ffi_build.register(SOURCE, NAME, _ALL_TARGETS)[1]


def available() -> bool:
  return _register()


def reference(x: jax.Array, w: jax.Array, transpose_w: bool = False) -> jax.Array:
  """x [..., K] @ w, with w [K, N] (or [N, K] when transpose_w): XLA's dot."""
  return jnp.matmul(x, w.T if transpose_w else w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _ffi_matmul(x, w, transpose_w):
  n = w.shape[0] if transpose_w else w.shape[1]
  call = jax.ffi.ffi_call(_TARGETS[transpose_w], jax.ShapeDtypeStruct(x.shape[:-1] + (n,), x.dtype),
                          vmap_method="sequential")
  return call(x, w)


def _ffi_fwd(x, w, transpose_w):
  return _ffi_matmul(x, w, transpose_w), (x, w)


def _ffi_bwd(transpose_w, res, g):
  x, w = res
  _, vjp = jax.vjp(lambda a, b: reference(a, b, transpose_w), x, w)
  return vjp(g)


_ffi_matmul.defvjp(_ffi_fwd, _ffi_bwd)


def use_kernel(x: jax.Array, w: jax.Array, impl: str = "auto") -> bool:
  """Static choice: the kernel for fp32 products of at most MAX_ROWS rows on CPU, not under a
  mesh (XLA's SPMD partitioner cannot split a custom call, so it would gather the weights)."""
  if impl not in IMPLS:
    raise ValueError(f"matmul impl must be one of {IMPLS}, got {impl!r}")
  if impl == "xla":
    return False
  rows = math.prod(x.shape[:-1])
  fits = (x.dtype == jnp.float32 and w.dtype == jnp.float32 and w.ndim == 2
          and jax.default_backend() == "cpu" and 1 <= rows)
  if impl == "ffi":
    if not fits:
      raise ValueError(f"matmul impl='ffi' needs fp32 operands on CPU, got {x.dtype}/{w.dtype} "
                       f"on {jax.default_backend()}; use impl='auto'")
    if not _register():
      raise CpuGemmBuildError(_why_not())
    return True
  return fits and rows <= MAX_ROWS and jax.sharding.get_abstract_mesh().empty and _register()


def matmul(x: jax.Array, w: jax.Array, *, transpose_w: bool = False,
           impl: str = "auto") -> jax.Array:
  """x [..., K] @ w ([K, N], or [N, K] when transpose_w) -> [..., N].

  impl: "auto" (the kernel for <= MAX_ROWS fp32 rows on CPU, XLA otherwise), "ffi" or "xla"."""
  if use_kernel(x, w, impl):
    return _ffi_matmul(x, w, transpose_w)
  return reference(x, w, transpose_w)


def _ffi_qmatmul(x: jax.Array, t: QuantTensor) -> jax.Array:
  n, _ = t.shape
  call = jax.ffi.ffi_call(_Q_TARGET, jax.ShapeDtypeStruct(x.shape[:-1] + (n,), jnp.float32),
                          vmap_method="sequential")
  d = t.d if t.d.size else jnp.zeros((1,), jnp.float32)
  m = t.m if t.m.size else jnp.zeros((1,), jnp.float32)
  return call(x.astype(jnp.float32), t.q, d, m, fmt=np.int32(CODES[t.fmt]), n_out=np.int64(n))


def use_q_kernel(x: jax.Array, impl: str = "auto") -> bool:
  """Static choice for stored-format weights: the kernel on CPU outside a mesh for up to
  Q_MAX_ROWS rows under "auto" (a prefill's taller products dequantise the weight once and use
  XLA's GEMM: measured at [1536, 576] Q4_1, the kernel 1.9 vs 2.3 ms at 128 rows, 9.3 vs 6.1 ms
  at 512), always under "ffi"."""
  if impl not in IMPLS:
    raise ValueError(f"matmul impl must be one of {IMPLS}, got {impl!r}")
  if impl == "xla":
    return False
  rows = math.prod(x.shape[:-1])
  on_cpu = jax.default_backend() == "cpu"
  if impl == "ffi":
    if not on_cpu:
      raise ValueError(f"matmul impl='ffi' runs on CPU only, not {jax.default_backend()}; "
                       "use impl='auto'")
    if not _register():
      raise CpuGemmBuildError(_why_not())
    return True
  return (on_cpu and 1 <= rows <= Q_MAX_ROWS and jax.sharding.get_abstract_mesh().empty
          and _register())


def qmatmul(x: jax.Array, t: QuantTensor, *, impl: str = "auto") -> jax.Array:
  """x [..., K] @ w^T for a stored-format weight t ([N, K], `models.weight_formats`) -> [..., N]
  float32: the kernel reads t as stored (dequantising in registers and L1); elsewhere the
  reference dequantises t and uses XLA's dot. Not differentiable in t."""
  if x.shape[-1] != t.shape[1]:
    raise ValueError(f"qmatmul: x has {x.shape[-1]} features, the weight {t.shape[1]}")
  if use_q_kernel(x, impl):
    return _ffi_qmatmul(x, t)
  return reference_matmul(x, t)


@dataclasses.dataclass(frozen=True)
class DotGeneral:
  """`nnx.Linear(dot_general=...)` that routes the plain `x @ kernel` contraction through
  `matmul`; any other contraction goes to `lax.dot_general`. Hashable, so graphdefs compare."""
  impl: str = "auto"

  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
               **kwargs):
    (lc, rc), (lb, rb) = dimension_numbers
    plain = (tuple(lc) == (lhs.ndim - 1,) and tuple(rc) == (0,) and not lb and not rb
             and rhs.ndim == 2 and preferred_element_type in (None, lhs.dtype)
             and kwargs.get("out_sharding") is None)
    if plain:
      return matmul(lhs, rhs, impl=self.impl)
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type, **kwargs)


def main() -> None:
  try:
    path = build(force="--force" in sys.argv)
  except CpuGemmBuildError as e:
    sys.exit(f"error: {e}")
  print(path)


if __name__ == "__main__":
  main()
