"""Speculative decoding configuration: one validated object, built from a dict the way vLLM's
`speculative_config` reads, e.g. {"method": "ngram", "num_speculative_tokens": 4}. The method's own
keys live in its registered options dataclass (jspec/drafters/registry.py).

`num_speculative_tokens: "auto"` (or a `draft_lengths` list) makes the draft length adaptive: every
round verifies one of the compiled lengths, chosen from the acceptance of earlier rounds and the
measured verify cost (jspec/adaptive.py); 0 among them is a plain decode step. `per_row: True`
splits a round's drafts between the rows of a batch by their own acceptance (rows verify different
numbers of drafts in one packed verify)."""

from __future__ import annotations

import dataclasses
from typing import Any

from jspec.adaptive import DEFAULT_LENGTHS, validate_lengths
from jspec.drafters import registry

MAX_DRAFT = 64
TOP_KEYS = ("method", "num_speculative_tokens", "draft_lengths", "per_row")


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
  method: str
  num_speculative_tokens: int | str   # D, or "auto" (adaptive over draft_lengths)
  options: Any = None      # the method's options dataclass (defaults when None)
  draft_lengths: tuple[int, ...] | None = None   # adaptive: the lengths a round may verify
  per_row: bool = False    # adaptive, B > 1: a round at length D verifies B x D drafts, split
                           # between the rows by their acceptance estimates

  def __post_init__(self):
    entry = registry.get(self.method)
    object.__setattr__(self, "method", entry.name)
    d = self.num_speculative_tokens
    if d == "auto":
      lengths = validate_lengths(self.draft_lengths or DEFAULT_LENGTHS)
      object.__setattr__(self, "draft_lengths", lengths)
      d = lengths[-1]
    elif self.draft_lengths is not None:
      if isinstance(d, int) and not isinstance(d, bool):
        object.__setattr__(self, "draft_lengths", validate_lengths(self.draft_lengths, d))
    if not isinstance(d, int) or isinstance(d, bool) or not 1 <= d <= MAX_DRAFT:
      raise ValueError(f"num_speculative_tokens must be an integer in [1, {MAX_DRAFT}] or 'auto', "
                       f"got {self.num_speculative_tokens!r} (use plain decoding for 0)")
    if not isinstance(self.per_row, bool):
      raise ValueError(f"per_row must be true or false, got {self.per_row!r}")
    if self.per_row and self.draft_lengths is None:
      raise ValueError("per_row splits adaptive draft lengths between rows: set "
                       "num_speculative_tokens='auto' (or draft_lengths) with it")
    if self.options is None:
      object.__setattr__(self, "options", entry.options())
    elif not isinstance(self.options, entry.options):
      raise ValueError(f"options for {entry.name!r} must be a {entry.options.__name__}, got "
                       f"{type(self.options).__name__}")
    if self.adaptive and (getattr(self.options, "tree_top_k", 0)
                          or getattr(self.options, "tree_choices", None)):
      raise ValueError("adaptive draft lengths (num_speculative_tokens='auto' or draft_lengths) "
                       "work with chains only; give a tree drafter a fixed node budget "
                       "(num_speculative_tokens=N)")

  @property
  def max_draft(self) -> int:
    """D_max: the drafts proposed per round."""
    return self.draft_lengths[-1] if self.adaptive else self.num_speculative_tokens

  @property
  def adaptive(self) -> bool:
    return self.draft_lengths is not None

  @property
  def entry(self) -> registry.Method:
    return registry.get(self.method)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "SpeculativeConfig":
    for key in ("method", "num_speculative_tokens"):
      if key not in d:
        raise ValueError(f"speculative config needs {key!r}")
    entry = registry.get(d["method"])
    rest = {k: v for k, v in d.items() if k not in TOP_KEYS}
    fields = {f.name for f in dataclasses.fields(entry.options)}
    unknown = sorted(set(rest) - fields)
    if unknown:
      valid = sorted(fields | set(TOP_KEYS))
      raise ValueError(f"unknown speculative config keys {unknown} for method {entry.name!r}; "
                       f"valid keys: {valid}")
    lengths = d.get("draft_lengths")
    return cls(entry.name, d["num_speculative_tokens"], entry.options(**rest),
               None if lengths is None else validate_lengths(lengths), d.get("per_row", False))

  def to_dict(self) -> dict[str, Any]:
    extra = {} if self.draft_lengths is None else {"draft_lengths": list(self.draft_lengths)}
    if self.per_row:
      extra["per_row"] = True
    return dict(method=self.method, num_speculative_tokens=self.num_speculative_tokens, **extra,
                **dataclasses.asdict(self.options))
