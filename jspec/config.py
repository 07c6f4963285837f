"""Speculative decoding configuration: one validated dataclass, built from a dict the way vLLM's
`speculative_config` reads, e.g. {"method": "ngram", "num_speculative_tokens": 4}."""

from __future__ import annotations

import dataclasses
from typing import Any

METHODS = ("ngram", "draft_model", "layer_skip")
MAX_DRAFT = 64


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
  method: str
  num_speculative_tokens: int
  prompt_lookup_min: int | None = None   # ngram: shortest suffix n-gram to match
  prompt_lookup_max: int | None = None   # ngram: longest suffix n-gram to match
  draft_model: str | None = None         # draft_model: registered name, .gguf, folder or hub id
  num_layers: int | None = None          # layer_skip: how many of the target's layers draft
  draft_sampling: bool = True            # model drafters: sample from q (recorded) vs argmax

  def __post_init__(self):
    method = self.method.replace("-", "_") if isinstance(self.method, str) else self.method
    object.__setattr__(self, "method", method)
    if method not in METHODS:
      raise ValueError(f"unknown speculative method {self.method!r}; choose one of {list(METHODS)}")
    d = self.num_speculative_tokens
    if not isinstance(d, int) or isinstance(d, bool) or not 1 <= d <= MAX_DRAFT:
      raise ValueError(f"num_speculative_tokens must be an integer in [1, {MAX_DRAFT}], got {d!r} "
                       "(use plain decoding for 0)")
    if method == "ngram":
      lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
      if lo is None and hi is None:
        lo, hi = 1, 4
      lo, hi = (hi if lo is None else lo), (lo if hi is None else hi)
      if not 1 <= lo <= hi:
        raise ValueError(f"n-gram lookup needs 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                         f"{lo}, {hi}")
      object.__setattr__(self, "prompt_lookup_min", lo)
      object.__setattr__(self, "prompt_lookup_max", hi)
    if method == "layer_skip" and self.num_layers is not None and self.num_layers < 1:
      raise ValueError(f"layer_skip num_layers must be >= 1, got {self.num_layers}")

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "SpeculativeConfig":
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - fields)
    if unknown:
      raise ValueError(f"unknown speculative config keys {unknown}; valid keys: {sorted(fields)}")
    for key in ("method", "num_speculative_tokens"):
      if key not in d:
        raise ValueError(f"speculative config needs {key!r}")
    return cls(**d)
