"""Target-written prompts steered by family (Magpie with opening words): the target continues a
user turn that starts with one of a family's opening words, so the corpus also holds requests
phrased the way a chat user (as the target imagines one) phrases them, beside the template
families. One JSON Lines file per family; merge them with `jspec train prompts --include`.

  jspec train magpie OUT_DIR --per-family 500 [--batch-size 64] [--seed 0]
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from typing import Sequence

import numpy as np

from jspec.slots import Request, SlotDecoder
from jspec.train.chat import clean_user_turn, user_header
from jspec.train.shards import derive_seed, progress_bar, read_jsonl, unpack_model, write_atomic

SYNTH_BATCHES_PER_CALL = 4   # Magpie batches sampled per SlotDecoder call (refill across them)


def synthesize_prompts(model, tokenizer, out_path: str, *, num_prompts: int, batch_size: int,
                       max_new_tokens: int = 96, temperature: float = 1.0, top_p: float = 0.95,
                       seed: int = 0, system: str | None = None, model_name: str | None = None,
                       openings: Sequence[str] = ("",), category: str = "magpie",
                       drop_truncated: bool = True, progress: bool = True) -> list[dict]:
  """Samples user turns from the target given only its chat template's user header (Magpie) and
  appends them to `out_path` (JSON Lines, the benchmark suite's format); returns the first
  `num_prompts` records.

  openings steer the turns toward a kind of request: row r of batch b starts its user turn with
  openings[(b * batch_size + r) % len(openings)] (e.g. "Write a poem about") and the target
  writes the rest; records get `category` and ids `<category>-<batch>-<row>`.

  Drops turns that are empty, shorter than MIN_PROMPT_CHARS, contain special tokens, repeat an
  earlier one exactly, or (drop_truncated) did not end with EOS within max_new_tokens. Resumable
  and deterministic: batch b is always sampled with a seed derived from (seed, b), and a record's
  id names its batch and row, so a restarted or extended run equals an uninterrupted one.
  """
  model, name = unpack_model(model, model_name)
  if num_prompts < 0 or batch_size < 1 or max_new_tokens < 1:
    raise ValueError("num_prompts must be >= 0, batch_size and max_new_tokens >= 1")
  if not tokenizer.eos_ids:
    raise ValueError("the tokenizer has no EOS ids; a sampled user turn could never end")
  openings = list(openings)
  if not openings or not all(isinstance(o, str) for o in openings):
    raise ValueError(f"openings must be a non-empty list of strings, got {openings!r:.80}")
  header = user_header(tokenizer, system)
  starts = [list(tokenizer.encode(header + o)) for o in openings]
  source = (f"magpie: user turn sampled by {name} from the chat template's user header, "
            f"T={temperature} top-p {top_p}, max {max_new_tokens} tokens, seed {seed}"
            + (f", system prompt {system!r}" if system else "")
            + (f", opening words {openings!r}" if openings != [""] else ""))
  records = read_jsonl(out_path) if os.path.exists(out_path) else []
  for r in records:
    if r.get("source") != source:
      raise ValueError(f"{out_path} holds prompts made otherwise ({r.get('source')!r}); this run "
                       f"would make {source!r}. Use another out_path.")
  if len(records) >= num_prompts:
    return records[:num_prompts]

  have_ids = {r["id"] for r in records}
  seen = {r["messages"][-1]["content"] for r in records}
  # redo the last recorded batch (deterministic), taking only rows not recorded yet
  batch = max((int(r["id"].split("-")[-2]) for r in records), default=0)
  dec = SlotDecoder(model, eos_ids=tokenizer.eos_ids, slots=batch_size,
                    max_len=max(map(len, starts)) + max_new_tokens + 1,
                    max_new_tokens=max_new_tokens)
  opening = lambda bt, row: (bt * batch_size + row) % len(openings)
  reasons, empty_batches = Counter(), 0
  bar = progress_bar(progress, total=num_prompts, initial=len(records), unit="prompt",
                  desc="magpie prompts")
  t0 = time.perf_counter()
  while len(records) < num_prompts:
    group = range(batch, batch + SYNTH_BATCHES_PER_CALL)
    res = dec.generate([Request(starts[opening(bt, row)], max_new_tokens, temperature,
                                top_p=top_p, seed=derive_seed(seed, bt, row))
                        for bt in group for row in range(batch_size)])
    for g, bt in enumerate(group):
      before = len(records)
      for row in range(batch_size):
        rid = f"{category}-{bt:06d}-{row:04d}"
        if rid in have_ids:
          continue
        text, why = clean_user_turn(tokenizer, res[g * batch_size + row].token_ids,
                                     drop_truncated, openings[opening(bt, row)])
        if text is not None and text in seen:
          text, why = None, "duplicate"
        reasons[why] += 1
        if text is None or len(records) >= num_prompts:
          continue
        seen.add(text)
        have_ids.add(rid)
        messages = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": text}]
        records.append({"id": rid, "category": category, "messages": messages, "source": source})
      empty_batches = 0 if len(records) > before else empty_batches + 1
      if empty_batches >= 20:
        raise RuntimeError(f"20 batches in a row gave no usable user turn ({dict(reasons)}); check "
                           "the chat template, the temperature and max_new_tokens")
      bar.update(len(records) - before)
    write_atomic(out_path, "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                    for r in records).encode())
    bar.set_postfix(tok_s=f"{dec.stats['generated_tokens'] / (time.perf_counter() - t0):.0f}",
                    kept=f"{reasons['kept']}/{sum(reasons.values())}")
    batch += SYNTH_BATCHES_PER_CALL
  bar.close()
  return records[:num_prompts]


# family -> opening words of the user turn (the target writes the rest)
STEERED = {
    "stem": ("Explain how", "Why does", "What is the difference between", "How does",
             "Can you explain the science behind", "What happens when", "Describe the process of",
             "How do scientists", "What causes", "In simple terms, what is"),
    "humanities": ("What were the main causes of", "How did", "Discuss the significance of",
                   "Compare the ideas of", "Summarize the history of", "What role did",
                   "Why is the book", "What can we learn from", "How has the meaning of",
                   "Analyze the themes of"),
    "writing": ("Write a short story about", "Write a poem about", "Compose an email to",
                "Draft a speech for", "Write a blog post about", "Rewrite the following",
                "Write a letter to", "Create a dialogue between", "Write a product description for",
                "Give me a catchy slogan for"),
    "roleplay": ("Pretend you are", "Let's role-play: you are", "Act as", "Imagine you are",
                 "You are a", "Play the role of", "Stay in character as"),
    "advice": ("How can I", "What should I do if", "Any tips for", "What's the best way to",
               "I'm struggling with", "Can you help me plan", "How do I convince",
               "Is it a good idea to"),
    "reasoning": ("A riddle:", "Solve this logic puzzle:", "If all", "Which is heavier,",
                  "Three friends", "What comes next in the sequence", "Is the following argument "
                  "valid:", "Suppose that"),
    "open": ("",),
}


def family_seed(seed: int, family: str) -> int:
  return int(np.random.SeedSequence([seed, *family.encode()]).generate_state(1)[0] >> 1)


def synthesize_families(model, tokenizer, out_dir: str, *, per_family: int, batch_size: int = 64,
                        max_new_tokens: int = 96, seed: int = 0, families=None,
                        progress: bool = True) -> dict[str, str]:
  """Samples `per_family` steered user turns for each family into out_dir/magpie_<family>.jsonl
  (resumable, deterministic: `synthesize_prompts`); returns family -> path."""
  families = list(STEERED) if families is None else list(families)
  unknown = [f for f in families if f not in STEERED]
  if unknown:
    raise ValueError(f"unknown families {unknown}; choose from {sorted(STEERED)}")
  if per_family < 1:
    raise ValueError(f"--per-family must be >= 1, got {per_family}")
  os.makedirs(out_dir, exist_ok=True)
  paths = {}
  for family in families:
    paths[family] = os.path.join(out_dir, f"magpie_{family}.jsonl")
    synthesize_prompts(model, tokenizer, paths[family], num_prompts=per_family,
                       batch_size=batch_size, max_new_tokens=max_new_tokens,
                       seed=family_seed(seed, family), openings=STEERED[family],
                       category=family, progress=progress)
  return paths
