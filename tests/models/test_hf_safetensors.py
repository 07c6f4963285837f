"""Tiny random checkpoints written by transformers' save_pretrained load through the safetensors path
and reproduce transformers' logits (Llama, Qwen2 with q/k/v biases, Qwen3 with q/k norms, and the
mixture-of-experts Qwen3-MoE, Qwen2-MoE with its shared expert, Mixtral)."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from models import KVCache

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-6)


def _make(kind):
  if kind == "llama":
    cfg = transformers.LlamaConfig(**COMMON, rope_theta=5000.0, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(cfg)
  if kind == "llama-tied":
    cfg = transformers.LlamaConfig(**COMMON, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg)
  if kind == "qwen2":
    cfg = transformers.Qwen2Config(**COMMON, tie_word_embeddings=False)
    return transformers.Qwen2ForCausalLM(cfg)
  if kind == "qwen3":
    cfg = transformers.Qwen3Config(**COMMON, head_dim=24, tie_word_embeddings=True)
    return transformers.Qwen3ForCausalLM(cfg)
  moe = dict(num_experts_per_tok=2, moe_intermediate_size=40)
  if kind.startswith("qwen3_moe"):   # layer 1 dense (mlp_only_layers); raw or renormalised gates
    cfg = transformers.Qwen3MoeConfig(**COMMON, **moe, num_experts=8, mlp_only_layers=[1],
                                      norm_topk_prob=kind.endswith("norm"))
    return transformers.Qwen3MoeForCausalLM(cfg)
  if kind == "qwen2_moe":            # shared expert with its sigmoid gate; sparse every 2nd layer
    cfg = transformers.Qwen2MoeConfig(**COMMON, **moe, num_experts=6, decoder_sparse_step=2,
                                      shared_expert_intermediate_size=48)
    return transformers.Qwen2MoeForCausalLM(cfg)
  if kind == "mixtral":
    common = COMMON | dict(intermediate_size=40)
    cfg = transformers.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(cfg)
  raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["llama", "llama-tied", "qwen2", "qwen3", "qwen3_moe",
                                  "qwen3_moe_norm", "qwen2_moe", "mixtral"])
def test_safetensors_checkpoint_matches_transformers(kind, tmp_path):
  torch.manual_seed(0)
  hf = _make(kind).eval()
  with torch.no_grad():   # random init leaves biases / norms at trivial values; perturb them all
    for p in hf.parameters():
      p.add_(0.05 * torch.randn_like(p))
  hf.save_pretrained(tmp_path)
  from models.hf_loader import load_hf_folder
  from models.weights import llama_from_hf_tensors
  cfg, tensors = load_hf_folder(str(tmp_path))
  assert cfg.qkv_bias == kind.startswith("qwen2") and cfg.qk_norm == kind.startswith("qwen3")
  assert bool(cfg.num_experts) == (kind in ("qwen3_moe", "qwen3_moe_norm", "qwen2_moe", "mixtral"))
  model = llama_from_hf_tensors(cfg, tensors)
  ids = np.random.default_rng(1).integers(0, 96, size=(2, 19))
  with torch.no_grad():
    theirs = hf(torch.tensor(ids)).logits.numpy()
  ours = np.asarray(model(jnp.asarray(ids), KVCache.init(cfg, 2, 32)).logits)
  np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["qwen2", "qwen2_moe"])
def test_bf16_checkpoint_kept_as_stored(kind, tmp_path):
  """A checkpoint saved in bf16 reads as bf16 (`stored_dtype`, what `--weights auto` keeps); its
  dense layers held as bf16 `StoredLinear`s (biases, norms, router and experts float32) reproduce
  transformers' logits from the same bf16 weights."""
  torch.manual_seed(0)
  hf = _make(kind).eval()
  with torch.no_grad():
    for p in hf.parameters():
      p.add_(0.05 * torch.randn_like(p))
  from models.hf_loader import load_hf_folder, stored_dtype
  from models.stored_layers import StoredLinear
  from models.weights import llama_from_hf_tensors
  hf.save_pretrained(tmp_path / "f32")
  assert stored_dtype(str(tmp_path / "f32")) == "f32"
  hf = hf.to(torch.bfloat16)
  hf.save_pretrained(tmp_path / "bf16")
  assert stored_dtype(str(tmp_path / "bf16")) == "bf16"
  cfg, tensors = load_hf_folder(str(tmp_path / "bf16"))
  model = llama_from_hf_tensors(cfg, tensors, weight_format="bf16")
  assert isinstance(model.layers[0].attn.q_proj, StoredLinear)
  assert model.layers[0].attn.q_proj.fmt == "bf16" and model.layers[0].attn.q_proj.bias is not None
  hf = hf.float()                      # the bf16 weights, computed in float32
  ids = np.random.default_rng(1).integers(0, 96, size=(2, 19))
  with torch.no_grad():
    theirs = hf(torch.tensor(ids)).logits.numpy()
  ours = np.asarray(model(jnp.asarray(ids), KVCache.init(cfg, 2, 32)).logits)
  np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=1e-4)
