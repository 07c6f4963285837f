"""The dspark drafter (the engine's side): see module.py."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters.base import Context, Draft, draft_token
from jspec.drafters.dflash.drafter import DFlashDrafter, DFlashState, check_block, drafter_params
from jspec.drafters.dflash.module import DFlashModule
from jspec.drafters.dspark.module import DSparkModule
from models.llama import Llama


@dataclasses.dataclass(frozen=True)
class DSparkDrafter(DFlashDrafter):
  """params: {"drafter": nnx.State of a DSparkModule, "embed", "head": as DFlash's}."""
  sample: bool = True                 # sample from the processed q (recorded) vs argmax
  confidence_schedule: bool = False   # jspec.confidence: verify the prefix Algorithm 1 picks
  temperatures: tuple[float, ...] = ()   # the confidences' per-position calibration

  @property
  def block_size(self) -> int:
    return self.num_draft

  @classmethod
  def from_module(cls, module: DSparkModule, target: Llama, num_draft: int, *,
                  sample: bool = True, confidence_schedule: bool = False,
                  temperatures: tuple[float, ...] = ()):
    check_block(module.config, target.config, num_draft, "DSpark")
    if confidence_schedule and not module.config.confidence:
      raise ValueError("confidence_schedule needs a DSpark head with a confidence head")
    graphdef, state = nnx.split(module)
    return (cls(graphdef, num_draft, tuple(module.config.taps), sample, confidence_schedule,
                tuple(float(t) for t in temperatures)),
            drafter_params(module.backbone, state, target))

  def full(self, params) -> DSparkModule:
    return nnx.merge(self.graphdef, params["drafter"])

  def backbone(self, params) -> DFlashModule:
    return self.full(params).backbone

  def propose(self, params, state: DFlashState, ctx: Context, key: jax.Array):
    draft, _ = self.propose_with_confidence(params, state, ctx, key)
    return draft, state

  def propose_with_confidence(self, params, state: DFlashState, ctx: Context, key: jax.Array):
    """(the Draft, the confidence logits [B, D] of its slots)."""
    module = self.full(params)
    anchor, h = self.block_hidden(module.backbone, params, state, ctx, self.block_size)
    u = module.backbone.draft_logits(h, params["head"])                       # [B, D, Vd]

    def step(prev, j):
      hj = h[:, j]
      bias, e = module.markov_bias(hj, prev)
      logits = module.backbone.target_logits(u[:, j] + bias)
      tok, q = draft_token(logits, ctx.sampling, key, j, self.sample)
      return module.draft_index(tok), (tok, q, module.confidence_logit(hj, e))

    _, (toks, qs, conf) = jax.lax.scan(step, module.draft_index(anchor),
                                       jnp.arange(self.num_draft))
    q = None if qs is None else jnp.moveaxis(qs, 0, 1)
    return Draft(tokens=jnp.moveaxis(toks, 0, 1), q=q), jnp.moveaxis(conf, 0, 1)
