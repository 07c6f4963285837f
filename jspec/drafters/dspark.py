"""DSpark (arXiv 2607.05147): DFlash's parallel backbone with the anchor slot predicting too
(`sample_from_anchor`: a block of bs slots drafts bs tokens), plus a sequential Markov head sampled
left to right and a confidence head.

Slot k's logits are U_k + B(x_{k-1}) on the draft vocabulary, x_0 the anchor (the last committed
token): vanilla B = W2 W1[x], gated B = W2 (sigmoid(W_g [h_k; W1[x]]) * W1[x]); W1 is indexed by
the draft vocabulary plus one row for every other token (the anchor may lie outside it). Tokens are
drawn from the rows' processed distributions with q recorded (argmax for greedy rows), so the
verifier's rejection sampling keeps the target's distribution. The confidence head
c_k = sigmoid(w [h_k; W1[x_{k-1}]]) estimates P(slot k survives | slots < k accepted).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.drafters import registry
from jspec.drafters.base import Context, Draft, draft_token
from jspec.drafters.dflash import (DFlashConfig, DFlashDrafter, DFlashModule, DFlashState,
                                   _params, check_block)
from models.llama import Llama


class DSparkModule(nnx.Module):
  """The DFlash backbone (`sample_from_anchor`), the Markov head and the confidence head."""

  def __init__(self, cfg: DFlashConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
    if not cfg.sample_from_anchor or cfg.markov_rank < 1:
      raise ValueError("a DSpark config needs sample_from_anchor=True and markov_rank >= 1")
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    h, r, vd = cfg.hidden_size, cfg.markov_rank, cfg.draft_vocab_size
    self.config = cfg
    self.backbone = DFlashModule(cfg, dtype=dtype, rngs=rngs)
    self.markov_embed = nnx.Embed(vd + 1, r, param_dtype=dtype, dtype=dtype, rngs=rngs)
    # W2 starts at zero: the untrained head adds nothing to the backbone's logits
    self.markov_proj = nnx.Linear(r, vd, use_bias=False, param_dtype=dtype, dtype=dtype,
                                  kernel_init=nnx.initializers.zeros, rngs=rngs)
    if cfg.markov_gated:
      self.markov_gate = nnx.Linear(h + r, r, param_dtype=dtype, dtype=dtype, rngs=rngs)
    if cfg.confidence:
      self.confidence_head = nnx.Linear(h + r, 1, param_dtype=dtype, dtype=dtype, rngs=rngs)

  def draft_index(self, tokens: jax.Array) -> jax.Array:
    """Target ids -> draft-vocabulary rows of W1 (Vd for a token outside the vocabulary)."""
    cfg = self.config
    table = jnp.full((cfg.vocab_size,), cfg.draft_vocab_size, jnp.int32).at[
        self.backbone.draft_to_target[...]].set(jnp.arange(cfg.draft_vocab_size, dtype=jnp.int32))
    return table[tokens]

  def markov_bias(self, h: jax.Array, prev: jax.Array) -> tuple[jax.Array, jax.Array]:
    """h [..., H] the slot's hidden state, prev [...] the previous token's draft index ->
    (the bias on the slot's draft logits [..., Vd] float32, W1[prev] [..., r])."""
    e = self.markov_embed(prev)
    z = e
    if self.config.markov_gated:
      z = jax.nn.sigmoid(self.markov_gate(jnp.concatenate([h.astype(e.dtype), e], -1))) * e
    return self.markov_proj(z).astype(jnp.float32), e

  def confidence_logit(self, h: jax.Array, e: jax.Array) -> jax.Array:
    """[..., H], W1[prev] [..., r] -> the confidence logit [...] (sigmoid: c_k)."""
    if not self.config.confidence:
      return jnp.zeros(h.shape[:-1], jnp.float32)
    x = jnp.concatenate([h.astype(e.dtype), e], -1)
    return self.confidence_head(x)[..., 0].astype(jnp.float32)


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
            _params(module.backbone, state, target))

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


@dataclasses.dataclass(frozen=True)
class DSparkOptions:
  head: str | None = None        # a DSpark head folder (`jspec train dspark`; default: the head
                                 # shipped for the target, if there is one)
  draft_sampling: bool = True    # sample the Markov chain from the processed q (recorded) vs argmax
  confidence_schedule: bool = False   # verify per row the prefix the confidences schedule
                                 # (DSpark Algorithm 1, jspec/confidence.py) from the compiled
                                 # widths draft_lengths (default 0, 1, 2, 3, 4, 6, 8 up to D)


def _build(opts: DSparkOptions, num_draft: int, target: Llama, draft_model=None):
  from jspec.confidence import read_calibration
  from jspec.drafters import dflash_format

  folder = opts.head
  if isinstance(draft_model, DSparkModule):
    module = draft_model
  else:
    module = dflash_format.load_for_target(opts.head, target, "dspark")
    if folder is None:
      folder = dflash_format.shipped("dspark", target.config)[0]
  temps = read_calibration(folder, num_draft) if opts.confidence_schedule else ()
  return DSparkDrafter.from_module(module, target, num_draft, sample=opts.draft_sampling,
                                   confidence_schedule=opts.confidence_schedule,
                                   temperatures=tuple(temps))


registry.register(registry.Method(
    "dspark", DSparkOptions, _build,
    help="DSpark: DFlash backbone + sequential Markov head (sampled, q recorded) + confidence",
    cli_flags=(registry.CliFlag("--dspark-head", "head", str,
                                "DSpark head folder (default: the shipped head for the default "
                                "model)"),)))
