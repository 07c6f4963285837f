"""Builds a `Llama` from Hugging Face-named weight arrays (the common target of every loader)."""

from __future__ import annotations

import re
from typing import Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.config import LlamaConfig
from models.errors import ModelLoadError
from models.llama import Llama

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_IN_LAYER = {
    "self_attn.q_proj.weight": ("attn", "q_proj", "kernel"),
    "self_attn.k_proj.weight": ("attn", "k_proj", "kernel"),
    "self_attn.v_proj.weight": ("attn", "v_proj", "kernel"),
    "self_attn.o_proj.weight": ("attn", "o_proj", "kernel"),
    "self_attn.q_proj.bias": ("attn", "q_proj", "bias"),
    "self_attn.k_proj.bias": ("attn", "k_proj", "bias"),
    "self_attn.v_proj.bias": ("attn", "v_proj", "bias"),
    "self_attn.q_norm.weight": ("attn", "q_norm", "scale"),
    "self_attn.k_norm.weight": ("attn", "k_norm", "scale"),
    "mlp.gate_proj.weight": ("mlp", "gate_proj", "kernel"),
    "mlp.up_proj.weight": ("mlp", "up_proj", "kernel"),
    "mlp.down_proj.weight": ("mlp", "down_proj", "kernel"),
    "input_layernorm.weight": ("input_norm", "scale"),
    "post_attention_layernorm.weight": ("post_attn_norm", "scale"),
}
_TOP = {
    "model.embed_tokens.weight": ("embed", "embedding"),
    "model.norm.weight": ("norm", "scale"),
    "lm_head.weight": ("lm_head", "kernel"),
}


def _path(name: str) -> tuple | None:
  if name in _TOP:
    return _TOP[name]
  m = _LAYER.fullmatch(name)
  if m and m.group(2) in _IN_LAYER:
    return ("layers", int(m.group(1))) + _IN_LAYER[m.group(2)]
  return None


def llama_from_hf_tensors(cfg: LlamaConfig, tensors: Mapping[str, np.ndarray],
                          dtype=jnp.float32) -> Llama:
  """tensors: HF parameter name -> array in HF layout ([out, in] for linear weights)."""
  abstract = nnx.eval_shape(lambda: Llama(cfg, dtype=dtype))
  graphdef, state = nnx.split(abstract)
  wanted = {path: var for path, var in nnx.to_flat_state(state)}
  filled = {}
  for name, array in tensors.items():
    path = _path(name)
    if path is None:
      if name.endswith("rotary_emb.inv_freq"):
        continue
      raise ModelLoadError(f"unexpected weight {name!r} for a {cfg.arch} model")
    if path not in wanted:
      if path == ("lm_head", "kernel") and cfg.tie_embeddings:
        continue  # some tied checkpoints also store the head
      raise ModelLoadError(f"weight {name!r} does not fit the config (arch {cfg.arch})")
    array = np.asarray(array)
    if path[-1] == "kernel":
      array = array.T
    expected = wanted[path].shape
    if array.shape != tuple(expected):
      raise ModelLoadError(f"weight {name!r} has shape {array.shape}, the config expects {expected}")
    filled[path] = jnp.asarray(array, dtype=dtype)
  missing = sorted(".".join(map(str, p)) for p in wanted if p not in filled)
  if missing:
    raise ModelLoadError(f"checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")
  for path, var in wanted.items():
    var.set_value(filled[path])
  return nnx.merge(graphdef, nnx.from_flat_state(list(wanted.items())))
