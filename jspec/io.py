"""Files jspec writes (reports, plots, schedules, drafter heads, training outputs): the destination
is checked before any work starts, and a file appears whole or not at all (temp file + os.replace).
"""

from __future__ import annotations

import contextlib
import os
import tempfile

_UMASK = os.umask(0o022)   # read the process umask (the only way is to set it), then restore it
os.umask(_UMASK)


def check_writable(path: str | os.PathLike, *, create_folder: bool = False) -> str:
  """Raises ValueError, saying what to change, unless a file can be written at `path`; returns the
  absolute path. With `create_folder`, a missing folder is created (else it is an error). Creates
  and removes a probe file, so read-only mounts and permissions are caught as they really are."""
  path = os.path.abspath(os.fspath(path))
  folder, name = os.path.split(path)
  if not name or os.path.isdir(path):
    raise ValueError(f"cannot write {path}: it is a folder; give a file name")
  if create_folder:
    try:
      os.makedirs(folder, exist_ok=True)
    except OSError as e:
      raise ValueError(f"cannot create the folder {folder} for {name}: {e.strerror}; "
                       "choose another place") from None
  elif not os.path.isdir(folder):
    raise ValueError(f"cannot write {path}: " + (
        f"{folder} is a file, not a folder" if os.path.exists(folder) else
        f"the folder {folder} does not exist; create it or choose another path"))
  if os.path.exists(path) and not os.access(path, os.W_OK):
    raise ValueError(f"cannot write {path}: the file is read-only; make it writable or choose "
                     "another path")
  try:
    fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".probe")
    os.close(fd)
    os.unlink(probe)
  except OSError as e:
    raise ValueError(f"cannot write {path}: {e.strerror} in {folder}; choose a writable "
                     "folder") from None
  return path


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **open_kwargs):
  """`open(path, mode)` whose file replaces `path` only when the block ends without an error; on
  any error or interrupt the temp file is removed and an older `path` is left as it was."""
  if mode not in ("w", "wb"):
    raise ValueError(f"atomic_open writes whole files: mode must be 'w' or 'wb', got {mode!r}")
  path = os.path.abspath(os.fspath(path))
  folder, name = os.path.split(path)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
  try:
    if mode == "w":
      open_kwargs.setdefault("encoding", "utf-8")
    with os.fdopen(fd, mode, **open_kwargs) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())    # the data is on disk before the name points at it
    # mkstemp makes 0600: keep the older file's permissions, or give a new one open()'s
    os.chmod(tmp, os.stat(path).st_mode & 0o7777 if os.path.exists(path) else 0o666 & ~_UMASK)
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
  with atomic_open(path, "w") as f:
    f.write(text)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
  with atomic_open(path, "wb") as f:
    f.write(data)
