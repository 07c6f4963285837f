"""`SpecDecoder`: the user-facing speculative generator over the jitted round (jspec.engine)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jspec import engine, sharding
from jspec.adaptive import AdaptiveDrafter, time_rounds, with_round_costs
from jspec.config import SpeculativeConfig
from jspec.costs import CostTable
from jspec.decode import DecodeOutput, row_keys, validate_request
from jspec.drafters.base import Drafter, WidthPolicy
from jspec.sampling import SamplingParams
from models.llama import Llama

CHOICES = ("host", "device")


@dataclasses.dataclass
class SpecOutput(DecodeOutput):
  rounds: int = 0                  # verify passes, summed over rows
  drafted: int = 0
  accepted: int = 0
  emitted: int = 0                 # tokens committed by rounds (excludes each row's first token)
  steps: int = 0                   # rounds the batch ran (the slowest row's)
  accepted_at: list[int] = dataclasses.field(default_factory=list)
  # [D] rounds (summed over rows) in which draft position i was accepted
  offered_at: list[int] = dataclasses.field(default_factory=list)
  # [D] rounds (summed over rows) that verified draft position i after accepting the ones before
  verified_lengths: dict[int, int] = dataclasses.field(default_factory=dict)
  # adaptive configs: how many rounds verified each draft length (0 = a plain step)
  round_costs: dict[int, float] = dataclasses.field(default_factory=dict)
  # adaptive configs: seconds per round verifying each length, as timed when this shape compiled
  # (SpecDecoder(time_rounds=True)) and used by the choice; empty when the cost table is used

  @property
  def per_position_acceptance(self) -> list[float]:
    """Fraction of rounds in which draft position i was accepted."""
    return [a / max(self.rounds, 1) for a in self.accepted_at]

  @property
  def conditional_acceptance(self) -> list[float]:
    """P(draft position i accepted | it was verified after the ones before it were accepted):
    what the adaptive draft length estimates (rounds where a drafter proposed nothing at i do
    not count); 0 where position i was never verified so."""
    return [a / o if o else 0.0 for a, o in zip(self.accepted_at, self.offered_at)]

  @property
  def acceptance_length(self) -> float:
    """Tokens committed per target verify, bonus included."""
    return self.emitted / max(self.rounds, 1)

  def metrics(self) -> dict:
    return dict(acceptance_length=self.acceptance_length,
                per_position_acceptance=self.per_position_acceptance, rounds=self.rounds,
                drafted=self.drafted, accepted=self.accepted, tokens_per_s=self.tokens_per_s,
                **({"verified_lengths": self.verified_lengths} if self.verified_lengths else {}))


def build_drafter(config: SpeculativeConfig, target: Llama, draft_model: Llama | None = None,
                  cost_table: CostTable | None = None):
  """Returns (drafter, drafter_params) for a config, through the method's registry entry; an
  adaptive config wraps the drafter in `AdaptiveDrafter` with the cost table's round costs."""
  drafter, params = config.entry.build(config.options, config.max_draft, target,
                                       draft_model=draft_model)
  if not isinstance(drafter, Drafter):
    raise TypeError(f"method {config.method!r} built a {type(drafter).__name__}, which does not "
                    "subclass jspec.drafters.base.Drafter; derive the drafter class from it "
                    "(docs/extending.md)")
  if config.per_row and (drafter.confidence_schedule or drafter.num_extra):
    raise ValueError(f"per_row needs a chain drafter that verifies only its drafts; "
                     f"{config.method!r} schedules its own widths or verifies extra tokens: drop "
                     "per_row")
  if drafter.confidence_schedule:
    from jspec.confidence import ConfidenceScheduler, default_widths
    costs = cost_table or CostTable.default(method=config.method)
    wrapped = ConfidenceScheduler(drafter, config.draft_lengths or default_widths(drafter.num_draft),
                                  tuple(sorted(costs.verify)))
    return wrapped, wrapped.make_params(params, costs, drafter.temperatures or None)
  if not config.adaptive:
    return drafter, params
  if drafter.tree:
    raise ValueError("adaptive draft lengths (num_speculative_tokens='auto' or draft_lengths) work "
                     "with chains only; give a tree drafter a fixed node budget "
                     "(num_speculative_tokens=N)")
  costs = cost_table or CostTable.default(method=config.method)
  wrapped = AdaptiveDrafter(drafter, config.draft_lengths, tuple(sorted(costs.verify)),
                            per_row=config.per_row)
  return wrapped, wrapped.make_params(params, costs)


class SpecDecoder:
  """Speculative decoding of `target` with the drafter a config names."""

  def __init__(self, target: Llama, config: SpeculativeConfig | dict, *,
               draft_model: Llama | None = None, eos_ids: Sequence[int] = (), tokenizer=None,
               cost_table: CostTable | str | None = None, mesh=None, time_rounds: bool = True,
               choice: str = "host"):
    """tokenizer: only to encode predictions given as text (`generate(prediction=...)`).
    cost_table: for adaptive configs, the measured verify/draft costs (a `CostTable` or the path of
    a `jspec plan` JSON); the built-in defaults for this backend when None.
    mesh: a `jax.sharding.Mesh` or a spec such as "data=2,model=4" (`jspec.sharding`): the
    target's weights are placed on it and every program runs under it (the drafter's own weights
    stay replicated).
    time_rounds: adaptive configs time a few rounds of each compiled length when a new shape
    compiles (`jspec.adaptive.time_rounds`, a few seconds, counted in compile_s) and choose by those
    costs, measured on this machine today at the call's own shapes; False: by the cost table.
    choice: for adaptive configs, "host": one compiled program per width, the host picking the
    next one when the choice changes (a round costs what a fixed-width round costs); "device": one
    program choosing inside the round (`lax.switch`, no host round trip). Host programs run on
    device while the width stays the same: a change costs one dispatch. Both choose the same
    widths from the same estimates, so their outputs are equal."""
    if choice not in CHOICES:
      raise ValueError(f"choice must be one of {CHOICES}, got {choice!r}")
    self.spec = config if isinstance(config, SpeculativeConfig) else \
        SpeculativeConfig.from_dict(config)
    self.config = target.config
    self.graphdef, self.weights = nnx.split(target)
    self.mesh = sharding.as_mesh(mesh)
    if self.mesh is not None:
      self.weights = sharding.shard_weights(self.weights, self.config, self.mesh)
    if cost_table is not None and not isinstance(cost_table, CostTable):
      cost_table = CostTable.load(cost_table, self.spec.method)
    self.drafter, self.drafter_params = build_drafter(self.spec, target, draft_model, cost_table)
    self.eos_ids = tuple(sorted(set(int(i) for i in eos_ids)))
    self.tokenizer = tokenizer
    self._initial_params = self.drafter_params
    self._programs = {}
    self.times_rounds = time_rounds and type(self.drafter) is AdaptiveDrafter
    self.host_choice = choice == "host" and type(self.drafter) is AdaptiveDrafter
    self._round_costs = {}          # program key -> seconds per round of each length

  def reset_drafter(self) -> None:
    """Forgets what the drafter learned across calls (suffix decoding's global cache)."""
    self.drafter_params = self._initial_params

  def _after_generate(self, prompts, outputs) -> None:
    self.drafter_params = self.drafter.after_generate(self.drafter_params, prompts, outputs)

  def _request(self, prediction, b: int):
    """The per-call drafter inputs (predicted outputs), validated before any compilation."""
    return self.drafter.make_request(prediction, b, vocab_size=self.config.vocab_size,
                                     tokenizer=self.tokenizer)

  def clear_compiled(self) -> None:
    """Drops the compiled programs (each shape's executables stay in memory until then)."""
    self._programs.clear()
    self._round_costs.clear()

  @property
  def num_draft(self) -> int:
    return self.drafter.num_draft

  def _prepare(self, prompts, max_new_tokens, temperature, top_k, top_p, seed, max_len, pad_to=0,
               prediction=None):
    tokens, lens, max_new = validate_request(prompts, max_new_tokens, self.config, pad_to)
    b = len(prompts)
    d = self.num_draft
    request = self._request(prediction, b)
    if max_len is None:   # room for the last round's draft and any unverified extras
      max_len = (tokens.shape[1] + int(max_new.max()) + d + 1 +
                 self.drafter.num_extra)
    elif int(lens.max()) + 1 + d > max_len:
      raise ValueError(f"num_speculative_tokens ({d}) is too large for max_len={max_len}: the "
                       f"longest prompt ({int(lens.max())} tokens) + 1 + D must fit; raise max_len "
                       "or lower num_speculative_tokens")
    if tokens.shape[1] > max_len:
      tokens = tokens[:, :max_len]
    sampling = SamplingParams.make(b, temperature, top_k, top_p)
    return tokens, lens, max_new, sampling, row_keys(seed, b), int(max_len), request

  def _compiled(self, tokens, lens, max_new, sampling, keys, max_len, eos_ids, request):
    key = (tokens.shape, max_len, eos_ids,
           tuple(x.shape for x in jax.tree_util.tree_leaves(request)))
    if key not in self._programs:
      args = (self.weights, self.drafter, self.drafter_params, jnp.asarray(tokens),
              jnp.asarray(lens), jnp.asarray(max_new), sampling, keys, request)
      lowered = engine.spec_prefill.lower(self.graphdef, *args, max_len=max_len, eos_ids=eos_ids)
      pre = lowered.compile()
      # The SpecState as the prefill returns it, to compile the loop ahead of time too.
      state = sharding.output_specs(lowered, pre)
      if self.host_choice:
        gen = self._host_loop(state, sampling, eos_ids)
      else:
        gen = engine.spec_generate.lower(self.graphdef, self.weights, self.drafter,
                                         self.drafter_params, state, sampling,
                                         eos_ids=eos_ids).compile()
      self._programs[key] = (pre, gen)
    return key, *self._programs[key]

  def _host_loop(self, state, sampling, eos_ids):
    """The generate loop of an adaptive config with the choice on the host: the first width from
    `engine.spec_choose`, then the chosen width's own program (`spec_rounds_at`, compiled for every
    width, two at a time), which runs rounds on device until the choice changes, and so on until
    no row is live. Returns run(weights, params, state, sampling) -> state, like the compiled
    on-device loop."""
    choose = engine.spec_choose.lower(self.drafter, self.drafter_params, state,
                                      sampling).compile()
    lowered = [engine.spec_rounds_at.lower(self.graphdef, self.weights, self.drafter.at_width(k),
                                          self.drafter_params, state, sampling, eos_ids=eos_ids)
               for k in range(len(self.drafter.lengths))]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:    # XLA compiles without the GIL
      rounds = list(pool.map(lambda low: low.compile(), lowered))

    def run(weights, params, state, sampling):
      if bool(np.all(sharding.to_host(state.done))):
        return state
      k = int(choose(params, state, sampling))
      while True:
        state, k, live = rounds[k](weights, params, state, sampling)
        if not bool(live):
          return state
        k = int(k)
    return run

  def _start(self, prompts, max_new_tokens, temperature, top_k, top_p, seed, eos, max_len, pad_to,
             prediction=None):
    """Validates, compiles (timed apart) and returns the programs with the prefill's arguments."""
    tokens, lens, max_new, sampling, keys, max_len, request = self._prepare(
        prompts, max_new_tokens, temperature, top_k, top_p, seed, max_len, pad_to, prediction)
    eos_ids = self.eos_ids if eos else ()
    t0 = time.perf_counter()
    key, pre, gen = self._compiled(tokens, lens, max_new, sampling, keys, max_len, eos_ids,
                                   request)
    args = (self.weights, self.drafter_params, jnp.asarray(tokens), jnp.asarray(lens),
            jnp.asarray(max_new), sampling, keys, request)
    return key, pre, gen, args, lens, sampling, time.perf_counter() - t0

  def _params(self, key, pre, gen, args, sampling):
    """The drafter params a generate call runs with: an adaptive decoder's, with the round costs
    timed for this program (on its first call; `time_rounds`)."""
    if not self.times_rounds:
      return self.drafter_params, {}
    if key not in self._round_costs:
      run = lambda params, state: gen(self.weights, params, state, sampling)
      self._round_costs[key] = time_rounds(run, self.drafter_params, pre(*args),
                                           self.drafter.lengths)
    seconds = self._round_costs[key]
    if seconds is None:
      return self.drafter_params, {}
    return with_round_costs(self.drafter_params, seconds), seconds

  def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens=128, temperature=0.0,
               top_k=0, top_p=1.0, seed=0, eos: bool = True, max_len: int | None = None,
               pad_to: int = 0, prediction: Sequence | None = None) -> SpecOutput:
    """prediction: with the 'prediction' method, per row the expected output (text, token ids or
    None) that the drafter proposes from (rows without one fall back to n-gram lookup)."""
    with sharding.on_mesh(self.mesh):
      key, pre, gen, args, lens, sampling, compile_s = self._start(
          prompts, max_new_tokens, temperature, top_k, top_p, seed, eos, max_len, pad_to,
          prediction)
      t0 = time.perf_counter()
      params, round_costs = self._params(key, pre, gen, args, sampling)
      t1 = time.perf_counter()
      state = pre(*args)
      jax.block_until_ready(state)
      t2 = time.perf_counter()
      state = gen(self.weights, params, state, sampling)
      jax.block_until_ready(state)
      t3 = time.perf_counter()
    out = self._output(state, lens, prefill_s=t2 - t1, decode_s=t3 - t2,
                       compile_s=compile_s + t1 - t0, round_costs=round_costs)
    self._after_generate(prompts, out.token_ids)
    return out

  def prefill(self, prompts: Sequence[Sequence[int]], *, max_new_tokens=128, temperature=0.0,
              top_k=0, top_p=1.0, seed=0, eos: bool = True,
              max_len: int | None = None, pad_to: int = 0,
              prediction: Sequence | None = None) -> tuple[engine.SpecState, SamplingParams]:
    """The state after the prefill, as `generate` starts its rounds from it (for timing a round's
    parts, or driving rounds by hand with `engine.spec_round`)."""
    with sharding.on_mesh(self.mesh):
      _, pre, _, args, _, sampling, _ = self._start(
          prompts, max_new_tokens, temperature, top_k, top_p, seed, eos, max_len, pad_to,
          prediction)
      return pre(*args), sampling

  def stream(self, prompts: Sequence[Sequence[int]], *, max_new_tokens=128, temperature=0.0,
             top_k=0, top_p=1.0, seed=0, eos: bool = True, max_len: int | None = None,
             prediction: Sequence | None = None) -> Iterator[list[list[int]]]:
    """Yields, after the prefill and after every round, the tokens each row newly committed."""
    tokens, lens, max_new, sampling, keys, max_len, request = self._prepare(
        prompts, max_new_tokens, temperature, top_k, top_p, seed, max_len, prediction=prediction)
    eos_ids = self.eos_ids if eos else ()
    with sharding.on_mesh(self.mesh):   # entered per call: not held while the caller runs
      state = engine.spec_prefill(self.graphdef, self.weights, self.drafter, self.drafter_params,
                                  jnp.asarray(tokens), jnp.asarray(lens), jnp.asarray(max_new),
                                  sampling, keys, request, max_len=max_len, eos_ids=eos_ids)
    seen = lens.copy()
    while True:
      length = sharding.to_host(state.length)
      buf = sharding.to_host(state.tokens)
      yield [buf[i, seen[i]:length[i]].tolist() for i in range(len(lens))]
      seen = length
      if bool(np.all(sharding.to_host(state.done))):
        self._after_generate(prompts, [buf[i, lens[i]:length[i]].tolist()
                                       for i in range(len(lens))])
        return
      with sharding.on_mesh(self.mesh):
        state = engine.spec_round(self.graphdef, self.weights, self.drafter,
                                  self.drafter_params, state, sampling, eos_ids=eos_ids)

  def _output(self, state, lens, **times) -> SpecOutput:
    buf = sharding.to_host(state.tokens)
    length = sharding.to_host(state.length)
    finish = sharding.to_host(state.finish)
    m = jax.tree_util.tree_map(sharding.to_host, state.metrics)
    rounds = int(m.rounds.sum())
    verified = {} if not isinstance(self.drafter, WidthPolicy) else {
        int(n): int(c) for n, c in zip(self.drafter.lengths,
                                       sharding.to_host(self.drafter.chosen(state.drafter_state)))}
    return SpecOutput(
        token_ids=[buf[i, lens[i]:length[i]].tolist() for i in range(len(lens))],
        finish_reason=[engine.FINISH_REASONS[int(f)] for f in finish], rounds=rounds,
        drafted=int(m.drafted.sum()), accepted=int(m.accepted.sum()), emitted=int(m.emitted.sum()),
        steps=int(state.round),
        accepted_at=m.accepted_at.sum(0).tolist(), offered_at=m.offered_at.sum(0).tolist(),
        verified_lengths=verified, **times)
