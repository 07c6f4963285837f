"""What the adaptive program's rounds cost against the programs they stand in for, on the default
model: plain decoding, a fixed D, the adaptive decoder forced to that D every round, forced to plain
rounds, and choosing ("auto", round costs timed at compile), each with the choice on the host (one
program per width) and in the round (`lax.switch`), `--choices`. Speedups over plain decoding of
the same batch, medians of interleaved runs, and the overheads as medians of per-run paired ratios
(forced D against the fixed program, forced plain rounds against plain decoding); JSON out.
Run on a quiet machine:
  .venv/bin/python benchmarks/scripts/switch_overhead.py --method eagle3 --json out.json
"""
import argparse
import dataclasses
import json

import jax.numpy as jnp
import numpy as np

from jspec import SpecDecoder
from jspec.decode import Decoder
from suite_setup import default_model_and_prompts

ap = argparse.ArgumentParser()
ap.add_argument("--method", default="ngram")
ap.add_argument("--num-draft", type=int, default=1)
ap.add_argument("--batch-sizes", default="1,4")
ap.add_argument("--categories", default="math,writing,coding,multi_turn")
ap.add_argument("--max-new-tokens", type=int, default=64)
ap.add_argument("--repeats", type=int, default=4)
ap.add_argument("--plain-steps", default="4", help="target steps per forced plain round, a list")
ap.add_argument("--choices", default="host,device", help="where the adaptive decoder chooses")
ap.add_argument("--json", default=None)
args = ap.parse_args()

lm, tok, ids, kw = default_model_and_prompts(args.categories, args.max_new_tokens)
d = args.num_draft


def forced(length, plain_steps=4, choice="host"):
  """The adaptive decoder with every round forced to verify `length` (0: plain rounds of
  `plain_steps` target steps)."""
  dec = SpecDecoder(lm.model, {"method": args.method, "num_speculative_tokens": "auto"},
                    eos_ids=tok.eos_ids, time_rounds=False, choice=choice)
  dec.drafter = dataclasses.replace(dec.drafter, plain_steps=plain_steps)
  k = dec.drafter.lengths.index(length)
  cost = dec.drafter_params.cost
  dec.drafter_params = dataclasses.replace(
      dec.drafter_params, cost=jnp.where(jnp.arange(cost.shape[-1]) == k, 1.0, 1e3) * jnp.ones_like(cost))
  return dec


choices = args.choices.split(",")
decs = {"plain": Decoder(lm.model, eos_ids=tok.eos_ids),
        f"fixed{d}": SpecDecoder(lm.model, {"method": args.method, "num_speculative_tokens": d},
                                 eos_ids=tok.eos_ids)}
for c in choices:
  decs[f"forced{d}_{c}"] = forced(d, choice=c)
  for st in map(int, args.plain_steps.split(",")):
    decs[f"forced_plain{'' if st == 4 else st}_{c}"] = forced(0, st, c)
  decs[f"auto_{c}"] = SpecDecoder(
      lm.model, {"method": args.method, "num_speculative_tokens": "auto"}, eos_ids=tok.eos_ids,
      cost_table="benchmarks/results/plan/cpu.json", choice=c)
report = dict(method=args.method, num_draft=d, categories=args.categories,
              max_new_tokens=args.max_new_tokens, repeats=args.repeats,
              plain_steps=args.plain_steps, results={})
for b in map(int, args.batch_sizes.split(",")):
  batch = [ids[j % len(ids)] for j in range(b)]
  for dec in decs.values():
    dec.generate(batch, **kw)                      # compile and warm up
  times = {n: [] for n in decs}
  rounds = {}
  for r in range(args.repeats):
    for n, dec in (list(decs.items()) if r % 2 == 0 else list(decs.items())[::-1]):
      out = dec.generate(batch, **kw)
      times[n].append(out.decode_s)
      rounds[n] = getattr(out, "verified_lengths", None)
  med = {n: float(np.median(v)) for n, v in times.items()}
  paired = lambda a, ref: float(np.median(np.asarray(times[a]) / np.asarray(times[ref])) - 1)
  report["results"][b] = dict(
      speedup={n: med["plain"] / v for n, v in med.items()}, decode_s=med, decode_s_runs=times,
      overhead={**{f"forced{d}_{c}_vs_fixed{d}": paired(f"forced{d}_{c}", f"fixed{d}")
                   for c in choices},
                **{f"forced_plain_{c}_vs_plain": paired(f"forced_plain_{c}", "plain")
                   for c in choices}},
      auto_round_costs_s={c: decs[f"auto_{c}"].generate(batch, **kw).round_costs
                          for c in choices},
      verified_lengths={n: v for n, v in rounds.items() if v})
  res = report["results"][b]
  print(b, json.dumps(res["speedup"]), json.dumps(res["overhead"]), flush=True)
  for dec in decs.values():
    dec.clear_compiled()
if args.json:
  json.dump(report, open(args.json, "w"), indent=1, default=str)
