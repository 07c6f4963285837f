"""The benchmark statistics against numpy, and the cost model's arithmetic."""

import numpy as np
import pytest

from jspec.bench import cost_model, stats


@pytest.mark.parametrize("n", [1, 2, 5, 16, 101])
def test_quantiles_match_numpy(n):
  xs = np.random.default_rng(n).lognormal(size=n).tolist()
  for q in (0.0, 0.25, 0.5, 0.75, 0.9, 1.0):
    assert stats.quantile(xs, q) == pytest.approx(np.percentile(xs, 100 * q), rel=1e-12)
  s = stats.spread(xs)
  assert s["median"] == pytest.approx(np.median(xs), rel=1e-12)
  assert s["min"] <= s["p25"] <= s["median"] <= s["p75"] <= s["max"]
  assert (s["min"], s["max"]) == (min(xs), max(xs))


def test_quantile_errors():
  with pytest.raises(ValueError, match="no values"):
    stats.quantile([], 0.5)
  with pytest.raises(ValueError, match=r"in \[0, 1\]"):
    stats.quantile([1.0], 1.5)


def test_cost_model_arithmetic():
  # every draft accepted, free drafting, verification as cheap as one step: D+1 tokens per step
  assert cost_model.predicted_speedup(4.0, 0.030, 0.030, 0.0) == pytest.approx(4.0)
  # AL 2, verify 1.5x a step, drafting 0.5 of a step: 2 / 2 = 1
  assert cost_model.predicted_speedup(2.0, 0.02, 0.03, 0.01) == pytest.approx(1.0)
  # at the break-even acceptance length the prediction is exactly 1
  be = cost_model.breakeven_acceptance_length(0.03, 0.049, 0.004)
  assert be == pytest.approx(53 / 30)
  assert cost_model.predicted_speedup(be, 0.03, 0.049, 0.004) == pytest.approx(1.0)


def test_cost_model_matches_a_simulated_timeline():
  """Rounds with per-round emitted tokens drawn at random: tokens/time of the timeline over the
  plain rate equals the formula with AL = mean emitted per round."""
  rng = np.random.default_rng(0)
  emitted = rng.integers(1, 5, size=1000)          # 1..D+1 with D = 3
  t1, tv, td = 0.03, 0.05, 0.01
  spec_rate = emitted.sum() / (len(emitted) * (tv + td))
  assert spec_rate / (1 / t1) == pytest.approx(
      cost_model.predicted_speedup(emitted.mean(), t1, tv, td), rel=1e-12)


def test_cost_model_errors():
  with pytest.raises(ValueError, match="at least 1"):
    cost_model.predicted_speedup(0.5, 1, 1, 0)
  with pytest.raises(ValueError, match="positive"):
    cost_model.predicted_speedup(2, 0, 1, 0)
