"""Speculative vs plain decoding of the same prompts, in one process, interleaved after warm-up.

For every (drafter, D, batch size, category) it runs plain and speculative generation of the same
batch `repeats` times, alternating, and reports the median speedup with its spread, acceptance
length, per-position acceptance, and whether greedy outputs were identical to plain decoding.
"""

from __future__ import annotations

import statistics

from jspec.config import SpeculativeConfig
from jspec.decode import Decoder
from jspec.spec_decode import SpecDecoder

COPY_PROMPTS = [
    "Rename the function `add` to `plus` and return the full code unchanged otherwise:\n"
    "def add(a, b):\n    return a + b\n\n\ndef add_all(xs):\n    total = 0\n    for x in xs:\n"
    "        total = add(total, x)\n    return total\n",
    "Repeat the following text exactly, word for word: The committee met on Tuesday to review "
    "the budget. The committee approved the budget and adjourned the meeting at noon.",
    "Fix the spelling mistakes and rewrite the paragraph: Teh weather was nice, so we went to "
    "teh park. We played footbal and ate sandwhiches under a big tree until evening.",
    "Add type hints to this code and return it:\ndef area(width, height):\n    return width * "
    "height\n\ndef perimeter(width, height):\n    return 2 * (width + height)\n",
]
OPEN_PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a hash table works.",
    "What are the benefits of regular exercise?",
    "Describe a sunset over the ocean.",
]
CATEGORIES = {"copy": COPY_PROMPTS, "open": OPEN_PROMPTS}


def _spec_config(drafter: str, d: int, layers: int | None) -> SpeculativeConfig:
  cfg = {"method": drafter, "num_speculative_tokens": d}
  if drafter.replace("-", "_") == "layer_skip" and layers:
    cfg["num_layers"] = layers
  return SpeculativeConfig.from_dict(cfg)


def run(loaded, drafters=("ngram", "layer_skip"), num_draft=(1, 2, 3, 5, 7), batch_sizes=(1, 4),
        max_new_tokens=64, repeats=5, temperature=0.0, layer_skip_layers=None, progress=None) -> dict:
  tok = loaded.tokenizer
  prompts = {c: [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in ps]
             for c, ps in CATEGORIES.items()}
  plain = Decoder(loaded.model, eos_ids=tok.eos_ids)
  kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, eos=False)
  results = []
  for drafter in drafters:
    for d in num_draft:
      spec = SpecDecoder(loaded.model, _spec_config(drafter, d, layer_skip_layers),
                         eos_ids=tok.eos_ids)
      for b in batch_sizes:
        for cat, ps in prompts.items():
          batch = [ps[i % len(ps)] for i in range(b)]
          base_out = plain.generate(batch, seed=0, **kw)        # warm-up (and compile) both
          spec.generate(batch, seed=0, **kw)
          ratios, base_rates, spec_rates, outs = [], [], [], []
          for r in range(repeats):
            base_out = plain.generate(batch, seed=r, **kw)
            out = spec.generate(batch, seed=r, **kw)
            base_rates.append(base_out.tokens_per_s)
            spec_rates.append(out.tokens_per_s)
            ratios.append(out.tokens_per_s / base_out.tokens_per_s)
            outs.append((out, base_out))
          out = outs[-1][0]
          results.append(dict(
              drafter=drafter, num_draft=d, batch_size=b, temperature=temperature, category=cat,
              max_new_tokens=max_new_tokens, repeats=repeats,
              acceptance_length=out.acceptance_length,
              per_position_acceptance=out.per_position_acceptance,
              tokens_per_s=statistics.median(spec_rates),
              baseline_tokens_per_s=statistics.median(base_rates),
              speedup=statistics.median(ratios), speedup_min=min(ratios), speedup_max=max(ratios),
              same_as_plain=(all(o.token_ids == bo.token_ids for o, bo in outs)
                             if temperature == 0 else None)))
          if progress:
            progress(results[-1])
  return dict(model=loaded.name, results=results)


def markdown(report: dict) -> str:
  lines = ["| drafter | D | B | category | AL | speedup (min–max) | spec tok/s | plain tok/s | same |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in report["results"]:
    lines.append(f"| {r['drafter']} | {r['num_draft']} | {r['batch_size']} | {r['category']} | "
                 f"{r['acceptance_length']:.2f} | {r['speedup']:.2f} ({r['speedup_min']:.2f}–"
                 f"{r['speedup_max']:.2f}) | {r['tokens_per_s']:.1f} | "
                 f"{r['baseline_tokens_per_s']:.1f} | {r['same_as_plain']} |")
  return "\n".join(lines)
