"""lax.switch overhead of the adaptive round: a fixed D against adaptive configs forced to verify
the same D every round (same rounds, same acceptance), real model, ngram, B in {1, 4}, medians of 5
interleaved runs of ms per round. Run on a quiet machine: .venv/bin/python benchmarks/switch_overhead.py"""
import time, json, numpy as np
import models
from jspec import SpecDecoder
from jspec.adaptive import CostTable
lm = models.load("smollm2-135m-instruct")
tok = lm.tokenizer
p = "Rename x to total and give the whole function back: def add_all(vals):\n    x = 0\n    for v in vals:\n        x += v\n    return x"
ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]))
res = {}
for B in (1, 4):
  batch = [ids] * B
  decs = {}
  for d in (1, 3):
    decs[f"fixed{d}"] = SpecDecoder(lm.model, {"method": "ngram", "num_speculative_tokens": d}, eos_ids=tok.eos_ids)
    decs[f"switch{d}"] = SpecDecoder(lm.model, {"method": "ngram", "num_speculative_tokens": d, "draft_lengths": [0, d]},
                                      eos_ids=tok.eos_ids, cost_table=CostTable({1: {1: 100.0, d + 1: 1.0}}))
    decs[f"switch6_{d}"] = SpecDecoder(lm.model, {"method": "ngram", "num_speculative_tokens": "auto"},
                                      eos_ids=tok.eos_ids, cost_table=CostTable({1: {1: 100.0, 2: 100, 3: 100, 4: 100, 6: 100, 8: 100, d+1: 1.0}}))
  for k, dec in decs.items():
    dec.generate(batch, max_new_tokens=48)
  times = {k: [] for k in decs}
  for r in range(5):
    for k, dec in decs.items():
      out = dec.generate(batch, max_new_tokens=48)
      times[k].append(out.decode_s / max(out.steps, 1) * 1e3)
      if r == 0: print(B, k, out.steps, out.acceptance_length, out.verified_lengths, flush=True)
  res[B] = {k: float(np.median(v)) for k, v in times.items()}
  print(B, json.dumps(res[B]), flush=True)
