"""Speculative decoding configuration: one validated object, built from a dict the way vLLM's
`speculative_config` reads, e.g. {"method": "ngram", "num_speculative_tokens": 4}. The method's own
keys live in its registered options dataclass (jspec/drafters/registry.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from jspec.drafters import registry

MAX_DRAFT = 64


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
  method: str
  num_speculative_tokens: int
  options: Any = None      # the method's options dataclass (defaults when None)

  def __post_init__(self):
    entry = registry.get(self.method)
    object.__setattr__(self, "method", entry.name)
    d = self.num_speculative_tokens
    if not isinstance(d, int) or isinstance(d, bool) or not 1 <= d <= MAX_DRAFT:
      raise ValueError(f"num_speculative_tokens must be an integer in [1, {MAX_DRAFT}], got {d!r} "
                       "(use plain decoding for 0)")
    if self.options is None:
      object.__setattr__(self, "options", entry.options())
    elif not isinstance(self.options, entry.options):
      raise ValueError(f"options for {entry.name!r} must be a {entry.options.__name__}, got "
                       f"{type(self.options).__name__}")

  @property
  def entry(self) -> registry.Method:
    return registry.get(self.method)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "SpeculativeConfig":
    for key in ("method", "num_speculative_tokens"):
      if key not in d:
        raise ValueError(f"speculative config needs {key!r}")
    entry = registry.get(d["method"])
    rest = {k: v for k, v in d.items() if k not in ("method", "num_speculative_tokens")}
    fields = {f.name for f in dataclasses.fields(entry.options)}
    unknown = sorted(set(rest) - fields)
    if unknown:
      valid = sorted(fields | {"method", "num_speculative_tokens"})
      raise ValueError(f"unknown speculative config keys {unknown} for method {entry.name!r}; "
                       f"valid keys: {valid}")
    return cls(entry.name, d["num_speculative_tokens"], entry.options(**rest))

  def to_dict(self) -> dict[str, Any]:
    return dict(method=self.method, num_speculative_tokens=self.num_speculative_tokens,
                **dataclasses.asdict(self.options))
