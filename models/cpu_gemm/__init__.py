"""Small-M fp32 matrix products for XLA:CPU: one pass over the weights for 1..64 rows.

XLA:CPU streams a weight matrix once for a single row (GEMV), but its M >= 2 path re-reads it, so a
(1+D)-token verify forward costs far more than a decode step although the weights are the same
(benchmarks/REPORT.md, "Verification cost on CPU"). `kernel.cc` holds two jax.ffi kernels that read
each weight once in address order; `matmul` calls them on CPU and `reference` everywhere else.

The C++ is compiled on first use with the system compiler (`$CXX`, default `c++`, `-O3
-march=native`) against the installed jaxlib's FFI headers, and cached under
`$JSPEC_CACHE/cpu_gemm/<hash>/` (hash of source, flags, compiler and jax version), so it always
matches the jax in use. Without a compiler, or with `JSPEC_CPU_GEMM=0`, every product falls back to
XLA's dot with one warning. `python -m models.cpu_gemm` builds it ahead of time.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import math
import os
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp

SOURCE = Path(__file__).with_name("kernel.cc")
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")
MAX_ROWS = 64        # above this (prefill), XLA's GEMM is the better kernel
IMPLS = ("auto", "ffi", "xla")
_TARGETS = {False: "jspec_cpu_gemm_nn", True: "jspec_cpu_gemm_nt"}
_lock = threading.Lock()
_state: dict = {}


class CpuGemmBuildError(RuntimeError):
  """The kernel could not be compiled or loaded (`impl="ffi"` was asked for explicitly)."""


def _cache_root() -> Path:
  from models.fetch import cache_dir
  return Path(cache_dir()) / "cpu_gemm"


def _compiler() -> str:
  return os.environ.get("CXX", "c++")


def library_path() -> Path:
  """Where the compiled kernel for this source, compiler, flags and jax version lives."""
  cxx = _compiler()
  try:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                             timeout=30).stdout.splitlines()[:1]
  except (OSError, subprocess.SubprocessError):
    version = ["missing"]
  key = hashlib.sha256()
  for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), cxx.encode(),
               "".join(version).encode(), jax.__version__.encode(),
               jax.ffi.include_dir().encode()):
    key.update(part)
    key.update(b"\0")
  return _cache_root() / key.hexdigest()[:16] / "libjspec_cpu_gemm.so"


def build(force: bool = False) -> Path:
  """Compiles kernel.cc into the cache (atomically) unless it is there; returns its path."""
  path = library_path()
  if path.exists() and not force:
    return path
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
  os.close(fd)
  cmd = [_compiler(), *FLAGS, f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", tmp]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  except (OSError, subprocess.SubprocessError) as e:
    os.unlink(tmp)
    raise CpuGemmBuildError(f"cannot run the C++ compiler {cmd[0]!r} ({e}); install one "
                            "(e.g. g++) or set CXX") from None
  if proc.returncode != 0:
    os.unlink(tmp)
    raise CpuGemmBuildError(f"compiling {SOURCE} failed:\n{proc.stderr[-2000:]}")
  os.replace(tmp, path)
  return path


def _register() -> bool:
  """Builds, loads and registers the kernels once per process; False (after one warning) when
  they are unavailable."""
  with _lock:
    if "ok" in _state:
      return _state["ok"]
    if os.environ.get("JSPEC_CPU_GEMM", "1") == "0":
      _state.update(ok=False, why="disabled by JSPEC_CPU_GEMM=0")
      return False
    try:
      lib = ctypes.cdll.LoadLibrary(str(build()))
      for transposed, name in _TARGETS.items():
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
      _state.update(ok=True, lib=lib)
    except (CpuGemmBuildError, OSError, AttributeError) as e:
      _state.update(ok=False, why=str(e))
      warnings.warn(f"jspec: the CPU small-M matmul kernel is unavailable, using XLA's dot "
                    f"(multi-token verification will cost more): {e}", RuntimeWarning,
                    stacklevel=3)
    return _state["ok"]


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
      raise CpuGemmBuildError(_state["why"])
    return True
  return fits and rows <= MAX_ROWS and jax.sharding.get_abstract_mesh().empty and _register()


def matmul(x: jax.Array, w: jax.Array, *, transpose_w: bool = False,
           impl: str = "auto") -> jax.Array:
  """x [..., K] @ w ([K, N], or [N, K] when transpose_w) -> [..., N].

  impl: "auto" (the kernel for <= MAX_ROWS fp32 rows on CPU, XLA otherwise), "ffi" or "xla"."""
  if use_kernel(x, w, impl):
    return _ffi_matmul(x, w, transpose_w)
  return reference(x, w, transpose_w)


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
