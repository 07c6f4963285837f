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


def test_median_interval_covers_the_true_median():
  rng = np.random.default_rng(1)
  covered = 0
  for t in range(200):
    x = np.exp(rng.normal(0.0, 0.2, 21))           # true median 1
    lo, hi = stats.median_interval(x.tolist(), draws=1000, seed=t)
    assert lo <= np.median(x) <= hi
    covered += lo <= 1.0 <= hi
  assert 0.8 <= covered / 200 <= 0.98                # a 90% interval, roughly
  assert stats.median_interval([1.2] * 5) == (1.2, 1.2)
  with pytest.raises(ValueError, match="no values"):
    stats.median_interval([])
  with pytest.raises(ValueError, match="level"):
    stats.median_interval([1.0], level=1.0)


def test_held_out_ratios_by_hand():
  runs = [1.0, 1.0, 1.0, 1.0]
  rivals = {"a": [1.0, 1.0, 1.0, 4.0], "b": [2.0, 2.0, 2.0, 0.5]}
  # geometric means without run j: a 4^(1/3), b 2^(1/3) for j < 3; a 1, b 2 for j = 3
  assert stats.held_out_ratios(runs, rivals) == pytest.approx([1.0, 1.0, 1.0, 2.0])
  # lower is better: b, b, b, then a
  assert stats.held_out_ratios(runs, rivals, higher_is_better=False) == pytest.approx(
      [0.5, 0.5, 0.5, 0.25])
  with pytest.raises(ValueError, match="at least 2"):
    stats.held_out_ratios([1.0], {"a": [1.0]})
  with pytest.raises(ValueError, match="paired"):
    stats.held_out_ratios(runs, {"a": [1.0]})


def test_held_out_ratios_remove_the_hindsight_bias():
  """Four configurations equal in truth, 6 noisy runs each: the best of three medians picked in
  hindsight makes the fourth look ~4% worse; judged against a rival picked without the run, ~0."""
  rng = np.random.default_rng(0)
  hindsight, held_out = [], []
  for _ in range(300):
    runs = np.exp(rng.normal(0.0, 0.1, 6))
    rivals = {d: np.exp(rng.normal(0.0, 0.1, 6)).tolist() for d in range(3)}
    best = max(rivals, key=lambda d: np.median(rivals[d]))
    hindsight.append(np.log(np.median(runs) / np.median(rivals[best])))
    held_out.append(np.log(np.median(stats.held_out_ratios(runs.tolist(), rivals))))
  assert np.mean(hindsight) < -0.025
  assert abs(np.mean(held_out)) < 0.01


def test_verdict():
  assert stats.verdict((0.98, 1.05), 0.97) == "holds"
  assert stats.verdict((0.90, 0.96), 0.97) == "fails"
  assert stats.verdict((0.95, 1.02), 0.97) == "open"
