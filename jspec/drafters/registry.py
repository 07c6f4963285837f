"""The drafter registry: one entry per method (name, options dataclass, builder, CLI flags).

`SpeculativeConfig`, `SpecDecoder`, `jspec generate --drafter`, `jspec bench --drafters` and the HF
peer all read it, so a new method is its own package (which registers itself on import, listed in
jspec/drafters/__init__.py) plus its tests.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class CliFlag:
  flag: str          # e.g. "--ngram-min"
  field: str         # the options field it sets
  type: Callable = str
  help: str = ""


@dataclasses.dataclass(frozen=True)
class Method:
  name: str                      # the config's "method", e.g. "layer_skip"
  options: type                  # frozen dataclass of the method's keys (validated in __post_init__)
  build: Callable[..., tuple[Any, Any]]   # (options, num_draft, target, draft_model) -> (drafter, params)
  help: str = ""
  cli_flags: tuple[CliFlag, ...] = ()

  @property
  def cli_name(self) -> str:     # "layer-skip"
    return self.name.replace("_", "-")


_METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
  if method.name in _METHODS and _METHODS[method.name] is not method:
    raise ValueError(f"speculative method {method.name!r} is registered twice")
  _METHODS[method.name] = method
  return method


def methods() -> dict[str, Method]:
  """Every registered method by config name (importing this module imports its package,
  jspec.drafters, which registers the built-ins)."""
  return dict(_METHODS)


def get(name: str) -> Method:
  """By config name ("layer_skip") or CLI name ("layer-skip")."""
  known = methods()
  key = name.replace("-", "_") if isinstance(name, str) else name
  if key not in known:
    raise ValueError(f"unknown speculative method {name!r}; choose one of "
                     f"{sorted(m.cli_name for m in known.values())}")
  return known[key]
