"""The MoE feed-forward against a per-token numpy loop (router rule, SwiGLU experts, shared expert);
fused-expert checkpoints; the expert GEMM on every backend's kernel (interpret mode); the engine on
a tiny MoE target (greedy speculative output equals plain decoding, two drafters); config errors.
(transformers parity of Qwen3-MoE / Qwen2-MoE / Mixtral checkpoints: test_hf_safetensors.py.)"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder
from models import KVCache, Llama, LlamaConfig, ModelLoadError
from models.moe import MoE

CFG = LlamaConfig.tiny(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24,
                       mlp_only_layers=(0,))


def oracle(moe: MoE, x: np.ndarray, cfg: LlamaConfig) -> np.ndarray:
  """Per token, in float64: softmax over all experts, top-k, optional renormalisation, the chosen
  experts' SwiGLU outputs weighted and summed; plus the gated shared expert."""
  silu = lambda z: z / (1 + np.exp(-z))
  w = {k: np.asarray(getattr(moe, k)[...], np.float64) for k in ("router", "w_gate", "w_up",
                                                                   "w_down")}
  out = np.zeros_like(x, dtype=np.float64)
  for n, tok in enumerate(np.asarray(x, np.float64)):
    logits = tok @ w["router"]
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    top = np.argsort(-probs)[:cfg.num_experts_per_tok]
    gates = probs[top] / (probs[top].sum() if cfg.norm_topk_prob else 1.0)
    for e, g in zip(top, gates):
      out[n] += g * ((silu(tok @ w["w_gate"][e]) * (tok @ w["w_up"][e])) @ w["w_down"][e])
    if cfg.shared_expert_intermediate_size:
      lin = lambda m: np.asarray(m.kernel[...], np.float64)
      dense = (silu(tok @ lin(moe.shared_gate_proj)) * (tok @ lin(moe.shared_up_proj))) \
          @ lin(moe.shared_down_proj)
      out[n] += dense / (1 + np.exp(-(tok @ lin(moe.shared_expert_gate))))
  return out


@pytest.mark.parametrize("override", [dict(), dict(norm_topk_prob=False),
                                      dict(shared_expert_intermediate_size=20)])
def test_moe_layer_matches_a_per_token_loop(override):
  cfg = dataclasses.replace(CFG, **override)
  moe = MoE(cfg, dtype=jnp.float32, rngs=nnx.Rngs(3))
  moe.router[...] = moe.router[...] * 40.0     # routing with structure
  x = np.random.default_rng(0).standard_normal((2, 7, cfg.hidden_size)).astype(np.float32)
  got = np.asarray(moe(jnp.asarray(x))).reshape(-1, cfg.hidden_size)
  np.testing.assert_allclose(got, oracle(moe, x.reshape(-1, cfg.hidden_size), cfg), atol=1e-5)


def test_layers_follow_the_sparse_step_and_dense_list():
  cfg = dataclasses.replace(CFG, num_layers=5, decoder_sparse_step=2, mlp_only_layers=(3,))
  assert [cfg.is_moe_layer(i) for i in range(5)] == [False, True, False, False, False]
  model = Llama(cfg, rngs=nnx.Rngs(0))
  assert [type(b.mlp).__name__ for b in model.layers] == ["MLP", "MoE", "MLP", "MLP", "MLP"]
  params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert params == cfg.num_params()


@pytest.mark.parametrize("impl", ["pallas_gpu", "pallas_tpu"])
def test_forward_through_the_expert_kernels_equals_ragged_dot(impl):
  ids = jnp.asarray(np.random.default_rng(1).integers(0, CFG.vocab_size, (2, 9)))
  logits = {}
  for moe_impl in ("reference", impl):   # interpret mode off the kernel's device
    model = Llama(CFG, rngs=nnx.Rngs(4), moe_impl=moe_impl)
    logits[moe_impl] = np.asarray(model(ids, KVCache.init(CFG, 2, 16)).logits)
  np.testing.assert_allclose(logits[impl], logits["reference"], atol=1e-5)


def test_fused_expert_checkpoints_load_like_per_expert_ones():
  from models.weights import stack_experts
  rng = np.random.default_rng(2)
  e, h, f = CFG.num_experts, CFG.hidden_size, CFG.moe_intermediate_size
  per_expert = {}
  for i in range(e):
    per_expert[f"model.layers.1.mlp.experts.{i}.gate_proj.weight"] = rng.standard_normal((f, h))
    per_expert[f"model.layers.1.mlp.experts.{i}.up_proj.weight"] = rng.standard_normal((f, h))
    per_expert[f"model.layers.1.mlp.experts.{i}.down_proj.weight"] = rng.standard_normal((h, f))
  fused = {
      "model.layers.1.mlp.experts.gate_up_proj": np.stack([np.concatenate(
          [per_expert[f"model.layers.1.mlp.experts.{i}.gate_proj.weight"],
           per_expert[f"model.layers.1.mlp.experts.{i}.up_proj.weight"]]) for i in range(e)]),
      "model.layers.1.mlp.experts.down_proj": np.stack(
          [per_expert[f"model.layers.1.mlp.experts.{i}.down_proj.weight"] for i in range(e)])}
  a, b = stack_experts(per_expert), stack_experts(fused)
  assert sorted(a) == sorted(b) == [f"model.layers.1.moe.{w}" for w in ("w_down", "w_gate", "w_up")]
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])
  del per_expert["model.layers.1.mlp.experts.3.up_proj.weight"]
  with pytest.raises(ModelLoadError, match=r"w_up: experts \[0, 1, 2, 4, 5\] are not 0..E-1"):
    stack_experts(per_expert)


def test_speculative_greedy_on_an_moe_target_equals_plain_decoding():
  target = Llama(CFG, rngs=nnx.Rngs(5))
  draft = Llama(LlamaConfig.tiny(num_layers=1), rngs=nnx.Rngs(6))   # a dense draft model
  rng = np.random.default_rng(3)
  prompts = [rng.integers(0, 8, n).tolist() for n in (9, 14, 5)]     # small alphabet: repeats
  kw = dict(max_new_tokens=16, temperature=0.0, eos=False)
  plain = Decoder(target).generate(prompts, **kw).token_ids
  for cfg, extra in (({"method": "ngram", "num_speculative_tokens": 3}, {}),
                     ({"method": "draft_model", "num_speculative_tokens": 2},
                      {"draft_model": draft})):
    assert SpecDecoder(target, cfg, **extra).generate(prompts, **kw).token_ids == plain, cfg


@pytest.mark.parametrize("override,match", [
    (dict(num_experts_per_tok=7), "num_experts_per_tok must be in"),
    (dict(moe_intermediate_size=0), "moe_intermediate_size > 0"),
])
def test_bad_moe_config(override, match):
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(CFG, **override)
  with pytest.raises(ValueError, match="moe_impl must be one of"):
    Llama(CFG, moe_impl="fast")


def _to_gguf(hf_model, path: str, arch: str) -> None:
  """Writes a transformers MoE model as a GGUF file with llama.cpp's tensor and metadata names
  (Q/K rows permuted for the llama arch, experts stacked [E, out, in])."""
  import re

  import gguf
  c = hf_model.config
  sd = {k: v.detach().numpy().astype(np.float32) for k, v in hf_model.state_dict().items()}
  w = gguf.GGUFWriter(path, arch)
  e = c.num_experts if hasattr(c, "num_experts") and c.num_experts else c.num_local_experts
  for key, value in (("block_count", c.num_hidden_layers), ("embedding_length", c.hidden_size),
                     ("attention.head_count", c.num_attention_heads),
                     ("attention.head_count_kv", c.num_key_value_heads),
                     ("attention.key_length", c.head_dim), ("context_length", 256),
                     ("vocab_size", c.vocab_size), ("feed_forward_length", c.intermediate_size),
                     ("expert_count", e), ("expert_used_count", c.num_experts_per_tok),
                     ("expert_feed_forward_length",
                      getattr(c, "moe_intermediate_size", None) or c.intermediate_size)):
    w.add_uint32(f"{arch}.{key}", int(value))
  if getattr(c, "shared_expert_intermediate_size", 0):
    w.add_uint32(f"{arch}.expert_shared_feed_forward_length", c.shared_expert_intermediate_size)
  w.add_float32(f"{arch}.rope.freq_base", float(c.rope_parameters["rope_theta"]))
  w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", float(c.rms_norm_eps))
  names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
           "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
           "post_attention_layernorm": "ffn_norm", "mlp.gate": "ffn_gate_inp",
           "block_sparse_moe.gate": "ffn_gate_inp", "mlp.gate_proj": "ffn_gate",
           "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
           "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
           "mlp.shared_expert.up_proj": "ffn_up_shexp",
           "mlp.shared_expert.down_proj": "ffn_down_shexp",
           "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
  experts = {"gate_proj": "ffn_gate_exps", "w1": "ffn_gate_exps", "up_proj": "ffn_up_exps",
             "w3": "ffn_up_exps", "down_proj": "ffn_down_exps", "w2": "ffn_down_exps"}
  permute = lambda x, n: x.reshape(n, 2, x.shape[0] // n // 2, *x.shape[1:]).swapaxes(1, 2) \
      .reshape(x.shape)
  stacks = {}
  for name, x in sd.items():
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
    if name in top:
      w.add_tensor(top[name], x)
      continue
    layer, rest = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name).groups()
    fused = re.fullmatch(r"(?:mlp|block_sparse_moe)\.experts\.(gate_up_proj|down_proj)", rest)
    if fused and fused.group(1) == "gate_up_proj":   # transformers' runtime layout [E, 2F, H]
      gate, up = np.split(x, 2, axis=1)
      w.add_tensor(f"blk.{layer}.ffn_gate_exps.weight", gate)
      w.add_tensor(f"blk.{layer}.ffn_up_exps.weight", up)
      continue
    if fused:
      w.add_tensor(f"blk.{layer}.ffn_down_exps.weight", x)
      continue
    m = re.fullmatch(r"(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight", rest)
    if m:
      stacks.setdefault((layer, experts[m.group(2)]), {})[int(m.group(1))] = x
      continue
    base, suffix = rest.rsplit(".", 1)
    if arch == "llama" and base in ("self_attn.q_proj", "self_attn.k_proj"):
      x = permute(x, c.num_attention_heads if "q_proj" in base else c.num_key_value_heads)
    w.add_tensor(f"blk.{layer}.{names[base]}.{suffix}", x)
  for (layer, kind), by_expert in stacks.items():
    w.add_tensor(f"blk.{layer}.{kind}.weight", np.stack([by_expert[i] for i in sorted(by_expert)]))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


@pytest.mark.parametrize("kind,arch", [("qwen3_moe", "qwen3moe"), ("qwen2_moe", "qwen2moe"),
                                       ("mixtral", "llama")])
def test_gguf_moe_checkpoints_match_transformers(kind, arch, tmp_path):
  import torch
  import transformers

  from models.gguf_loader import load_gguf
  from models.weights import llama_from_hf_tensors
  common = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                num_experts_per_tok=2)
  torch.manual_seed(0)
  if kind == "qwen3_moe":   # llama.cpp renormalises Qwen3-MoE's top-k weights
    hf = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        **common, intermediate_size=80, moe_intermediate_size=40, num_experts=8,
        norm_topk_prob=True))
  elif kind == "qwen2_moe":  # ... and not Qwen2-MoE's; the shared expert
    hf = transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        **common, intermediate_size=80, moe_intermediate_size=40, num_experts=6,
        shared_expert_intermediate_size=48, norm_topk_prob=False))
  else:
    hf = transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **common, intermediate_size=40, num_local_experts=4))
  with torch.no_grad():
    for p in hf.parameters():
      p.add_(0.05 * torch.randn_like(p))
  hf.eval()
  path = str(tmp_path / "moe.gguf")
  _to_gguf(hf, path, arch)
  cfg, tensors, _ = load_gguf(path)
  assert cfg.num_experts == (8, 6, 4)[("qwen3_moe", "qwen2_moe", "mixtral").index(kind)]
  model = llama_from_hf_tensors(cfg, tensors)
  ids = np.random.default_rng(1).integers(0, 96, size=(2, 11))
  with torch.no_grad():
    theirs = hf(torch.tensor(ids)).logits.numpy()
  ours = np.asarray(model(jnp.asarray(ids), KVCache.init(cfg, 2, 16)).logits)
  np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=1e-4)
