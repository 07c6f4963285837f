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
