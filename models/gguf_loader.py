"""GGUF checkpoints (llama.cpp format): config, dequantised weights and tokenizer metadata."""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from models.config import LlamaConfig
from models.errors import ModelLoadError, UnsupportedModelError
from models.weight_formats import GGUF_TYPES, QuantTensor, from_gguf, permute_rows

_SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "qwen2moe")
_ARCH = {"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe"}   # GGUF -> jspec arch names
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    # mixture of experts (llama.cpp names): the router, the shared expert and its gate
    "ffn_gate_inp": "mlp.gate", "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj", "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# Stacked experts [E, out, in] -> jspec's [E, in, out] (`models.weights` takes these as they are).
_EXPERT_NAMES = {"ffn_gate_exps": "w_gate", "ffn_up_exps": "w_up", "ffn_down_exps": "w_down"}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def open_gguf(path: str):
  import gguf
  if not os.path.isfile(path):
    raise ModelLoadError(f"no GGUF file at {path!r}")
  try:
    return gguf.GGUFReader(path)
  except Exception as e:  # the gguf package raises assorted errors on corrupt input
    size = os.path.getsize(path)
    raise ModelLoadError(
        f"{path!r} ({size} bytes) is not a readable GGUF file (corrupt or truncated?): {e}. "
        "Delete it and fetch the model again.") from e


def metadata(reader) -> dict[str, Any]:
  out = {}
  for key, field in reader.fields.items():
    if key.startswith("GGUF."):
      continue
    try:
      out[key] = field.contents()
    except Exception:  # fields gguf cannot decode are not needed here
      continue
  return out


def config_from_metadata(meta: dict[str, Any]) -> LlamaConfig:
  arch = meta.get("general.architecture")
  if arch not in _SUPPORTED_ARCHS:
    raise UnsupportedModelError(
        f"GGUF architecture {arch!r} is not supported; jspec loads {list(_SUPPORTED_ARCHS)}")
  g = lambda k, default=None: meta.get(f"{arch}.{k}", default)
  hidden = int(g("embedding_length"))
  heads = int(g("attention.head_count"))
  head_dim = int(g("attention.key_length", hidden // heads))
  vocab = int(g("vocab_size", len(meta.get("tokenizer.ggml.tokens", []))))
  moe = {}
  if g("expert_count"):   # Qwen3-MoE / Qwen2-MoE, and Mixtral (arch "llama" with experts)
    # llama.cpp renormalises the top-k weights for these, except Qwen2-MoE (norm_w = false)
    moe = dict(num_experts=int(g("expert_count")), num_experts_per_tok=int(g("expert_used_count")),
               moe_intermediate_size=int(g("expert_feed_forward_length",
                                           g("feed_forward_length", 0))),
               norm_topk_prob=bool(g("expert_weights_norm", arch != "qwen2moe")),
               shared_expert_intermediate_size=int(g("expert_shared_feed_forward_length", 0)))
  ffn = g("feed_forward_length", moe.get("moe_intermediate_size"))
  return LlamaConfig(
      vocab_size=vocab, hidden_size=hidden, intermediate_size=int(ffn),
      num_layers=int(g("block_count")), num_heads=heads,
      num_kv_heads=int(g("attention.head_count_kv", heads)), head_dim=head_dim,
      rope_theta=float(g("rope.freq_base", 10000.0)),
      rms_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
      tie_embeddings=False,  # decided by whether an `output` tensor exists, see load_gguf
      qkv_bias=arch in ("qwen2", "qwen2moe"), qk_norm=arch in ("qwen3", "qwen3moe"),
      max_position=int(g("context_length", 4096)),
      arch=("mixtral" if moe and arch == "llama" else _ARCH.get(arch, arch)), **moe)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undo llama.cpp's Q/K row permutation (interleaved RoPE -> rotate-half), rows are [out, ...]."""
  rows = w.shape[0]
  return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def _put(tensors: dict, gguf_name: str, m, w) -> None:
  """Stores w under its Hugging Face name."""
  if m:
    layer, kind, suffix = m.groups()
    if kind not in _LAYER_NAMES:
      raise UnsupportedModelError(f"unexpected GGUF tensor {gguf_name}")
    tensors[f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{suffix}"] = w
    return
  base, _, suffix = gguf_name.rpartition(".")
  if base not in _TOP_NAMES:
    if base == "rope_freqs":
      raise UnsupportedModelError("GGUF with rope_freqs (scaled RoPE) is not supported")
    raise UnsupportedModelError(f"unexpected GGUF tensor {gguf_name}")
  tensors[f"{_TOP_NAMES[base]}.{suffix}"] = w


_DENSE = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
          "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"}   # linear layers a format can hold


def load_gguf(path: str, *, keep_stored: bool = False, strict: bool = False
              ) -> tuple[LlamaConfig, dict[str, np.ndarray | QuantTensor], dict[str, Any]]:
  """Returns (config, HF-named tensors, metadata): fp32 arrays, except with keep_stored the dense
  linear weights, embedding and LM head in Q8_0 / Q4_0 / Q4_1 / BF16, which come as
  `QuantTensor`s of the file's own bytes (`models.weight_formats`). Norms, routers and MoE experts
  are dequantised; so are dense weights in other formats, unless strict, which refuses them."""
  import dataclasses
  from gguf import quants

  reader = open_gguf(path)
  meta = metadata(reader)
  cfg = config_from_metadata(meta)
  tensors = {}
  for t in reader.tensors:
    m = _BLOCK.fullmatch(t.name)
    dense = (m.group(2) in _DENSE) if m else t.name in ("token_embd.weight", "output.weight")
    stored = GGUF_TYPES.get(t.tensor_type.name) if keep_stored and dense else None
    if keep_stored and strict and dense and not stored and t.tensor_type.name != "F32":
      raise UnsupportedModelError(
          f"GGUF tensor {t.name} is {t.tensor_type.name}; weights kept as stored can be "
          f"{', '.join(GGUF_TYPES)} (or F32). Load this file with --weights f32 (dequantised), "
          "bf16 or int8")
    if stored:
      k, n = (int(x) for x in t.shape)          # GGUF lists dims innermost first
      w = from_gguf(np.asarray(t.data), stored, n, k)
      if m and cfg.arch in ("llama", "mixtral") and m.group(2) in ("attn_q", "attn_k"):
        heads = cfg.num_heads if m.group(2) == "attn_q" else cfg.num_kv_heads
        w = permute_rows(w, _unpermute(np.arange(n), heads))
      _put(tensors, t.name, m, w)
      continue
    try:
      w = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
    except NotImplementedError as e:
      raise UnsupportedModelError(f"GGUF tensor {t.name} uses unsupported type "
                                  f"{t.tensor_type.name}") from e
    except (ValueError, IndexError) as e:
      raise ModelLoadError(f"tensor {t.name} of {path!r} is corrupt or truncated: {e}") from e
    if m and m.group(2) in _EXPERT_NAMES:
      tensors[f"model.layers.{m.group(1)}.moe.{_EXPERT_NAMES[m.group(2)]}"] = w.transpose(0, 2, 1)
      continue
    if m and cfg.arch in ("llama", "mixtral") and m.group(2) in ("attn_q", "attn_k"):
      w = _unpermute(w, cfg.num_heads if m.group(2) == "attn_q" else cfg.num_kv_heads)
    _put(tensors, t.name, m, w)
  cfg = dataclasses.replace(cfg, tie_embeddings="lm_head.weight" not in tensors)
  if cfg.num_experts:   # layers without a router are dense
    dense = tuple(i for i in range(cfg.num_layers)
                  if f"model.layers.{i}.mlp.gate.weight" not in tensors)
    cfg = dataclasses.replace(cfg, mlp_only_layers=dense)
  return cfg, tensors, meta
