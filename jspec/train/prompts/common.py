"""What every prompt family shares: the candidate record, seeded choices, a cap on how often one
passage is quoted, and the token estimate."""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Sequence, TypeVar

import numpy as np

T = TypeVar("T")

CC0 = "written for jspec (CC0)"
PASSAGE_CAP = 3          # prompts per distinct passage, over all families
LONG_TOKENS = 1000       # a prompt of at least this many estimated tokens counts as long
SHORT_PASSAGE = 600      # estimated tokens of a passage in a short prompt, at most
LONG_PASSAGE = (1000, 2100)   # estimated tokens of a passage in a long prompt
# Token estimate (no tokenizer needed): runs of up to 12 letters (longer runs, such as base64,
# count once per 12), single digits and single punctuation marks. On this corpus SmolLM2's real count is 1.06x this (median; 5-95 %: 0.96-1.18x), where
# characters / 4 was off by up to 3x on digit-heavy code.
_PIECE = re.compile(r"[^\W\d_]{1,12}|\d|[^\w\s]|_")


@dataclasses.dataclass
class Candidate:
  """A prompt before filtering. `passage` names the quoted passage ("" if none) and `request` is
  the prompt's own text around it; both only serve the near-duplicate rule (see dedup.py)."""
  category: str
  messages: list[dict]
  source: str
  passage: str = ""
  request: str = ""

  @property
  def text(self) -> str:
    return "\n".join(m["content"] for m in self.messages)


def user(text: str, system: str | None = None) -> list[dict]:
  return ([{"role": "system", "content": system}] if system else []) + \
      [{"role": "user", "content": text}]


def est_tokens(text: str) -> int:
  return len(_PIECE.findall(text))


def pick(rng: np.random.Generator, seq: Sequence[T]) -> T:
  return seq[int(rng.integers(len(seq)))]


def chance(rng: np.random.Generator, p: float) -> bool:
  return bool(rng.random() < p)


def fence(code: str, lang: str = "python") -> str:
  return f"```{lang}\n{code}\n```"


class Uses:
  """Counts how often each passage key has been quoted; hands out the least used first, never one
  at PASSAGE_CAP."""

  def __init__(self):
    self.counts: dict[str, int] = {}

  def take(self, rng: np.random.Generator, items: Sequence[T], n: int,
           key: Callable[[T], str]) -> list[T]:
    order = rng.permutation(len(items))
    order = sorted(order, key=lambda i: self.counts.get(key(items[i]), 0))   # stable
    out = []
    for i in order:
      if len(out) == n:
        break
      k = key(items[i])
      if self.counts.get(k, 0) < PASSAGE_CAP:
        self.counts[k] = self.counts.get(k, 0) + 1
        out.append(items[i])
    return out


def split_long(n: int, share: float) -> tuple[int, int]:
  """(short, long) counts for n prompts of which `share` are long."""
  long = int(round(n * share))
  return n - long, long
