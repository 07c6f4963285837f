"""The adaptive draft length chosen on the host (one program per width) against the in-round
`lax.switch` program, with the same choices: both decoders price rounds by the same cost table
(`time_rounds=False`), so they verify the same widths and emit the same tokens, and only the
mechanism differs. Suite prompts (one per category), B = 1 (each prompt alone) and B = 4 (together),
interleaved runs beside plain decoding; medians of per-run paired ratios; JSON out. Quiet machine:
  .venv/bin/python benchmarks/scripts/choice_host_device.py --methods ngram,eagle3 --json out.json
"""
import argparse
import json

import numpy as np

from jspec import SpecDecoder
from jspec.decode import Decoder
from suite_setup import default_model_and_prompts

ap = argparse.ArgumentParser()
ap.add_argument("--methods", default="ngram,eagle3")
ap.add_argument("--categories", default="coding,code_editing,writing,math")
ap.add_argument("--max-new-tokens", type=int, default=64)
ap.add_argument("--repeats", type=int, default=5)
ap.add_argument("--plan", default="benchmarks/results/plan/cpu.json", help="the cost table")
ap.add_argument("--json", default=None)
args = ap.parse_args()

lm, tok, ids, kw = default_model_and_prompts(args.categories, args.max_new_tokens)
report = dict(vars(args), results={})
for method in args.methods.split(","):
  for b in (1, len(ids)):
    batches = [[x] for x in ids] if b == 1 else [ids]
    decs = {c: SpecDecoder(lm.model, {"method": method, "num_speculative_tokens": "auto"},
                           eos_ids=tok.eos_ids, cost_table=args.plan, time_rounds=False, choice=c)
            for c in ("host", "device")}
    decs["plain"] = Decoder(lm.model, eos_ids=tok.eos_ids)
    for dec in decs.values():                       # compile and warm up
      for batch in batches:
        dec.generate(batch, **kw)
    times = {c: [] for c in decs}
    tokens, lengths = {}, {}
    for r in range(args.repeats):
      for c, dec in (list(decs.items()) if r % 2 == 0 else list(decs.items())[::-1]):
        outs = [dec.generate(batch, **kw) for batch in batches]
        times[c].append(sum(o.decode_s for o in outs))
        tokens[c] = [o.token_ids for o in outs]
        lengths[c] = [getattr(o, "verified_lengths", None) for o in outs]
    t = {c: np.asarray(v) for c, v in times.items()}
    res = dict(host_over_device_time=float(np.median(t["host"] / t["device"])),
               speedup={c: float(np.median(t["plain"] / t[c])) for c in ("host", "device")},
               same_tokens=tokens["host"] == tokens["device"] == tokens["plain"],
               same_widths=lengths["host"] == lengths["device"],
               verified_lengths=lengths["host"], decode_s_runs=times)
    report["results"][f"{method} B={b}"] = res
    print(method, b, json.dumps({k: res[k] for k in ("host_over_device_time", "speedup",
                                                      "same_tokens", "same_widths")}), flush=True)
if args.json:
  json.dump(report, open(args.json, "w"), indent=1)
