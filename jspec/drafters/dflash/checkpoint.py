"""DFlash and DSpark head folders in the speculators layout (config.json + model.safetensors +
checksums.json).

config.json follows speculators' `DFlashSpeculatorConfig` keys (`speculators_model_type` "dflash"
or "dspark", `block_size`, `draft_vocab_size`, `target_hidden_size`, `aux_hidden_state_layer_ids` in
the HF convention: the *output* of layer i, i.e. jspec tap i+1, `mask_token_id`,
`sample_from_anchor`, `transformer_layer_config`), with DSpark's `markov_rank`,
`markov_head_type` and `confidence_head`. Weights use HF names in torch's [out, in] layout (`fc`,
`hidden_norm`, `layers.{i}.self_attn.q_proj`, ..., `norm`, `markov_head.W1` / `W2` / `gate`,
`confidence_head`) and the draft-vocabulary maps `d2t` / `t2d`; the target's embedding and LM head
are never saved.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jspec.drafters import heads
from jspec.drafters.dflash.module import DFlashConfig, DFlashModule
from jspec.drafters.heads import (CONFIG, WEIGHTS, HeadLoadError, fill, read_d2t, read_weights,
                                  write_head_files)
from jspec.io import check_writable

_RENAME = {"input_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
           "attn": "self_attn", "markov_embed": "markov_head.W1", "markov_proj": "markov_head.W2",
           "markov_gate": "markov_head.gate"}
_LEAF = {"kernel": "weight", "scale": "weight", "embedding": "weight", "bias": "bias"}


# The module class of each kind (DSpark's registers itself: jspec/drafters/dspark/__init__.py).
_MODULES: dict[str, type] = {"dflash": DFlashModule}


def register_module(kind: str, cls: type) -> None:
  """Makes `load(folder, kind)` build `cls` for heads whose speculators_model_type is `kind`."""
  _MODULES[kind] = cls


def hf_name(path: tuple) -> str:
  """An nnx parameter path of a DFlash / DSpark module -> its HF tensor name."""
  parts = [p for p in path if p != "backbone"]
  return ".".join([_RENAME.get(str(p), str(p)) for p in parts[:-1]] + [_LEAF[parts[-1]]])


def load_for_target(folder: str | None, target, kind: str):
  """The head in `folder` (default: the one shipped for the target) in the target's dtype."""
  sha = None
  if folder is None:
    folder, sha = heads.shipped_head(kind, target.config)
  dtype = target.activation_dtype
  return load(folder, kind, dtype=dtype, expected_sha256=sha)


def _config_dict(cfg: DFlashConfig, kind: str, verifier: str) -> dict:
  raw = {
      "speculators_model_type": kind,
      "architectures": ["DSparkSpeculator" if kind == "dspark" else "DFlashSpeculator"],
      "speculators_version": "jspec-0.1",
      "transformer_layer_config": {
          "model_type": "llama", "architectures": ["LlamaForCausalLM"],
          "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
          "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
          "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size,
          "vocab_size": cfg.vocab_size, "rms_norm_eps": cfg.rms_eps,
          "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position,
          "hidden_act": "silu", "tie_word_embeddings": False,
          **({"layer_types": ["sliding_attention"] * cfg.num_layers,
              "sliding_window": cfg.sliding_window} if cfg.sliding_window else {})},
      "block_size": cfg.block_size,
      "draft_vocab_size": cfg.draft_vocab_size,
      "target_hidden_size": cfg.hidden_size,
      "aux_hidden_state_layer_ids": [t - 1 for t in cfg.taps],
      "mask_token_id": cfg.mask_token_id,
      "sample_from_anchor": cfg.sample_from_anchor,
      "sliding_window_non_causal": bool(cfg.sliding_window),   # the block stays bidirectional
      "speculators_config": {
          "algorithm": kind,
          "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.max_draft}],
          "default_proposal_method": "greedy",
          "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]}},
  }
  if kind == "dspark":
    raw.update(markov_rank=cfg.markov_rank,
               markov_head_type="gated" if cfg.markov_gated else "vanilla",
               confidence_head=cfg.confidence)
  return raw


def save(module, folder: str, *, dtype=jnp.bfloat16, verifier: str = "") -> dict[str, str]:
  """Writes a DFlash or DSpark head folder (weights cast to `dtype`); returns {file: sha256}."""
  os.makedirs(folder, exist_ok=True)
  check_writable(os.path.join(folder, WEIGHTS))
  cfg = module.config
  kind = "dspark" if cfg.sample_from_anchor else "dflash"
  tensors = {}
  for path, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
    x = np.asarray(jnp.asarray(var[...]).astype(dtype))
    tensors[hf_name(path)] = np.ascontiguousarray(x.T if path[-1] == "kernel" else x)
  ids = (module.backbone if kind == "dspark" else module).draft_to_target[...]
  return write_head_files(folder, tensors, _config_dict(cfg, kind, verifier), ids, cfg.vocab_size)


def read_config(folder: str, kind: str) -> DFlashConfig:
  path = os.path.join(folder, CONFIG)
  if not os.path.isdir(folder):
    raise HeadLoadError(f"{kind} head folder {folder!r} does not exist")
  if not os.path.isfile(path):
    raise HeadLoadError(f"{path} is missing: a {kind} head folder holds {CONFIG} and {WEIGHTS}")
  try:
    with open(path) as f:
      raw = json.load(f)
    if raw.get("speculators_model_type") != kind:
      raise HeadLoadError(f"{path}: speculators_model_type is "
                          f"{raw.get('speculators_model_type')!r}, not {kind!r}")
    layer = raw["transformer_layer_config"]
    kinds = set(layer.get("layer_types") or ["full_attention"])
    causal_swa = "sliding_attention" in kinds and not raw.get("sliding_window_non_causal")
    if causal_swa or len(kinds) > 1 or kinds - {"full_attention", "sliding_attention"}:
      raise HeadLoadError(f"{path}: only all-full or all-sliding non-causal draft layers are "
                          f"supported by jspec, got layer_types {sorted(kinds)}")
    window = int(layer.get("sliding_window") or 0) if "sliding_attention" in kinds else 0
    heads = layer["num_attention_heads"]
    markov = raw.get("markov_head_type", "vanilla")
    if markov not in ("vanilla", "gated"):
      raise HeadLoadError(f"{path}: markov_head_type {markov!r} is not supported (vanilla, gated)")
    return DFlashConfig(
        hidden_size=layer["hidden_size"], num_heads=heads,
        num_kv_heads=layer.get("num_key_value_heads", heads),
        head_dim=layer.get("head_dim") or layer["hidden_size"] // heads,
        intermediate_size=layer["intermediate_size"], vocab_size=layer["vocab_size"],
        draft_vocab_size=raw.get("draft_vocab_size") or layer["vocab_size"],
        taps=tuple(int(i) + 1 for i in raw["aux_hidden_state_layer_ids"]),
        mask_token_id=int(raw["mask_token_id"]), num_layers=layer["num_hidden_layers"],
        block_size=int(raw["block_size"]),
        sample_from_anchor=bool(raw.get("sample_from_anchor", kind == "dspark")),
        markov_rank=int(raw.get("markov_rank", 0)) if kind == "dspark" else 0,
        markov_gated=markov == "gated", confidence=bool(raw.get("confidence_head", False)),
        sliding_window=window,
        rms_eps=float(layer.get("rms_norm_eps", 1e-6)),
        rope_theta=float(layer.get("rope_theta", 10000.0)),
        max_position=int(layer.get("max_position_embeddings", 4096)))
  except HeadLoadError:
    raise
  except (KeyError, TypeError, ValueError) as e:
    raise HeadLoadError(f"{path} is not a valid {kind} head config: {e!r}") from None


def load(folder: str, kind: str, *, dtype=jnp.float32, expected_sha256: str | None = None):
  """Reads a DFlash (kind "dflash") or DSpark ("dspark") head folder; every check happens before
  any compilation."""
  cfg = read_config(folder, kind)
  wpath, tensors = read_weights(folder, f"a {kind} head folder", expected_sha256)
  ids = jnp.asarray(read_d2t(tensors, wpath, cfg.draft_vocab_size, cfg.vocab_size), jnp.int32)
  make = lambda: _MODULES[kind](cfg, dtype=dtype)
  paths = [path for path, _ in nnx.to_flat_state(nnx.state(nnx.eval_shape(make)))]
  return fill(make, {p: hf_name(p) for p in paths if p[-1] != "draft_to_target"}, tensors, wpath,
              dtype, {p: ids for p in paths if p[-1] == "draft_to_target"})
