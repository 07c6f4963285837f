"""Llama-family model configuration: one frozen dataclass covering Llama, SmolLM2, Qwen2, Qwen3 and
their mixture-of-experts variants (Qwen3-MoE, Qwen2-MoE, Mixtral)."""

from __future__ import annotations

import dataclasses
from typing import Any

from models.errors import UnsupportedModelError


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  rms_eps: float = 1e-5
  tie_embeddings: bool = False
  qkv_bias: bool = False   # Qwen2
  qk_norm: bool = False    # Qwen3: RMSNorm over head_dim on q and k before RoPE
  max_position: int = 4096
  arch: str = "llama"
  # Mixture of experts (num_experts = 0: dense). Router: softmax over all experts, top-k, then the
  # k weights renormalised to sum 1 when norm_topk_prob (Mixtral always; Qwen per checkpoint).
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = True
  shared_expert_intermediate_size: int = 0   # Qwen2-MoE: a dense SwiGLU expert with a sigmoid gate
  decoder_sparse_step: int = 1               # layer i is sparse when (i + 1) % step == 0 ...
  mlp_only_layers: tuple[int, ...] = ()      # ... and i is not listed here
  # MTP layers a checkpoint carries after the decoder (`model.layers.{L}` ..., DeepSeek-V3's
  # num_nextn_predict_layers): the target skips them; jspec.drafters.mtp loads them as a drafter
  num_nextn_predict_layers: int = 0

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim", "max_position"):
      if getattr(self, name) <= 0:
        raise ValueError(f"LlamaConfig.{name} must be positive, got {getattr(self, name)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                       f"({self.num_kv_heads}) for grouped-query attention")
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
    if self.num_experts:
      if not 1 <= self.num_experts_per_tok <= self.num_experts:
        raise ValueError(f"num_experts_per_tok must be in [1, num_experts={self.num_experts}], "
                         f"got {self.num_experts_per_tok}")
      if self.moe_intermediate_size <= 0 or self.decoder_sparse_step <= 0:
        raise ValueError("an MoE config needs moe_intermediate_size > 0 and decoder_sparse_step "
                         f"> 0, got {self.moe_intermediate_size}, {self.decoder_sparse_step}")

  def is_moe_layer(self, layer: int) -> bool:
    return (self.num_experts > 0 and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0)

  @property
  def group_size(self) -> int:
    return self.num_heads // self.num_kv_heads

  def num_params(self) -> int:
    h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
    qkv = h * self.head_dim * (self.num_heads + 2 * self.num_kv_heads)
    attn = qkv + self.num_heads * self.head_dim * h + 2 * h
    shared = self.shared_expert_intermediate_size
    moe = (self.num_experts * (3 * h * self.moe_intermediate_size + h)
           + 3 * h * shared + h * bool(shared))
    mlps = sum(moe if self.is_moe_layer(n) else 3 * h * i for n in range(self.num_layers))
    return self.num_layers * attn + mlps + v * h * (1 if self.tie_embeddings else 2) + h

  @classmethod
  def smollm2_135m(cls, **override) -> "LlamaConfig":
    base = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_eps=1e-5,
                tie_embeddings=True, max_position=8192, arch="llama")
    base.update(override)
    return cls(**base)

  @classmethod
  def tiny(cls, **override) -> "LlamaConfig":
    """A random-weights test model: fast on CPU, same code paths as the real one."""
    base = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                num_kv_heads=2, head_dim=16, rope_theta=10000.0, max_position=512)
    base.update(override)
    return cls(**base)

  @classmethod
  def from_hf(cls, hf: dict[str, Any]) -> "LlamaConfig":
    """Builds a config from a Hugging Face `config.json` dict (Llama, Qwen2, Qwen3, and the MoE
    Qwen3-MoE, Qwen2-MoE and Mixtral)."""
    model_type = hf.get("model_type", "")
    supported = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "llama",
                 "qwen3_moe": "qwen3_moe", "qwen2_moe": "qwen2_moe", "mixtral": "mixtral"}
    if model_type not in supported:
      raise UnsupportedModelError(
          f"model_type {model_type!r} is not supported; jspec loads {sorted(supported)} "
          "(Llama-family decoders, dense or mixture-of-experts)")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", None):
      raise UnsupportedModelError(
          f"RoPE scaling {kind!r} is not supported yet; use a checkpoint without RoPE scaling")
    if hf.get("sliding_window") and hf.get("use_sliding_window",
                                           model_type in ("mistral", "mixtral")):
      raise UnsupportedModelError("sliding-window attention is not supported")
    if hf.get("hidden_act", "silu") != "silu":
      raise UnsupportedModelError(f"activation {hf['hidden_act']!r} is not supported (SwiGLU/silu only)")
    if hf.get("mlp_bias"):
      raise UnsupportedModelError("MLP biases (mlp_bias=true) are not supported")
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    arch = supported[model_type]
    moe = {}
    if arch in ("qwen3_moe", "qwen2_moe", "mixtral"):
      moe = dict(
          num_experts=int(hf.get("num_experts") or hf["num_local_experts"]),
          num_experts_per_tok=int(hf["num_experts_per_tok"]),
          moe_intermediate_size=int(hf.get("moe_intermediate_size") or hf["intermediate_size"]),
          norm_topk_prob=arch == "mixtral" or bool(hf.get("norm_topk_prob", False)),
          shared_expert_intermediate_size=int(hf.get("shared_expert_intermediate_size") or 0),
          decoder_sparse_step=int(hf.get("decoder_sparse_step") or 1),
          mlp_only_layers=tuple(int(i) for i in hf.get("mlp_only_layers") or ()))
    return cls(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
        num_heads=heads, num_kv_heads=hf.get("num_key_value_heads", heads), head_dim=head_dim,
        rope_theta=float(hf.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=arch in ("qwen2", "qwen2_moe") or bool(hf.get("attention_bias", False)),
        qk_norm=arch in ("qwen3", "qwen3_moe"),
        max_position=int(hf.get("max_position_embeddings", 4096)), arch=arch,
        num_nextn_predict_layers=int(hf.get("num_nextn_predict_layers") or 0), **moe)
