"""The speculative-decoding cost model: the speedup that measured component times predict.

A round costs one draft (T_draft, all D proposals) plus one target pass over 1+D tokens
(T(1+D)) and yields AL tokens on average; plain decoding yields one token per T(1). Hence
  speedup = AL * T(1) / (T(1+D) + T_draft).
"""

from __future__ import annotations


def predicted_speedup(acceptance_length: float, t1: float, t_verify: float, t_draft: float) -> float:
  """acceptance_length: tokens per round (bonus included); t1: one plain decode step;
  t_verify: the target over 1+D tokens; t_draft: drafting D tokens (same time unit)."""
  if acceptance_length < 1:
    raise ValueError(f"acceptance length is at least 1 (the bonus token), got {acceptance_length}")
  if t1 <= 0 or t_verify <= 0 or t_draft < 0:
    raise ValueError(f"times must be positive (t_draft may be 0): t1={t1}, t_verify={t_verify}, "
                     f"t_draft={t_draft}")
  return acceptance_length * t1 / (t_verify + t_draft)


def breakeven_acceptance_length(t1: float, t_verify: float, t_draft: float) -> float:
  """The acceptance length at which speculation only pays for itself."""
  return (t_verify + t_draft) / t1
