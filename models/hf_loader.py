"""Hugging Face checkpoints: `config.json` + safetensors shards, from a folder or a hub id."""

from __future__ import annotations

import glob
import json
import os

import numpy as np

from models.config import LlamaConfig
from models.errors import ModelFetchError, ModelLoadError


def stored_dtype(folder: str) -> str:
  """"bf16" when most of the folder's safetensors weights are stored in bf16, else "f32"
  (read from the files' JSON headers)."""
  counts: dict[str, int] = {}
  for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
    try:
      with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    except (OSError, ValueError):
      continue
    for name, info in header.items():
      if name != "__metadata__":
        counts[info.get("dtype", "")] = counts.get(info.get("dtype", ""), 0) + 1
  return "bf16" if counts and max(counts, key=counts.get) == "BF16" else "f32"


def load_hf_folder(folder: str) -> tuple[LlamaConfig, dict[str, np.ndarray]]:
  cfg_path = os.path.join(folder, "config.json")
  if not os.path.isfile(cfg_path):
    raise ModelLoadError(f"{folder!r} has no config.json; expected a Hugging Face model folder")
  with open(cfg_path) as f:
    cfg = LlamaConfig.from_hf(json.load(f))
  files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
  if not files:
    raise ModelLoadError(f"{folder!r} has no *.safetensors weights (PyTorch .bin is not read)")
  from safetensors.numpy import load_file
  tensors = {}
  for path in files:
    try:
      shard = load_file(path)
    except Exception as e:
      raise ModelLoadError(f"cannot read {path!r} (corrupt or truncated?): {e}") from e
    for name, array in shard.items():
      tensors[name] = np.asarray(array, dtype=np.float32) if array.dtype != np.float32 else array
  return cfg, tensors


def download_hub_model(repo_id: str, cache_dir: str | None = None) -> str:
  """Downloads config, tokenizer and safetensors of `repo_id` with huggingface_hub; returns the folder."""
  try:
    from huggingface_hub import snapshot_download
  except ImportError as e:
    raise ModelFetchError(f"loading hub model {repo_id!r} needs `pip install huggingface_hub`") from e
  try:
    return snapshot_download(
        repo_id, cache_dir=cache_dir,
        allow_patterns=["config.json", "*.safetensors", "*.safetensors.index.json",
                        "tokenizer.json", "tokenizer_config.json", "generation_config.json"])
  except Exception as e:
    raise ModelFetchError(
        f"could not download {repo_id!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
        "If this machine is offline, download the model elsewhere and pass its local folder "
        "(config.json + *.safetensors + tokenizer.json) instead of the hub id.") from e
