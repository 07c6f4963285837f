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
from models.stored_layers import store_weights
from models.weight_formats import QuantTensor

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
IN_LAYER = {
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
# MoE layers (Qwen3-MoE / Qwen2-MoE under "mlp.", Mixtral under "block_sparse_moe."): the router and
# the shared expert map like linear weights; per-expert weights are stacked along a leading E axis.
IN_LAYER.update({
    "mlp.gate.weight": ("mlp", "router"),
    "block_sparse_moe.gate.weight": ("mlp", "router"),
    "mlp.shared_expert.gate_proj.weight": ("mlp", "shared_gate_proj", "kernel"),
    "mlp.shared_expert.up_proj.weight": ("mlp", "shared_up_proj", "kernel"),
    "mlp.shared_expert.down_proj.weight": ("mlp", "shared_down_proj", "kernel"),
    "mlp.shared_expert_gate.weight": ("mlp", "shared_expert_gate", "kernel"),
})
_EXPERT = re.compile(r"(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight")
_EXPERT_WEIGHT = {"gate_proj": "w_gate", "w1": "w_gate", "up_proj": "w_up", "w3": "w_up",
                  "down_proj": "w_down", "w2": "w_down"}
_TRANSPOSED = ("kernel", "router")   # HF stores [out, in]; jspec [in, out]
_TOP = {
    "model.embed_tokens.weight": ("embed", "embedding"),
    "model.norm.weight": ("norm", "scale"),
    "lm_head.weight": ("lm_head", "kernel"),
}


def _path(name: str) -> tuple | None:
  if name in _TOP:
    return _TOP[name]
  m = _LAYER.fullmatch(name)
  if m and m.group(2) in IN_LAYER:
    return ("layers", int(m.group(1))) + IN_LAYER[m.group(2)]
  if m and m.group(2) in ("moe.w_gate", "moe.w_up", "moe.w_down"):   # from `stack_experts`
    return ("layers", int(m.group(1)), "mlp", m.group(2)[4:])
  return None


def stack_experts(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Per-expert HF weights (`...experts.{e}.{gate_proj|up_proj|down_proj|w1|w3|w2}.weight`, [out,
  in] each) and fused ones (`mlp.experts.gate_up_proj` [E, 2F, H], `mlp.experts.down_proj` [E, H,
  F]) -> `model.layers.{i}.moe.{w_gate|w_up|w_down}` in jspec's layout ([E, H, F] / [E, F, H]);
  every other tensor passes through."""
  out, experts = {}, {}
  for name, array in tensors.items():
    m = _LAYER.fullmatch(name)
    rest = m.group(2) if m else ""
    e = _EXPERT.fullmatch(rest)
    if e and e.group(2) in _EXPERT_WEIGHT:
      key = (int(m.group(1)), _EXPERT_WEIGHT[e.group(2)])
      experts.setdefault(key, {})[int(e.group(1))] = np.asarray(array).T
    elif rest == "mlp.experts.gate_up_proj":
      gate, up = np.split(np.asarray(array), 2, axis=1)                    # [E, F, H] each
      out[f"model.layers.{m.group(1)}.moe.w_gate"] = gate.transpose(0, 2, 1)
      out[f"model.layers.{m.group(1)}.moe.w_up"] = up.transpose(0, 2, 1)
    elif rest == "mlp.experts.down_proj":
      out[f"model.layers.{m.group(1)}.moe.w_down"] = np.asarray(array).transpose(0, 2, 1)
    else:
      out[name] = array
  for (layer, weight), by_expert in experts.items():
    if sorted(by_expert) != list(range(len(by_expert))):
      raise ModelLoadError(f"layer {layer} {weight}: experts {sorted(by_expert)} are not 0..E-1 "
                           "(a missing shard?)")
    out[f"model.layers.{layer}.moe.{weight}"] = np.stack([by_expert[i]
                                                          for i in range(len(by_expert))])
  return out


def llama_from_hf_tensors(cfg: LlamaConfig, tensors: Mapping[str, np.ndarray | QuantTensor],
                          dtype=jnp.float32, *, weight_format: str | None = None,
                          **model_kwargs) -> Llama:
  """tensors: HF parameter name -> array in HF layout ([out, in] for linear weights), or a
  `QuantTensor` (a dense weight kept in its stored format); MoE experts per expert or fused
  (`stack_experts`). weight_format: quantise the other dense weights to it
  (`models.stored_layers.store_weights`). model_kwargs: `Llama` options (attention_impl, ...)."""
  abstract = nnx.eval_shape(lambda: Llama(cfg, dtype=dtype, **model_kwargs))
  graphdef, state = nnx.split(abstract)
  wanted = {path: var for path, var in nnx.to_flat_state(state)}
  filled, stored = {}, {}
  mtp_layers = range(cfg.num_layers, cfg.num_layers + cfg.num_nextn_predict_layers)
  for name, array in stack_experts(tensors).items():
    m = _LAYER.fullmatch(name)
    if m and int(m.group(1)) in mtp_layers:
      continue   # an MTP layer: a drafter (jspec.drafters.mtp), not part of the target
    path = _path(name)
    if path is None:
      if name.endswith("rotary_emb.inv_freq"):
        continue
      raise ModelLoadError(f"unexpected weight {name!r} for a {cfg.arch} model")
    if path not in wanted:
      if path == ("lm_head", "kernel") and cfg.tie_embeddings:
        continue  # some tied checkpoints also store the head
      raise ModelLoadError(f"weight {name!r} does not fit the config (arch {cfg.arch})")
    if isinstance(array, QuantTensor):
      expected = wanted[path].shape
      if tuple(array.shape) != (tuple(expected)[::-1] if path[-1] in _TRANSPOSED
                                else tuple(expected)):
        raise ModelLoadError(f"weight {name!r} has shape {array.shape}, the config expects "
                             f"{tuple(expected)}")
      stored[path] = array
      filled[path] = jnp.zeros((0,), dtype)    # the layer is swapped for a stored one below
      continue
    array = np.asarray(array)
    if path[-1] in _TRANSPOSED:
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
  model = nnx.merge(graphdef, nnx.from_flat_state(list(wanted.items())))
  if stored or weight_format not in (None, "f32"):
    if jnp.dtype(dtype) != jnp.float32:
      raise ModelLoadError(f"weights in a stored format compute in float32; load with dtype "
                           f"float32, not {jnp.dtype(dtype).name}")
    store_weights(model, stored,
                  None if weight_format in (None, "f32") else weight_format)
  return model
