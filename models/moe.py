"""The mixture-of-experts feed-forward of Qwen3-MoE / Qwen2-MoE / Mixtral blocks: a router (softmax
over all experts, top-k, optional renormalisation), SwiGLU experts run as grouped GEMMs over the
tokens sorted by expert (`pallas_kernels.moe_gemm`: the backend's Pallas kernel or lax.ragged_dot),
and Qwen2-MoE's optional shared expert with its sigmoid gate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models.config import LlamaConfig
from pallas_kernels.moe_gemm import IMPLS, MoEParams, moe_ep, moe_reference


def expert_axis(mesh, num_experts: int) -> tuple[str | None, int]:
  """(axis, size) that experts are sharded over: "expert" when the mesh splits it, else "model";
  (None, 1) without a mesh, when neither splits, or when the experts do not divide evenly."""
  if mesh.empty:
    return None, 1
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
  for name in ("expert", "model"):
    if sizes.get(name, 1) > 1:
      return (name, sizes[name]) if num_experts % sizes[name] == 0 else (None, 1)
  return None, 1


class MoE(nnx.Module):
  """x [B, T, H] -> [B, T, H]. Weights: router [H, E]; w_gate, w_up [E, H, F]; w_down [E, F, H].

  moe_impl: the grouped GEMM (`pallas_kernels.moe_gemm.gmm`: "auto" = the backend's kernel on GPU
  and TPU, lax.ragged_dot elsewhere). Every token's k experts run; nothing is dropped.
  Under a mesh (`jax.set_mesh`, `jspec.sharding`) whose "expert" axis (else "model" axis) splits
  the experts evenly, the layer runs expert-parallel (`moe_ep`, no capacity limit, so the same
  result as on one device).
  """

  def __init__(self, cfg: LlamaConfig, *, dtype, rngs: nnx.Rngs, moe_impl: str = "auto"):
    if moe_impl not in IMPLS:
      raise ValueError(f"moe_impl must be one of {IMPLS}, got {moe_impl!r}")
    h, f, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
    init = nnx.initializers.normal(0.02)
    self.router = nnx.Param(init(rngs.params(), (h, e), dtype))
    self.w_gate = nnx.Param(init(rngs.params(), (e, h, f), dtype))
    self.w_up = nnx.Param(init(rngs.params(), (e, h, f), dtype))
    self.w_down = nnx.Param(init(rngs.params(), (e, f, h), dtype))
    self.top_k = cfg.num_experts_per_tok
    self.normalize = cfg.norm_topk_prob
    self.moe_impl = moe_impl
    shared = cfg.shared_expert_intermediate_size
    if shared:
      lin = lambda i, o: nnx.Linear(i, o, use_bias=False, param_dtype=dtype, dtype=dtype,
                                    rngs=rngs)
      self.shared_gate_proj, self.shared_up_proj = lin(h, shared), lin(h, shared)
      self.shared_down_proj = lin(shared, h)
      self.shared_expert_gate = lin(h, 1)
    self.has_shared = bool(shared)

  def params(self) -> MoEParams:
    return MoEParams(router=self.router[...], w_gate=self.w_gate[...], w_up=self.w_up[...],
                     w_down=self.w_down[...])

  def __call__(self, x: jax.Array) -> jax.Array:
    b, t, h = x.shape
    tokens = x.reshape(b * t, h)
    axis, n = expert_axis(jax.sharding.get_abstract_mesh(), self.w_gate.shape[0])
    if axis is None:
      out = moe_reference(self.params(), tokens, top_k=self.top_k, impl=self.moe_impl,
                          normalize=self.normalize)                               # [B*T, H]
    else:   # tokens padded to a multiple of the shards; padding rows are sliced off
      padded = jnp.pad(tokens, ((0, -(b * t) % n), (0, 0)))
      out = moe_ep(self.params(), padded, mesh=jax.sharding.get_abstract_mesh(), top_k=self.top_k,
                   impl=self.moe_impl, axis=axis, normalize=self.normalize)[:b * t]
    if self.has_shared:
      dense = self.shared_down_proj(jax.nn.silu(self.shared_gate_proj(tokens))
                                    * self.shared_up_proj(tokens))
      out = out + jax.nn.sigmoid(self.shared_expert_gate(tokens)) * dense
    return out.reshape(b, t, h).astype(x.dtype)
