"""GGUF checkpoints (llama.cpp format): config, dequantised weights and tokenizer metadata."""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from models.config import LlamaConfig
from models.errors import ModelLoadError, UnsupportedModelError

_SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
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
  return LlamaConfig(
      vocab_size=vocab, hidden_size=hidden, intermediate_size=int(g("feed_forward_length")),
      num_layers=int(g("block_count")), num_heads=heads,
      num_kv_heads=int(g("attention.head_count_kv", heads)), head_dim=head_dim,
      rope_theta=float(g("rope.freq_base", 10000.0)),
      rms_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
      tie_embeddings=False,  # decided by whether an `output` tensor exists, see load_gguf
      qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3",
      max_position=int(g("context_length", 4096)), arch=arch)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undo llama.cpp's Q/K row permutation (interleaved RoPE -> rotate-half), rows are [out, ...]."""
  rows = w.shape[0]
  return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def load_gguf(path: str) -> tuple[LlamaConfig, dict[str, np.ndarray], dict[str, Any]]:
  """Returns (config, HF-named fp32 tensors, metadata)."""
  import dataclasses
  from gguf import quants

  reader = open_gguf(path)
  meta = metadata(reader)
  cfg = config_from_metadata(meta)
  tensors = {}
  for t in reader.tensors:
    try:
      w = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
    except NotImplementedError as e:
      raise UnsupportedModelError(f"GGUF tensor {t.name} uses unsupported type "
                                  f"{t.tensor_type.name}") from e
    except (ValueError, IndexError) as e:
      raise ModelLoadError(f"tensor {t.name} of {path!r} is corrupt or truncated: {e}") from e
    m = _BLOCK.fullmatch(t.name)
    if m:
      layer, kind, suffix = m.groups()
      if kind not in _LAYER_NAMES:
        raise UnsupportedModelError(f"unexpected GGUF tensor {t.name}")
      if cfg.arch == "llama" and kind in ("attn_q", "attn_k"):
        w = _unpermute(w, cfg.num_heads if kind == "attn_q" else cfg.num_kv_heads)
      name = f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{suffix}"
    else:
      base, _, suffix = t.name.rpartition(".")
      if base not in _TOP_NAMES:
        if base == "rope_freqs":
          raise UnsupportedModelError("GGUF with rope_freqs (scaled RoPE) is not supported")
        raise UnsupportedModelError(f"unexpected GGUF tensor {t.name}")
      name = f"{_TOP_NAMES[base]}.{suffix}"
    tensors[name] = w
  cfg = dataclasses.replace(cfg, tie_embeddings="lm_head.weight" not in tensors)
  return cfg, tensors, meta
