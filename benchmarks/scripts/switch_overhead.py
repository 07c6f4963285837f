"""What the adaptive program's rounds cost against the programs they stand in for, on the default
model: plain decoding, a fixed D, the adaptive program forced to that D every round, the adaptive
program forced to plain rounds, and the adaptive program choosing ("auto", round costs timed at
compile). Speedups over plain decoding of the same batch, medians of interleaved runs; JSON out.
Run on a quiet machine:
  .venv/bin/python benchmarks/scripts/switch_overhead.py --method eagle3 --plain-steps 4,7 --json out.json
"""
import argparse
import dataclasses
import json

import jax.numpy as jnp
import numpy as np

import models
from jspec import SpecDecoder
from jspec.decode import Decoder
from jspec.prompt_suite import load, select

ap = argparse.ArgumentParser()
ap.add_argument("--method", default="ngram")
ap.add_argument("--num-draft", type=int, default=1)
ap.add_argument("--batch-sizes", default="1,4")
ap.add_argument("--categories", default="math,writing,coding,multi_turn")
ap.add_argument("--max-new-tokens", type=int, default=64)
ap.add_argument("--repeats", type=int, default=4)
ap.add_argument("--plain-steps", default="4", help="target steps per forced plain round, a list")
ap.add_argument("--json", default=None)
args = ap.parse_args()

lm = models.load("smollm2-135m-instruct")
tok = lm.tokenizer
prompts = select(load("benchmarks/prompts/suite.jsonl"), args.categories.split(","), 1)
ids = [tok.encode(tok.apply_chat_template(list(p.messages))) for p in prompts]
kw = dict(max_new_tokens=args.max_new_tokens, pad_to=512)
d = args.num_draft


def forced(length, plain_steps=4):
  """The adaptive program with every round forced to verify `length` (0: plain rounds of
  `plain_steps` target steps)."""
  dec = SpecDecoder(lm.model, {"method": args.method, "num_speculative_tokens": "auto"},
                    eos_ids=tok.eos_ids, time_rounds=False)
  dec.drafter = dataclasses.replace(dec.drafter, plain_steps=plain_steps)
  k = dec.drafter.lengths.index(length)
  cost = dec.drafter_params.cost
  dec.drafter_params = dataclasses.replace(
      dec.drafter_params, cost=jnp.where(jnp.arange(cost.shape[-1]) == k, 1.0, 1e3) * jnp.ones_like(cost))
  return dec


decs = {"plain": Decoder(lm.model, eos_ids=tok.eos_ids),
        f"fixed{d}": SpecDecoder(lm.model, {"method": args.method, "num_speculative_tokens": d},
                                 eos_ids=tok.eos_ids),
        f"forced{d}": forced(d),
        **{"forced_plain" + ("" if s == 4 else f"{s}"): forced(0, s)
           for s in map(int, args.plain_steps.split(","))},
        "auto": SpecDecoder(lm.model, {"method": args.method, "num_speculative_tokens": "auto"},
                            eos_ids=tok.eos_ids, cost_table="benchmarks/results/plan/cpu.json")}
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
  report["results"][b] = dict(
      speedup={n: med["plain"] / v for n, v in med.items()}, decode_s=med,
      auto_round_costs_s=decs["auto"].generate(batch, **kw).round_costs,
      verified_lengths={n: v for n, v in rounds.items() if v})
  print(b, json.dumps(report["results"][b]["speedup"]), flush=True)
  for dec in decs.values():
    dec.clear_compiled()
if args.json:
  json.dump(report, open(args.json, "w"), indent=1, default=str)
