"""Per-row draft lengths on a mixed batch: B = 4 suite prompts, two that copy from their input
(code_editing) and two open-ended (writing; the first two of each in the suite), decoded together
by plain decoding, every fixed draft length, `auto` (one width for the batch) and `auto` with
`per_row` (a round's drafts split between the rows by their acceptance, one packed verify).
Interleaved runs, medians of per-run paired speedups over plain decoding; JSON out. Quiet machine:
  .venv/bin/python benchmarks/scripts/per_row.py --json benchmarks/results/per_row/cpu.json
"""
import argparse
import json
import os

import numpy as np

from jspec import SpecDecoder
from jspec.decode import Decoder
from suite_setup import default_model_and_prompts

ap = argparse.ArgumentParser()
ap.add_argument("--methods", default="ngram")
ap.add_argument("--categories", default="code_editing,writing",
                help="the copy-heavy and the open-ended category")
ap.add_argument("--per-category", type=int, default=2)
ap.add_argument("--fixed", default="1,2,3,5,7")
ap.add_argument("--max-new-tokens", type=int, default=128)
ap.add_argument("--repeats", type=int, default=5)
ap.add_argument("--json", default=None)
args = ap.parse_args()

lm, tok, ids, kw = default_model_and_prompts(args.categories, args.max_new_tokens,
                                             args.per_category)
report = dict(vars(args), results={})
for method in args.methods.split(","):
  decs = {"plain": Decoder(lm.model, eos_ids=tok.eos_ids)}
  for d in args.fixed.split(","):
    decs[f"D={d}"] = SpecDecoder(lm.model, {"method": method, "num_speculative_tokens": int(d)},
                                 eos_ids=tok.eos_ids)
  decs["auto"] = SpecDecoder(lm.model, {"method": method, "num_speculative_tokens": "auto"},
                             eos_ids=tok.eos_ids)
  decs["auto per_row"] = SpecDecoder(lm.model, {"method": method, "num_speculative_tokens": "auto",
                                                "per_row": True}, eos_ids=tok.eos_ids)
  for dec in decs.values():                       # compile (and time rounds) and warm up
    dec.generate(ids, **kw)
  times = {c: [] for c in decs}
  outs = {}
  for r in range(args.repeats):
    for c, dec in (list(decs.items()) if r % 2 == 0 else list(decs.items())[::-1]):
      outs[c] = dec.generate(ids, **kw)
      times[c].append(outs[c].decode_s)
  t = {c: np.asarray(v) for c, v in times.items()}
  speedup = {c: float(np.median(t["plain"] / t[c])) for c in decs if c != "plain"}
  best_fixed = max((c for c in speedup if c.startswith("D=")), key=speedup.get)
  res = dict(speedup=speedup, best_fixed=best_fixed,
             per_row_over_best_fixed=float(np.median(t[best_fixed] / t["auto per_row"])),
             per_row_over_auto=float(np.median(t["auto"] / t["auto per_row"])),
             same_tokens={c: outs[c].token_ids == outs["plain"].token_ids for c in decs},
             acceptance_length={c: outs[c].acceptance_length for c in decs if c != "plain"},
             verified_lengths={c: outs[c].verified_lengths for c in ("auto", "auto per_row")},
             round_costs={c: outs[c].round_costs for c in ("auto", "auto per_row")},
             tokens=[len(x) for x in outs["plain"].token_ids], decode_s_runs=times)
  report["results"][method] = res
  print(method, json.dumps({k: res[k] for k in ("speedup", "best_fixed", "per_row_over_best_fixed",
                                                "per_row_over_auto", "same_tokens")}), flush=True)
if args.json:
  os.makedirs(os.path.dirname(args.json), exist_ok=True)
  json.dump(report, open(args.json, "w"), indent=1)
