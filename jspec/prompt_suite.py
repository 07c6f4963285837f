"""Prompt suites, the prompt files that benchmarks, the planner and training read: JSON Lines of
chat prompts, each with a category and a source.

One object per line: {"id", "category", "messages": [{"role", "content"}, ...], "source"}; a plain
"prompt" string may stand for a single user message. Errors name the file and line.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections import Counter

ROLES = ("system", "user", "assistant")


class SuiteError(ValueError):
  """A prompt file that cannot be used as given."""


@dataclasses.dataclass(frozen=True)
class Prompt:
  id: str
  category: str
  messages: tuple[dict, ...]
  source: str


def _messages(obj: dict, where: str) -> tuple[dict, ...]:
  if ("messages" in obj) == ("prompt" in obj):
    raise SuiteError(f"{where}: give exactly one of \"messages\" (a list of {{role, content}}) "
                     "or \"prompt\" (a string)")
  if "prompt" in obj:
    obj = {"messages": [{"role": "user", "content": obj["prompt"]}]}
  msgs = obj["messages"]
  if not isinstance(msgs, list) or not msgs:
    raise SuiteError(f"{where}: \"messages\" must be a non-empty list of {{role, content}} objects")
  out = []
  for i, m in enumerate(msgs):
    if not isinstance(m, dict) or set(m) != {"role", "content"}:
      raise SuiteError(f"{where}: message {i} must be an object with exactly \"role\" and "
                       f"\"content\", got {m!r:.80}")
    if m["role"] not in ROLES:
      raise SuiteError(f"{where}: message {i} has unknown role {m['role']!r}; use one of {ROLES}")
    if not isinstance(m["content"], str) or not m["content"].strip():
      raise SuiteError(f"{where}: message {i} ({m['role']}) has empty content")
    out.append({"role": m["role"], "content": m["content"]})
  if out[-1]["role"] != "user":
    raise SuiteError(f"{where}: the last message must be the user's (the model answers it), "
                     f"got {out[-1]['role']!r}")
  return tuple(out)


def parse(lines, name: str = "<prompts>") -> list[Prompt]:
  """Parses JSON Lines text (an iterable of lines); blank lines are skipped."""
  prompts, seen = [], {}
  for n, line in enumerate(lines, 1):
    if not line.strip():
      continue
    where = f"{name}:{n}"
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise SuiteError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
      raise SuiteError(f"{where}: each line must be a JSON object, got {type(obj).__name__}")
    for key in ("id", "category"):
      if not isinstance(obj.get(key), str) or not obj[key].strip():
        raise SuiteError(f"{where}: missing or empty \"{key}\" (a non-empty string)")
    unknown = set(obj) - {"id", "category", "messages", "prompt", "source"}
    if unknown:
      raise SuiteError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: id, category, "
                       "messages or prompt, source")
    if obj["id"] in seen:
      raise SuiteError(f"{where}: id {obj['id']!r} already used on line {seen[obj['id']]}")
    seen[obj["id"]] = n
    source = obj.get("source", "")
    if not isinstance(source, str):
      raise SuiteError(f"{where}: \"source\" must be a string")
    prompts.append(Prompt(obj["id"], obj["category"], _messages(obj, where), source))
  if not prompts:
    raise SuiteError(f"{name}: no prompts in the file")
  return prompts


def load(path: str) -> list[Prompt]:
  """A JSON Lines prompt file (gzip-compressed when its name ends with .gz)."""
  try:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
      return parse(f, path)
  except (OSError, EOFError) as e:
    why = getattr(e, "strerror", None) or e
    raise SuiteError(f"cannot read the prompt file {path!r}: {why}") from None


def select(prompts: list[Prompt], categories=None, per_category: int | None = None) -> list[Prompt]:
  """The first `per_category` prompts of each chosen category, in file order."""
  have = Counter(p.category for p in prompts)
  if categories:
    missing = [c for c in categories if c not in have]
    if missing:
      raise SuiteError(f"no prompts of categor{'y' if len(missing) == 1 else 'ies'} {missing}; "
                       f"the file has {sorted(have)}")
  taken, out = Counter(), []
  for p in prompts:
    if categories and p.category not in categories:
      continue
    if per_category is not None and taken[p.category] >= per_category:
      continue
    taken[p.category] += 1
    out.append(p)
  return out
