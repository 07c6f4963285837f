"""Builds adversarial.jsonl: prompts where speculation should not pay (issue 11's "never slower than
plain" check). Deterministic: `python benchmarks/prompts/adversarial.py`.

- random_tokens: strings of random letters and digits (no words, nothing for a drafter to copy)
- no_repeat: requests whose good replies never repeat a phrase (distinct items, no copying)
"""

import json
import random
from pathlib import Path

NO_REPEAT = [
    "Name twelve different animals, each from a different continent or ocean, one per line with "
    "one fact about it.",
    "Write a short poem about autumn in which no word appears twice.",
    "Give eight unrelated tips for a first job interview, each in a different style of sentence.",
    "Describe the taste of six different fruits without using the words sweet, sour or fruit.",
]


def main() -> None:
  rng = random.Random(11)
  alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
  rows = []
  for i in range(4):
    words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(2, 9))) for _ in range(60)]
    rows.append(dict(id=f"random_tokens-{i + 1:02d}", category="random_tokens",
                     prompt=" ".join(words), source="random letters (jspec, CC0)"))
  for i, text in enumerate(NO_REPEAT):
    rows.append(dict(id=f"no_repeat-{i + 1:02d}", category="no_repeat", prompt=text,
                     source="written for jspec (CC0)"))
  out = Path(__file__).with_name("adversarial.jsonl")
  out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


if __name__ == "__main__":
  main()
