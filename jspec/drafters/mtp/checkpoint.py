"""MTP modules on disk: jspec's own head folder (config.json + model.safetensors + checksums.json)
and the MTP layers that `num_nextn_predict_layers` checkpoints carry at layer L = num_hidden_layers.

Both use the DeepSeek-V3 names in torch's [out, in] layout: `enorm.weight`, `hnorm.weight`,
`eh_proj.weight` [H, 2H] (embedding half first), the decoder layer's own Llama-family names
(`self_attn.q_proj.weight`, `mlp.gate_proj.weight`, `input_layernorm.weight`, ...) and, in
checkpoints, `shared_head.norm.weight` (kept) and `shared_head.head.weight` / `embed_tokens.weight`
(the target's, never copied). A head folder has no prefix and adds the draft vocabulary (`d2t`
int64 offsets, target = draft + d2t[draft]; `t2d` bool [V], as in the EAGLE-3 format).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jspec.drafters.heads import (CONFIG, WEIGHTS, HeadLoadError, fill, read_d2t, read_weights,
                                  write_head_files)
from jspec.drafters.mtp.module import MTPConfig, MTPModule
from models.config import LlamaConfig
from models.weights import IN_LAYER


_OWN = {"enorm.weight": ("enorm", "scale"), "hnorm.weight": ("hnorm", "scale"),
        "eh_proj.weight": ("eh_proj", "kernel"),
        "shared_head.norm.weight": ("head_norm", "scale")}
_DENSE = {name: ("block",) + path for name, path in IN_LAYER.items()
          if name.startswith(("self_attn.", "input_layernorm", "post_attention_layernorm",
                              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))}
NAMES = {**_OWN, **_DENSE}          # HF name (relative to the layer) -> path in MTPModule
SHARED = ("shared_head.head.weight", "embed_tokens.weight")   # the target's; never read


def to_tensors(module: MTPModule, *, prefix: str = "", dtype=jnp.bfloat16) -> dict[str, np.ndarray]:
  """The module's weights under HF names (`prefix` + name, [out, in]), cast to `dtype`."""
  flat = dict(nnx.to_flat_state(nnx.state(module, nnx.Param)))
  tensors = {}
  for name, path in NAMES.items():
    if path not in flat:            # no head_norm / biases / q_norm in this configuration
      continue
    x = jnp.asarray(flat[path][...]).astype(dtype)
    tensors[prefix + name] = np.asarray(x.T if path[-1] == "kernel" else x)
  return tensors


def _fill(cfg: MTPConfig, tensors: Mapping[str, np.ndarray], where: str, *, dtype,
          prefix: str = "", ids=None) -> MTPModule:
  """An MTPModule of `cfg` from HF-named tensors; every name the module needs must be there."""
  ids = jnp.arange(cfg.draft_vocab_size, dtype=jnp.int32) if ids is None else ids
  return fill(lambda: MTPModule(cfg, dtype=dtype), {path: prefix + name for name, path in
                                                    NAMES.items()}, tensors, where, dtype,
              {("draft_to_target",): jnp.asarray(ids, jnp.int32)})


def _config_dict(cfg: MTPConfig, num_draft: int, verifier: str) -> dict:
  return {
      "architectures": ["MTPModule"], "jspec_model_type": "mtp", "model_type": "llama",
      "hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
      "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
      "draft_vocab_size": cfg.draft_vocab_size, "rms_norm_eps": cfg.rms_eps,
      "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position,
      "attention_bias": cfg.qkv_bias, "qk_norm": cfg.qk_norm, "hidden_act": "silu",
      "num_nextn_predict_layers": 1, "shared_head_norm": cfg.own_head_norm,
      "num_speculative_tokens": num_draft, "verifier": verifier,
  }


def save_mtp(module: MTPModule, folder: str, *, dtype=jnp.bfloat16, num_draft: int = 3,
             verifier: str = "") -> dict[str, str]:
  """Writes config.json, model.safetensors (weights cast to `dtype`) and checksums.json; each file
  atomically. Returns {file: sha256}."""

  from jspec.io import check_writable

  os.makedirs(folder, exist_ok=True)
  check_writable(os.path.join(folder, WEIGHTS))
  cfg = module.config
  tensors = to_tensors(module, dtype=dtype)
  return write_head_files(folder, tensors, _config_dict(cfg, num_draft, verifier),
                          module.draft_to_target[...], cfg.vocab_size)


def read_config(folder: str) -> MTPConfig:
  path = os.path.join(folder, CONFIG)
  if not os.path.isdir(folder):
    raise HeadLoadError(f"MTP head folder {folder!r} does not exist")
  if not os.path.isfile(path):
    raise HeadLoadError(f"{path} is missing: an MTP head folder holds {CONFIG} and {WEIGHTS}")
  try:
    with open(path) as f:
      raw = json.load(f)
    if raw.get("jspec_model_type") != "mtp":
      raise HeadLoadError(f"{path}: jspec_model_type is {raw.get('jspec_model_type')!r}, not "
                          "'mtp' (for a model checkpoint with MTP layers use checkpoint=FOLDER)")
    heads = raw["num_attention_heads"]
    return MTPConfig(
        hidden_size=raw["hidden_size"], num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads", heads),
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        intermediate_size=raw["intermediate_size"], vocab_size=raw["vocab_size"],
        draft_vocab_size=raw.get("draft_vocab_size", raw["vocab_size"]),
        rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        max_position=int(raw.get("max_position_embeddings", 4096)),
        qkv_bias=bool(raw.get("attention_bias", False)), qk_norm=bool(raw.get("qk_norm", False)),
        own_head_norm=bool(raw.get("shared_head_norm", False)))
  except HeadLoadError:
    raise
  except (KeyError, TypeError, ValueError) as e:
    raise HeadLoadError(f"{path} is not a valid MTP head config: {e!r}") from None


def load_mtp(folder: str, *, dtype=jnp.float32, expected_sha256: str | None = None) -> MTPModule:
  """Reads a jspec MTP head folder; every check happens before any compilation."""
  cfg = read_config(folder)
  wpath, tensors = read_weights(folder, "an MTP head folder", expected_sha256)
  ids = read_d2t(tensors, wpath, cfg.draft_vocab_size, cfg.vocab_size)
  return _fill(cfg, tensors, wpath, dtype=dtype, ids=ids)


def load_checkpoint_mtp(folder: str, target: LlamaConfig, *, dtype=jnp.float32,
                        layer: int | None = None) -> MTPModule:
  """The MTP layer `model.layers.{L}.*` (default L = num_hidden_layers) of a Hugging Face
  safetensors checkpoint folder, for `target` (the checkpoint's main model); only that layer's
  tensors are read. Drafts over the full vocabulary."""
  from safetensors import safe_open

  if not os.path.isdir(folder):
    raise HeadLoadError(f"checkpoint folder {folder!r} does not exist")
  raw = {}
  if os.path.isfile(os.path.join(folder, CONFIG)):
    with open(os.path.join(folder, CONFIG)) as f:
      raw = json.load(f)
    if raw.get("num_nextn_predict_layers", 0) < 1:
      raise HeadLoadError(f"{folder}/{CONFIG} has num_nextn_predict_layers = "
                          f"{raw.get('num_nextn_predict_layers', 0)}: the checkpoint carries no "
                          "MTP layers; use a head trained with `jspec train mtp` (head=PATH)")
    if raw.get("num_hidden_layers", target.num_layers) != target.num_layers:
      raise HeadLoadError(f"{folder}/{CONFIG} has num_hidden_layers = {raw['num_hidden_layers']} "
                          f"but the target has {target.num_layers}: the checkpoint is for another "
                          "model; load that model as the target")
  layer = target.num_layers if layer is None else layer
  prefix = f"model.layers.{layer}."
  files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
  if not files:
    raise HeadLoadError(f"{folder!r} has no *.safetensors weights")
  tensors = {}
  for path in files:
    try:
      with safe_open(path, framework="numpy") as f:
        for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
          if name.startswith(prefix):
            tensors[name[len(prefix):]] = f.get_tensor(name)
    except Exception as e:   # safetensors raises its own error types for a malformed file
      raise HeadLoadError(f"cannot read {path!r} (corrupt or truncated?): {e}") from None
  if not tensors:
    raise HeadLoadError(f"{folder} has no tensors under {prefix!r}: no MTP layer at index "
                        f"{layer} (expected at num_hidden_layers = {target.num_layers})")
  unknown = sorted(n for n in tensors if n not in NAMES and n not in SHARED)
  if unknown:
    raise HeadLoadError(f"{folder}: MTP layer {layer} has weights jspec cannot read, e.g. "
                        f"{unknown[:3]} (jspec reads Llama-family dense MTP layers: no MoE or MLA)")
  for name in SHARED:
    if name in tensors and tuple(tensors[name].shape) != (target.vocab_size, target.hidden_size):
      raise HeadLoadError(f"{folder}: {prefix + name} has shape {tuple(tensors[name].shape)}, "
                          f"the target's is {(target.vocab_size, target.hidden_size)}: the "
                          "checkpoint is for another model")
  cfg = dataclasses.replace(MTPConfig.for_target(target),
                            own_head_norm="shared_head.norm.weight" in tensors)
  return _fill(cfg, {k: np.asarray(v, np.float32) for k, v in tensors.items()},
               f"{folder} (layer {layer})", dtype=dtype)

