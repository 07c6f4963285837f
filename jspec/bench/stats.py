"""Summary statistics the benchmarks report: median and spread of per-batch ratios."""

from __future__ import annotations

import math
from typing import Sequence


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
