"""Confidence-scheduled verification: Algorithm 1 against a direct implementation, the stopping
property (a row's prefix ignores survivals past one position after it), per-position temperature
scaling, the calibration file, and the scheduled DSpark round on a tiny target (greedy identity,
no recompiles, a choice that reads only the committed context)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder, count_compiles
from jspec.costs import CostTable
from jspec.confidence import default_widths, fit_temperatures, prefix_lengths
from jspec.drafters.dspark.calibration import read_calibration, save_calibration
from models import Llama, LlamaConfig


def _direct(a, widths, cost):
  """Algorithm 1 as written: candidates by decreasing survival, admit while throughput grows."""
  b, d = a.shape
  items = sorted(((-a[r, j], j, r) for r in range(b) for j in range(d)))
  width_cost = lambda w: cost[next(i for i, x in enumerate(widths) if x >= w)]
  lengths, tau, longest = [0] * b, float(b), 0
  best = tau / width_cost(0)
  for neg, j, r in items:
    longest_new = max(longest, j + 1)
    theta = (tau - neg) / width_cost(longest_new)
    if not theta > best:
      break
    tau, best, longest = tau - neg, theta, longest_new
    lengths[r] += 1
  return lengths


def _survivals(rng, b, d):
  return np.cumprod(rng.uniform(0.3, 1.0, (b, d)), axis=1).astype(np.float32)


@pytest.mark.parametrize("b, d, widths, cost", [
    (1, 4, (0, 1, 2, 3, 4), [1.0, 1.1, 1.2, 1.3, 1.4]),
    (4, 6, (0, 1, 2, 4, 6), [1.0, 1.1, 1.2, 1.45, 1.7]),
    (3, 8, (1, 2, 4, 8), [1.0, 1.05, 1.2, 1.7]),
])
def test_prefix_lengths_equal_the_direct_algorithm(b, d, widths, cost):
  rng = np.random.default_rng(b * 10 + d)
  fn = jax.jit(prefix_lengths, static_argnums=1)
  seen = set()
  for _ in range(30):
    a = _survivals(rng, b, d)
    got = np.asarray(fn(jnp.asarray(a), widths, jnp.asarray(cost, jnp.float32)))
    assert got.tolist() == _direct(a, widths, cost)
    seen.add(tuple(got))
  assert len(seen) >= 3                    # the cases do exercise different cuts


def test_a_rows_prefix_ignores_survivals_past_its_cut():
  """Lowering any survival more than one position past a row's prefix (keeping rows
  non-increasing) leaves every row's prefix unchanged: each cut is a stopping time."""
  rng = np.random.default_rng(5)
  widths, cost = (0, 1, 2, 3, 4, 6), jnp.asarray([1.0, 1.2, 1.3, 1.45, 1.6, 1.9], jnp.float32)
  fn = jax.jit(prefix_lengths, static_argnums=1)
  for _ in range(40):
    a = _survivals(rng, 3, 6)
    base = np.asarray(fn(jnp.asarray(a), widths, cost))
    b = a.copy()
    for r in range(3):
      j = base[r] + 1                      # positions past the first unverified one
      if j < 6:
        b[r, j:] = b[r, j - 1] * np.cumprod(rng.uniform(0.0, 1.0, 6 - j))
    np.testing.assert_array_equal(np.asarray(fn(jnp.asarray(b), widths, cost)), base)


def test_temperature_scaling_recovers_a_known_miscalibration():
  """Confidences twice as sharp as the truth: the fitted temperatures are near 2 and the ECE of
  the cumulative product falls."""
  rng = np.random.default_rng(0)
  n, d = 20000, 4
  z = rng.normal(1.0, 1.5, (n, d))
  true_c = 1 / (1 + np.exp(-z))
  logits = 2.0 * z
  survived = np.cumprod(rng.random((n, d)) < true_c, axis=1)
  temps, before, after = fit_temperatures(logits, survived)
  np.testing.assert_allclose(temps, 2.0, rtol=0.2)
  assert np.all(after < before) and after.max() < 0.02


def test_calibration_file(tmp_path):
  assert np.all(read_calibration(str(tmp_path), 3) == 1.0)            # none: no scaling
  save_calibration(str(tmp_path), [1.5, 2.0], source="test")
  np.testing.assert_allclose(read_calibration(str(tmp_path), 4), [1.5, 2.0, 2.0, 2.0])
  (tmp_path / "calibration.json").write_text(json.dumps({"temperatures": [0.0]}))
  with pytest.raises(ValueError, match="temperatures must be positive"):
    read_calibration(str(tmp_path), 2)
  assert default_widths(8) == (0, 1, 2, 3, 4, 6, 8) and default_widths(5) == (0, 1, 2, 3, 4, 5)


CFG = LlamaConfig.tiny(vocab_size=64, num_layers=3)


@pytest.fixture(scope="module")
def scheduled():
  """A tiny target and a scheduled DSpark decoder over an untrained head with random
  confidences (so that rows' prefixes vary)."""
  from jspec.train import dflash
  target = Llama(CFG, rngs=nnx.Rngs(0))
  module = dflash.init_module(target, np.arange(64), "dspark", num_layers=1, block_size=6,
                              mask_token_id=3, markov_rank=8)
  module.confidence_head.kernel[...] = jnp.asarray(
      np.random.default_rng(0).normal(0, 1, module.confidence_head.kernel.shape), jnp.float32)
  # a fixed cost table, not the measured built-in defaults: prefixes of every length stay
  # competitive whatever a new measurement on some machine says
  costs = CostTable({1: {1: 1.0, 2: 1.02, 4: 1.23, 8: 1.40}, 4: {1: 1.0, 2: 1.14, 4: 1.40, 8: 1.84}},
                    round={1: {0: 1.00, 1: 1.06, 2: 1.12, 3: 1.19, 5: 1.38, 7: 1.50},
                           4: {0: 1.02, 1: 1.18, 2: 1.37, 3: 1.55, 5: 2.05, 7: 2.45}})
  spec = SpecDecoder(target, {"method": "dspark", "num_speculative_tokens": 6,
                              "confidence_schedule": True}, draft_model=module, cost_table=costs)
  return target, spec


def _prompts(n, seed):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, 64, int(rng.integers(4, 9))).tolist() for _ in range(n)]


def test_scheduled_rounds_keep_greedy_rows_and_compile_once(scheduled):
  target, spec = scheduled
  assert spec.drafter.lengths == (0, 1, 2, 3, 4, 6)
  kw = dict(max_new_tokens=30, temperature=[0.0, 0.0, 1.0], eos=False)
  spec.generate(_prompts(3, 1), **kw)
  prompts = _prompts(3, 2)
  with count_compiles() as c:
    out = spec.generate(prompts, seed=5, **kw)
  assert c.count == 0
  plain = Decoder(target).generate(prompts, max_new_tokens=30, eos=False).token_ids
  assert out.token_ids[:2] == plain[:2]
  assert sum(v > 0 for v in out.verified_lengths.values()) >= 2, out.verified_lengths


def test_the_schedule_reads_only_the_committed_context(scheduled):
  """The round's prefixes come from the draft alone: replaying propose with every token past the
  committed length changed (what the target will sample this round) gives the same prefixes."""
  from jspec.drafters.base import Context
  from jspec.sampling import SamplingParams
  from models import KVCache
  target, spec = scheduled
  seq = jnp.asarray(np.random.default_rng(3).integers(0, 64, (3, 16)), jnp.int32)
  taps = target(seq, KVCache.init(CFG, 3, 16), taps=spec.drafter.target_taps).hidden
  length = jnp.asarray([7, 9, 5], jnp.int32)
  ctx = Context(tokens=seq, length=length, prompt_len=length - 1,
                sampling=SamplingParams.make(3, 1.0), target_hidden=taps)
  params = spec.drafter_params
  state = spec.drafter.init_state(params, seq, ctx, 32)
  keys = jax.random.split(jax.random.key(0), 3)
  first, _ = spec.drafter.propose(params, state, ctx, keys)
  future = jnp.where(jnp.arange(16)[None] >= length[:, None], (seq + 7) % 64, seq)
  second, _ = spec.drafter.propose(params, state, Context(
      tokens=future, length=length, prompt_len=length - 1,
      sampling=ctx.sampling, target_hidden=taps), keys)
  np.testing.assert_array_equal(first.length, second.length)
  np.testing.assert_array_equal(first.tokens, second.tokens)
