"""Tiny random checkpoints written by transformers' save_pretrained load through the safetensors path
and reproduce transformers' logits (Llama, Qwen2 with q/k/v biases, Qwen3 with q/k norms)."""

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
  raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["llama", "llama-tied", "qwen2", "qwen3"])
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
  assert cfg.qkv_bias == (kind == "qwen2") and cfg.qk_norm == (kind == "qwen3")
  model = llama_from_hf_tensors(cfg, tensors)
  ids = np.random.default_rng(1).integers(0, 96, size=(2, 19))
  with torch.no_grad():
    theirs = hf(torch.tensor(ids)).logits.numpy()
  ours = np.asarray(model(jnp.asarray(ids), KVCache.init(cfg, 2, 32)).logits)
  np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=1e-4)
