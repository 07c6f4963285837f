"""What a round costs: the measured verify, draft and whole-round costs of the adaptive choice
(`CostTable`, written by `jspec plan`), and the built-in defaults used when none was measured.
Costs are in plain decode steps of the same batch and context."""

from __future__ import annotations

import bisect
import dataclasses
import json
from pathlib import Path

import jax
import numpy as np

# Verify cost T_verif(B, T) / T_verif(B, 1) of the default model, measured on the project's CPUs
# (benchmarks/REPORT.md, "Cheap multi-token verification on CPU", cpu_gemm) and on an H200 (bf16,
# benchmarks/results/verify_cost/h200.json, launch-bound: about flat). Used only when no measured table
# (`jspec plan`) is given; run the planner on your own hardware.
DEFAULT_VERIFY_COST = {
    "cpu": {1: {1: 1.0, 2: 1.02, 3: 1.08, 4: 1.23, 6: 1.35, 8: 1.40, 16: 1.88},
            4: {1: 1.0, 2: 1.14, 3: 1.28, 4: 1.40, 6: 1.62, 8: 1.84, 16: 2.82}},
    "gpu": {1: {1: 1.0, 8: 1.05, 16: 1.10}},
}
# The whole adaptive round verifying D, per plain decode step (D = 0: per step of the 4-step plain
# round), on the project's CPUs, per prompt padding (benchmarks/results/plan/cpu.json, `jspec plan
# --context 128,512`; fit by `fit_round_costs` where read): padding -> B -> D -> cost. Other
# drafters use n-gram's rows (the hybrid EAGLE-3's); no GPU rounds are measured yet.
DEFAULT_ROUND_COST = {
    "cpu": {"ngram": {
                128: {1: {0: 1.02, 1: 1.17, 2: 1.33, 3: 1.22, 5: 1.16, 7: 1.20},
                      4: {0: 0.95, 1: 1.06, 2: 1.50, 3: 1.66, 5: 2.29, 7: 2.83}},
                512: {1: {0: 1.03, 1: 1.27, 2: 1.29, 3: 1.37, 5: 1.32, 7: 1.47},
                      4: {0: 1.03, 1: 1.08, 2: 1.45, 3: 1.63, 5: 2.10, 7: 2.43}}},
            "eagle3": {
                128: {1: {0: 1.02, 1: 1.32, 2: 1.41, 3: 1.41, 5: 1.48, 7: 1.66},
                      4: {0: 1.07, 1: 1.33, 2: 1.90, 3: 2.50, 5: 3.40, 7: 4.40}},
                512: {1: {0: 1.00, 1: 1.31, 2: 1.48, 3: 1.52, 5: 1.60, 7: 1.69},
                      4: {0: 1.04, 1: 1.31, 2: 1.65, 3: 1.98, 5: 2.85, 7: 3.56}}}},
}


def _interp(points: dict[int, float], x: float) -> float:
  """Piecewise-linear through the points, extended linearly past the last two."""
  xs = sorted(points)
  if len(xs) == 1:
    return points[xs[0]]
  i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
  x0, x1 = xs[i - 1], xs[i]
  y0, y1 = points[x0], points[x1]
  return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


POWERS = (1.0, 0.75, 0.5, 0.25)   # the curves a + b D^p that fit_round_costs tries, line first


def fit_round_costs(points: dict[int, float]) -> dict[int, float]:
  """Measured round costs for D >= 1 replaced by the least-squares curve a + b D^p through them
  (p in POWERS, the one with the least squared error; b >= 0, a flat line at their mean where
  every slope falls): verifying more drafts never costs less, and the timing noise of one length
  is averaged over all of them. Left alone, a dip (D = 2 measured below D = 1) makes the choice
  prefer the longer length; a pooled non-decreasing fit has the same fault (equal costs, and the
  longer length always expects more tokens). A line alone (p = 1) overprices D = 1 where a wider
  verify costs less per added draft (B = 4 on CPU: 53, 76, 91, 117, 137 ms at D = 1, 2, 3, 5, 7;
  the line through them puts D = 1 at 58, the best curve, p = 3/4, at 54), which tips the choice
  toward plain rounds. D = 0 (the plain round, priced per step) is kept as measured."""
  ds = sorted(d for d in points if d >= 1)
  out = {d: c for d, c in points.items() if d < 1}
  if len(ds) < 2:
    return {**out, **{d: points[d] for d in ds}}
  ys = np.asarray([points[d] for d in ds], np.float64)
  best = None
  for p in POWERS:
    xs = np.asarray(ds, np.float64) ** p
    slope = max(float(np.polyfit(xs, ys, 1)[0]), 0.0)
    fit = ys.mean() + slope * (xs - xs.mean())
    err = float(np.sum((fit - ys) ** 2))
    if best is None or err < best[0] - 1e-12 * float(np.sum(ys ** 2)):
      best = (err, fit)
  return {**out, **{d: float(c) for d, c in zip(ds, best[1])}}


@dataclasses.dataclass(frozen=True)
class CostTable:
  """Per batch size: verify cost {T: T_verif(B, T) / T_verif(B, 1)} and draft cost
  {D: T_draft(B, D) / T_verif(B, 1)} (missing draft entries cost 0: model-free drafters); the
  drafter's calibrated conditional acceptance per draft position (the adaptive estimates' starting
  point; empty: 0.5 everywhere); and, when measured (`jspec plan`), the whole adaptive round
  {D: seconds per round verifying D / seconds per plain decode step}, which the choice then uses
  instead of verify + draft: it holds what the forward timings miss (acceptance, commit, the
  drafter's per-round upkeep, so that D = 0 costs more than a plain step for EAGLE-3). The D = 0
  entry is per token of the plain round (seconds per plain round / its steps / seconds per plain
  decode step), so that tables measured with any number of plain steps per round compare.

  A round's own work takes about the same time at any context while a plain step costs more over a
  longer cache, so its cost in steps falls as the prompt padding grows. `round_at` holds round
  tables measured at several paddings ({padding: {B: {D: cost}}}, `jspec plan --context 128,512`);
  a decoder then prices its rounds at its own prompt padding, linear in log2(padding) between the
  measured ones and clamped outside them. `round` is the table at the largest padding."""
  verify: dict[int, dict[int, float]]
  draft: dict[int, dict[int, float]] = dataclasses.field(default_factory=dict)
  source: str = ""
  acceptance: tuple[float, ...] = ()
  round: dict[int, dict[int, float]] = dataclasses.field(default_factory=dict)
  round_at: dict[int, dict[int, dict[int, float]]] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if not self.verify or any(not v for v in self.verify.values()):
      raise ValueError("a cost table needs at least one batch size with verify costs")
    for b, row in self.verify.items():
      for t, c in row.items():
        if not (int(b) >= 1 and int(t) >= 1 and float(c) > 0):
          raise ValueError(f"bad verify cost entry B={b}, T={t}: {c} (need B, T >= 1, cost > 0)")
    for pad, table in [(None, self.round)] + list(self.round_at.items()):
      if pad is not None and not (int(pad) >= 1 and table):
        raise ValueError(f"bad round cost padding {pad!r}: need a padding >= 1 with a table")
      for b, row in table.items():
        for d, c in row.items():
          if not (int(b) >= 1 and int(d) >= 0 and float(c) > 0):
            raise ValueError(f"bad round cost entry B={b}, D={d}: {c} (need B >= 1, D >= 0, "
                             "cost > 0)")
    if self.round_at and not self.round:
      object.__setattr__(self, "round", self.round_at[max(self.round_at)])
    if not all(0.0 <= float(a) <= 1.0 for a in self.acceptance):
      raise ValueError(f"acceptance probabilities must lie in [0, 1], got {self.acceptance}")

  @staticmethod
  def _row(table: dict, b: int) -> dict | None:
    if not table:
      return None
    keys = sorted(table)
    below = [k for k in keys if k <= b]
    return table[below[-1] if below else keys[0]]

  def verify_cost(self, b: int, t: int) -> float:
    return _interp(self._row(self.verify, b), t)

  def draft_cost(self, b: int, d: int) -> float:
    row = self._row(self.draft, b)
    return 0.0 if row is None or d == 0 else max(_interp(row, d), 0.0)

  @property
  def paddings(self) -> tuple[int, ...]:
    """The prompt paddings the round costs were measured at (none: one table for all)."""
    return tuple(sorted(self.round_at))

  def round_costs(self, b: int, lengths: tuple[int, ...], d_max: int,
                  variable_length: bool = False, plain: int = 1,
                  explore_every: int = 0, padding: int | None = None) -> list[float]:
    """cost_k of a round that verifies 1 + lengths[k], in T_verif(B, 1): the measured round when
    the table has it (a curve in D, `fit_round_costs`; at `padding` where `round_at` has tables),
    else verify + draft after drafting d_max tokens, or (variable_length) lengths[k] drafts plus
    one in every `explore_every`-th round (one in a plain round). A plain round (lengths[k] = 0)
    runs `plain` steps."""
    steps = [plain if d == 0 else 1 for d in lengths]
    if self.round_at and padding is not None:
      pads = self.paddings
      per = np.asarray([self._round_costs(self.round_at[p], b, lengths, steps) for p in pads])
      x = np.log2(max(int(padding), 1))
      return [float(np.interp(x, np.log2(pads), per[:, k])) for k in range(len(lengths))]
    if self.round:
      return self._round_costs(self.round, b, lengths, steps)
    extra = 1.0 / explore_every if explore_every else 0.0
    drafted = [min(d + (1.0 if d == 0 else extra), d_max) if variable_length else d_max
               for d in lengths]
    return [m * self.verify_cost(b, 1 + d) + self.draft_cost(b, n)
            for d, n, m in zip(lengths, drafted, steps)]

  def _round_costs(self, table, b, lengths, steps) -> list[float]:
    row = fit_round_costs(self._row(table, b))
    spec = {d: c for d, c in row.items() if d >= 1} or row     # the line, for D >= 1
    cost = lambda d: row[d] if d in row else _interp(spec if d >= 1 else row, d)
    return [max(cost(d), 1e-3) * m for d, m in zip(lengths, steps)]

  @classmethod
  def default(cls, backend: str | None = None, method: str | None = None) -> "CostTable":
    backend = backend or jax.default_backend()
    table = DEFAULT_VERIFY_COST.get(backend, DEFAULT_VERIFY_COST["gpu"])
    rounds = DEFAULT_ROUND_COST.get(backend, {})
    method = "eagle3" if method == "hybrid" else method   # its default learned side drafts
    return cls(verify=table, round_at=rounds.get(method, rounds.get("ngram", {})),
               source=f"built-in defaults for {backend}")

  def to_dict(self) -> dict:
    conv = lambda t: {str(b): {str(k): c for k, c in r.items()} for b, r in t.items()}
    out = dict(verify=conv(self.verify), draft=conv(self.draft), round=conv(self.round),
               acceptance=list(self.acceptance), source=self.source)
    if self.round_at:
      out["round_at"] = {str(p): conv(t) for p, t in self.round_at.items()}
    return out

  @classmethod
  def from_dict(cls, d: dict) -> "CostTable":
    try:
      conv = lambda t: {int(b): {int(k): float(v) for k, v in r.items()} for b, r in t.items()}
      return cls(verify=conv(d["verify"]), draft=conv(d.get("draft", {})),
                 round=conv(d.get("round", {})), source=d.get("source", ""),
                 acceptance=tuple(float(a) for a in d.get("acceptance", ())),
                 round_at={int(p): conv(t) for p, t in d.get("round_at", {}).items()})
    except (KeyError, TypeError, ValueError, AttributeError) as e:
      raise ValueError(f"not a cost table ({e}); expected {{'verify': {{B: {{T: cost}}}}, "
                       "'draft': {B: {D: cost}}}, as `jspec plan` writes") from None

  @classmethod
  def load(cls, path: str | Path, method: str | None = None) -> "CostTable":
    """A cost table JSON, or a `jspec plan` report (its table for `method` when it has one)."""
    try:
      data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
      raise ValueError(f"cannot read the cost table {path}: {e}") from None
    if not isinstance(data, dict):
      raise ValueError(f"{path} is not a cost table or a jspec plan report")
    per_method = data.get("cost_tables", {})
    return cls.from_dict(per_method.get(method) or data.get("cost_table", data))
