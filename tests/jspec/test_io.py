"""jspec.io: a bad destination fails before any work, and a write is whole or leaves nothing (and
never destroys the older file), whether it fails on a full disk or is interrupted."""

import errno
import os
import stat

import pytest

from jspec import io as jio


def _no_temp_files(folder) -> bool:
  return not [f for f in os.listdir(folder) if f.endswith((".tmp", ".probe"))]


def test_check_writable_accepts_and_creates_nothing(tmp_path):
  path = tmp_path / "report.json"
  assert jio.check_writable(path) == str(path)
  assert os.listdir(tmp_path) == []


def test_check_writable_missing_folder(tmp_path):
  path = tmp_path / "nope" / "report.json"
  with pytest.raises(ValueError, match=f"cannot write {path}: the folder {tmp_path / 'nope'} "
                     "does not exist; create it or choose another path"):
    jio.check_writable(path)
  assert not (tmp_path / "nope").exists()
  assert jio.check_writable(path, create_folder=True) == str(path)     # or make it
  assert os.listdir(tmp_path / "nope") == []


def test_check_writable_unwritable_paths(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("x")
  with pytest.raises(ValueError, match="cannot write .*a_file/report.json: .*a_file is a file, "
                     "not a folder"):
    jio.check_writable(blocker / "report.json")
  with pytest.raises(ValueError, match="cannot create the folder .*a_file/plots for x.png: Not a "
                     "directory"):
    jio.check_writable(blocker / "plots" / "x.png", create_folder=True)
  with pytest.raises(ValueError, match=f"cannot write {tmp_path}: it is a folder"):
    jio.check_writable(tmp_path)
  with pytest.raises(ValueError, match="/proc/.*choose a writable folder"):
    jio.check_writable("/proc/jspec-report.json")      # refused even to root
  assert blocker.read_text() == "x"


def test_check_writable_read_only_folder(tmp_path, monkeypatch):
  ro = tmp_path / "ro"
  ro.mkdir()
  ro.chmod(0o555)
  if os.access(ro, os.W_OK):   # root ignores the mode: refuse new files the way the OS would
    real = jio.tempfile.mkstemp

    def mkstemp(*a, dir=None, **k):
      if dir == str(ro):
        raise PermissionError(errno.EACCES, "Permission denied")
      return real(*a, dir=dir, **k)
    monkeypatch.setattr(jio.tempfile, "mkstemp", mkstemp)
  try:
    with pytest.raises(ValueError, match=f"cannot write {ro}/r.json: Permission denied in {ro}; "
                       "choose a writable folder"):
      jio.check_writable(ro / "r.json")
    assert os.listdir(ro) == []
  finally:
    ro.chmod(0o755)


def test_check_writable_read_only_file(tmp_path, monkeypatch):
  path = tmp_path / "r.json"
  path.write_text("old")
  path.chmod(0o444)
  monkeypatch.setattr(jio.os, "access", lambda p, mode: False)   # as a non-root user sees it
  with pytest.raises(ValueError, match="the file is read-only"):
    jio.check_writable(path)


def test_atomic_write_replaces_whole_file_with_normal_permissions(tmp_path):
  path = tmp_path / "r.json"
  jio.atomic_write_text(path, "héllo\n")
  assert path.read_text(encoding="utf-8") == "héllo\n"
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~jio._UMASK
  path.chmod(0o640)
  jio.atomic_write_bytes(path, b"\x00\x01")
  assert path.read_bytes() == b"\x00\x01"
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o640          # an older file's mode is kept
  assert os.listdir(tmp_path) == ["r.json"]


@pytest.mark.parametrize("fault", ["disk_full", "interrupt"])
def test_failed_write_keeps_the_older_file_and_leaves_no_partial(tmp_path, monkeypatch, fault):
  path = tmp_path / "r.json"
  path.write_text("older report")
  exc = (OSError(errno.ENOSPC, "No space left on device") if fault == "disk_full"
         else KeyboardInterrupt())

  def fsync(fd):
    raise exc
  monkeypatch.setattr(jio.os, "fsync", fsync)   # the data was handed over, the disk refused it
  with pytest.raises(type(exc)):
    jio.atomic_write_text(path, "new report " * 1000)
  assert path.read_text() == "older report"
  assert os.listdir(tmp_path) == ["r.json"]
  with pytest.raises(type(exc)):                 # and a new file is not created half-written
    jio.atomic_write_text(tmp_path / "new.json", "x")
  assert os.listdir(tmp_path) == ["r.json"]


def test_interrupt_inside_a_writer_block(tmp_path):
  path = tmp_path / "plot.png"
  with pytest.raises(KeyboardInterrupt):
    with jio.atomic_open(path, "wb") as f:
      f.write(b"\x89PNG half")
      raise KeyboardInterrupt
  assert os.listdir(tmp_path) == []


def test_savefig_through_atomic_open(tmp_path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.image
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots()
  ax.plot([0, 1], [1, 0])
  with jio.atomic_open(tmp_path / "p.png", "wb") as f:
    fig.savefig(f, format="png")
  plt.close(fig)
  assert matplotlib.image.imread(tmp_path / "p.png").shape[2] == 4
  assert _no_temp_files(tmp_path)


def test_atomic_open_refuses_partial_modes(tmp_path):
  with pytest.raises(ValueError, match="mode must be 'w' or 'wb'"):
    with jio.atomic_open(tmp_path / "x", "a"):
      pass
