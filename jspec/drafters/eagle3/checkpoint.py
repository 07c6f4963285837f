"""EAGLE-3 heads in the speculators / vLLM checkpoint format (config.json + model.safetensors), so
heads trained here load in vLLM and heads trained elsewhere draft here.

Weights use torch's [out, in] layout and HF names (`fc.weight`, `layers.0.self_attn.q_proj.weight`,
..., `lm_head.weight`, `d2t` int64 offsets with target = draft + d2t[draft], `t2d` bool [V]); the
target's embedding, final norm and head are never saved. A head drafting with the target's LM-head
rows (config `"jspec_lm_head": "target"`, a jspec extension other readers do not know) has no
`lm_head.weight`; the rows are taken from the target when the drafter is built. `checksums.json`
(sha256 per file) is verified on load when present (jspec/drafters/heads.py).
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np

from jspec.drafters.eagle3.module import Eagle3Config, Eagle3Head
from jspec.drafters.shared import LM_HEADS
from jspec.drafters.heads import (CONFIG, WEIGHTS, HeadLoadError, fill, read_d2t, read_weights,
                                  write_head_files)
from jspec.io import check_writable

LM_HEAD_KEY = "jspec_lm_head"   # "target": the head drafts with the target's LM-head rows (unsaved)

_LINEAR = {   # HF name -> path in Eagle3Head (a [out, in] weight, stored [in, out] by nnx)
    "fc.weight": ("fc", "kernel"),
    "layers.0.self_attn.q_proj.weight": ("q_proj", "kernel"),
    "layers.0.self_attn.k_proj.weight": ("k_proj", "kernel"),
    "layers.0.self_attn.v_proj.weight": ("v_proj", "kernel"),
    "layers.0.self_attn.o_proj.weight": ("o_proj", "kernel"),
    "layers.0.mlp.gate_proj.weight": ("mlp", "gate_proj", "kernel"),
    "layers.0.mlp.up_proj.weight": ("mlp", "up_proj", "kernel"),
    "layers.0.mlp.down_proj.weight": ("mlp", "down_proj", "kernel"),
    "lm_head.weight": ("lm_head", "kernel"),
}
_NORM = {
    "layers.0.input_layernorm.weight": ("input_layernorm", "scale"),
    "layers.0.hidden_norm.weight": ("hidden_norm", "scale"),
    "layers.0.post_attention_layernorm.weight": ("post_attention_layernorm", "scale"),
    "norm.weight": ("norm", "scale"),
}


def _config_dict(cfg: Eagle3Config, num_draft: int, verifier: str) -> dict:
  shared = {LM_HEAD_KEY: cfg.lm_head} if cfg.lm_head != "own" else {}
  return shared | {
      "speculators_model_type": "eagle3",
      "architectures": ["Eagle3Speculator"],
      "speculators_version": "jspec-0.1",
      "transformer_layer_config": {
          "model_type": "llama", "architectures": ["LlamaForCausalLM"],
          "hidden_size": cfg.hidden_size, "num_hidden_layers": 1,
          "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
          "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size,
          "vocab_size": cfg.vocab_size, "rms_norm_eps": cfg.rms_eps,
          "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position,
          "hidden_act": "silu", "tie_word_embeddings": False},
      "draft_vocab_size": cfg.draft_vocab_size,
      "norm_before_residual": False, "norm_before_fc": False, "fc_norm": False,
      "norm_output": False,
      "target_hidden_size": cfg.hidden_size,
      "eagle_aux_hidden_state_layer_ids": list(cfg.taps),
      "embed_requires_grad": False,
      "speculators_config": {
          "algorithm": "eagle3",
          "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": num_draft,
                                "verifier_accept_k": 1, "accept_tolerance": 0.0}],
          "default_proposal_method": "greedy",
          "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]}},
  }


def _tensor_names(cfg: Eagle3Config) -> list[tuple[str, tuple[str, ...]]]:
  """(HF name, head path) of every saved tensor: lm_head.weight only for a head's own LM head."""
  return [(name, path) for name, path in list(_LINEAR.items()) + list(_NORM.items())
          if name != "lm_head.weight" or cfg.lm_head == "own"]


def _get(tree, path):
  for p in path:
    tree = getattr(tree, p)
  return tree


def save_eagle3(head: Eagle3Head, folder: str, *, dtype=jnp.bfloat16, num_draft: int = 3,
                verifier: str = "") -> dict[str, str]:
  """Writes config.json, model.safetensors (weights cast to `dtype`) and checksums.json; each file
  atomically. Returns {file: sha256}."""

  os.makedirs(folder, exist_ok=True)
  check_writable(os.path.join(folder, WEIGHTS))
  cfg = head.config
  np_dtype = np.dtype(jnp.dtype(dtype).name) if jnp.dtype(dtype) != jnp.bfloat16 else None
  tensors = {}
  for name, path in _tensor_names(cfg):
    x = jnp.asarray(_get(head, path)[...]).astype(dtype)
    x = x.T if name in _LINEAR else x
    tensors[name] = _to_numpy(x, np_dtype)
  return write_head_files(folder, tensors, _config_dict(cfg, num_draft, verifier), head.draft_to_target[...],
                          cfg.vocab_size)


def _to_numpy(x, np_dtype):
  if np_dtype is not None:
    return np.asarray(x, np_dtype)
  # safetensors.numpy stores bfloat16 from ml_dtypes' numpy type
  return np.asarray(x)


def _lm_head(raw: dict, path: str) -> str:
  kind = raw.get(LM_HEAD_KEY, "own")
  if kind not in LM_HEADS:
    raise HeadLoadError(f"{path}: {LM_HEAD_KEY} is {kind!r}; jspec reads {LM_HEADS}")
  return kind


def read_config(folder: str) -> Eagle3Config:
  path = os.path.join(folder, CONFIG)
  if not os.path.isdir(folder):
    raise HeadLoadError(f"EAGLE-3 head folder {folder!r} does not exist")
  if not os.path.isfile(path):
    raise HeadLoadError(f"{path} is missing: an EAGLE-3 head folder holds {CONFIG} and {WEIGHTS} "
                        "(speculators format)")
  try:
    with open(path) as f:
      raw = json.load(f)
    if raw.get("speculators_model_type") != "eagle3":
      raise HeadLoadError(f"{path}: speculators_model_type is "
                          f"{raw.get('speculators_model_type')!r}, not 'eagle3'")
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
      if raw.get(flag):
        raise HeadLoadError(f"{path}: {flag}=true is not supported by jspec's EAGLE-3 head")
    if raw.get("norm_before_residual", True) and "norm_before_residual" in raw:
      raise HeadLoadError(f"{path}: norm_before_residual=true is not supported by jspec's head")
    layer = raw["transformer_layer_config"]
    heads = layer["num_attention_heads"]
    return Eagle3Config(
        hidden_size=layer["hidden_size"], num_heads=heads,
        num_kv_heads=layer.get("num_key_value_heads", heads),
        head_dim=layer.get("head_dim") or layer["hidden_size"] // heads,
        intermediate_size=layer["intermediate_size"], vocab_size=layer["vocab_size"],
        draft_vocab_size=raw["draft_vocab_size"],
        taps=tuple(raw["eagle_aux_hidden_state_layer_ids"]),
        rms_eps=float(layer.get("rms_norm_eps", 1e-6)),
        rope_theta=float(layer.get("rope_theta", 10000.0)),
        max_position=int(layer.get("max_position_embeddings", 4096)),
        lm_head=_lm_head(raw, path))
  except HeadLoadError:
    raise
  except (KeyError, TypeError, ValueError) as e:
    raise HeadLoadError(f"{path} is not a valid EAGLE-3 speculators config: {e!r}") from None


def load_eagle3(folder: str, *, dtype=jnp.float32, expected_sha256: str | None = None) -> Eagle3Head:
  """Reads a speculators-format EAGLE-3 head; every check happens before any compilation. A head
  with `lm_head="target"` drafts only once its rows are attached (Eagle3Drafter.from_head)."""
  cfg = read_config(folder)
  wpath, tensors = read_weights(folder, "an EAGLE-3 head folder", expected_sha256)
  ids = read_d2t(tensors, wpath, cfg.draft_vocab_size, cfg.vocab_size)
  fixed = {("draft_to_target",): jnp.asarray(ids, jnp.int32)}
  if cfg.lm_head == "target":   # filled from the target by Eagle3Drafter.from_head
    fixed[("lm_head", "rows")] = jnp.zeros((cfg.draft_vocab_size, cfg.hidden_size), dtype)
  return fill(lambda: Eagle3Head(cfg, dtype=dtype), {path: name for name, path in
                                                     _tensor_names(cfg)}, tensors, wpath, dtype,
              fixed)
