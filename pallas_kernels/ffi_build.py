"""Builds and registers jax.ffi C++ kernels for the CPU: compiled on first use with the system
compiler against the installed jaxlib's FFI headers, cached by content, loaded once per process.

The library for a source lives under `$JSPEC_CACHE/<name>/<hash>/` (default `~/.cache/jspec`), the
hash covering the source, the flags, the compiler and the jax version, so a cached build always
matches the jax in use. `models.cpu_gemm` and `pallas_kernels.verify_attention.kernel_cpu` use it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path

import jax

FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")
_lock = threading.Lock()
_loaded: dict[str, tuple[bool, str]] = {}   # library path -> (ok, why not)


class FfiBuildError(RuntimeError):
  """A kernel could not be compiled or loaded."""


def cache_dir() -> str:
  """jspec's cache directory: `$JSPEC_CACHE`, else `~/.cache/jspec`."""
  return os.environ.get("JSPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jspec")


def compiler() -> str:
  return os.environ.get("CXX", "c++")


def library_path(source: Path, name: str) -> Path:
  """Where the compiled `source` for this compiler, flags and jax version lives."""
  cxx = compiler()
  try:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                             timeout=30).stdout.splitlines()[:1]
  except (OSError, subprocess.SubprocessError):
    version = ["missing"]
  key = hashlib.sha256()
  for part in (source.read_bytes(), " ".join(FLAGS).encode(), cxx.encode(),
               "".join(version).encode(), jax.__version__.encode(),
               jax.ffi.include_dir().encode()):
    key.update(part)
    key.update(b"\0")
  return Path(cache_dir()) / name / key.hexdigest()[:16] / f"lib{name}.so"


def build(source: Path, name: str, force: bool = False) -> Path:
  """Compiles `source` into the cache (atomically) unless it is there; returns the library."""
  path = library_path(source, name)
  if path.exists() and not force:
    return path
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
  os.close(fd)
  cmd = [compiler(), *FLAGS, f"-I{jax.ffi.include_dir()}", str(source), "-o", tmp]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  except (OSError, subprocess.SubprocessError) as e:
    os.unlink(tmp)
    raise FfiBuildError(f"cannot run the C++ compiler {cmd[0]!r} ({e}); install one "
                        "(e.g. g++) or set CXX") from None
  if proc.returncode != 0:
    os.unlink(tmp)
    raise FfiBuildError(f"compiling {source} failed:\n{proc.stderr[-2000:]}")
  os.replace(tmp, path)
  return path


def register(source: Path, name: str, targets: tuple[str, ...]) -> tuple[bool, str]:
  """Builds and loads `source` and registers its handler symbols `targets` as CPU FFI targets,
  once per process. Returns (True, "") or (False, why it is unavailable)."""
  with _lock:
    if name in _loaded:
      return _loaded[name]
    try:
      lib = ctypes.cdll.LoadLibrary(str(build(source, name)))
      for target in targets:
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, target)),
                                    platform="cpu")
      _loaded[name] = (True, "")
    except (FfiBuildError, OSError, AttributeError) as e:
      _loaded[name] = (False, str(e))
    return _loaded[name]
