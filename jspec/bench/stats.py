"""Summary statistics the benchmarks report: median and spread of per-run ratios, bootstrap
intervals of a median, ratios against a rival picked without the run, goal verdicts."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def quantile(xs: Sequence[float], q: float) -> float:
  """Linear interpolation between closest ranks (numpy's default 'linear' method)."""
  if not xs:
    raise ValueError("quantile of no values")
  if not 0.0 <= q <= 1.0:
    raise ValueError(f"quantile q must be in [0, 1], got {q}")
  s = sorted(xs)
  pos = q * (len(s) - 1)
  lo = math.floor(pos)
  hi = min(lo + 1, len(s) - 1)
  return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(xs: Sequence[float]) -> dict:
  """median, quartiles and range of xs."""
  return dict(median=quantile(xs, 0.5), p25=quantile(xs, 0.25), p75=quantile(xs, 0.75),
              min=min(xs), max=max(xs))


def median_interval(xs: Sequence[float], level: float = 0.9, draws: int = 4000,
                    seed: int = 0) -> tuple[float, float]:
  """Percentile-bootstrap interval of the median of xs (the runs resampled with replacement)."""
  if not xs:
    raise ValueError("interval of no values")
  if not 0.0 < level < 1.0:
    raise ValueError(f"level must be in (0, 1), got {level}")
  x = np.asarray(xs, np.float64)
  idx = np.random.default_rng(seed).integers(0, len(x), size=(draws, len(x)))
  meds = np.median(x[idx], axis=1)
  tail = 100 * (1 - level) / 2
  lo, hi = np.percentile(meds, [tail, 100 - tail])
  return float(lo), float(hi)


def held_out_ratios(runs: Sequence[float], rivals: dict, higher_is_better: bool = True) -> list:
  """Per run j, runs[j] over the rival whose geometric mean over the *other* runs is best; rivals
  maps a name to its per-run values, paired with `runs` (the same batch and repeat at each index).
  The best of several noisy rivals picked in hindsight is biased up (its own luck picks it), so the
  rival run j is judged by is chosen without run j (by the mean log, which a category mixing fast
  and slow prompts does not flip the way a median of few runs does). Needs at least 2 runs."""
  n = len(runs)
  if n < 2:
    raise ValueError(f"held-out ratios need at least 2 paired runs, got {n}")
  if not rivals or any(len(v) != n for v in rivals.values()):
    raise ValueError(f"every rival needs {n} runs paired with the compared ones")
  logs = {k: np.log(np.asarray(v, np.float64)) for k, v in rivals.items()}
  sign = 1.0 if higher_is_better else -1.0
  out = []
  for j in range(n):
    rest = {k: (x.sum() - x[j]) / (n - 1) for k, x in logs.items()}
    pick = max(rest, key=lambda k: sign * rest[k])
    out.append(runs[j] / rivals[pick][j])
  return out


def verdict(interval: tuple[float, float], threshold: float) -> str:
  """'holds' when the whole interval is at or above the threshold, 'fails' when it is all below,
  'open' when the runs cannot tell."""
  lo, hi = interval
  return "holds" if lo >= threshold else "fails" if hi < threshold else "open"
