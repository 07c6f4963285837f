"""Benchmark cases of the model-free drafters that `jspec bench` does not cover, JSON out in its
record schema (jspec.bench.speedup.RECORD_FIELDS):

  prediction  predicted outputs: each prompt's fenced code block (the code being edited) is the
              prediction (prompts without one are skipped; the suite's code_editing prompts all
              have one); the other drafters run the same prompts without it.
  repeat      repeated requests: per category, every prompt runs twice through the same decoders
              (pass 1, then pass 2); suffix decoding's global cache starts empty per category and
              after the warm-up. Records are labelled "<category> (pass N)".

As in `jspec bench`: every batch runs plainly and with each configuration back to back (order
alternating), after a warm-up, compilation excluded; speedup = median of per-batch ratios.

  python -m jspec.bench.model_free prediction --prompts benchmarks/prompts/suite.jsonl \\
      --categories code_editing --drafters ngram,prediction --num-draft 3,7 --json out.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict

import jax

from jspec import cli_args, prompt_suite
from jspec.bench import plain, speedup
from jspec.decode import Decoder, bucket
from jspec.spec_decode import SpecDecoder
from jspec.timing import measure_bandwidth, time_draft, time_verify

CASES = ("prediction", "repeat")
_FENCE = re.compile(r"```[^\n`]*\n.*?```", re.DOTALL)


def original_code(prompt: prompt_suite.Prompt) -> str | None:
  """The first fenced code block of the last user message, fences included."""
  m = _FENCE.search(prompt.messages[-1]["content"])
  return m.group(0) if m else None


def run(loaded, prompts, *, case: str, drafters, num_draft, batch_sizes=(1, 4), temperature=0.0,
        max_new_tokens=128, repeats=1, ignore_eos=False, drafter_options=None, seed=0,
        progress=True) -> dict:
  from tqdm import tqdm

  if case not in CASES:
    raise ValueError(f"unknown case {case!r}; choose one of {CASES}")
  if case == "repeat" and repeats != 1:
    raise ValueError("the repeat case runs every prompt exactly twice; leave --repeats at 1")
  tok = loaded.tokenizer
  by_cat = defaultdict(list)              # category -> [(id, prompt ids, prediction text)]
  for p in prompts:
    pred = original_code(p) if case == "prediction" else None
    if case == "prediction" and pred is None:
      continue
    by_cat[p.category].append((p.id, tok.encode(tok.apply_chat_template(list(p.messages))), pred))
  if not by_cat:
    raise ValueError("no prompt has a fenced code block to use as the prediction")
  opts = drafter_options or {}
  configs = [(dr, d) for dr in drafters for d in num_draft]
  cfgs = {c: speedup.spec_config(c[0], c[1], opts.get(c[0])) for c in configs}
  plain_dec = Decoder(loaded.model, eos_ids=tok.eos_ids)
  specs = {c: SpecDecoder(loaded.model, cfg, eos_ids=tok.eos_ids, tokenizer=tok,
                          draft_model=loaded.model if cfg.method == "draft_model" else None)
           for c, cfg in cfgs.items()}
  pad_to = bucket(max(len(x) for rows in by_cat.values() for _, x, _ in rows))
  kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, eos=not ignore_eos,
            pad_to=pad_to)
  passes = (1, 2) if case == "repeat" else (1,)

  def extra(c, batch):
    return {"prediction": [r[2] for r in batch]} if cfgs[c].method == "prediction" else {}

  def label(cat, n):
    return f"{cat} (pass {n})" if case == "repeat" else cat

  runs = sum(len(speedup.batches(rows, b)) for b in batch_sizes for rows in by_cat.values())
  bar = tqdm(total=runs * len(passes) * repeats * (1 + len(configs)), desc=f"model-free {case}",
             unit="run", file=sys.stderr, disable=not progress)
  accs, parts, timed = {}, {}, {}
  bandwidths = [measure_bandwidth(repeats=3)]
  for b in batch_sizes:
    first = speedup.batches(next(iter(by_cat.values())), b)[0]
    plain_dec.generate([r[1] for r in first], seed=seed, **kw)         # warm-up and compile
    for c in configs:
      specs[c].generate([r[1] for r in first], seed=seed, **kw, **extra(c, first))
    bandwidths.append(measure_bandwidth(repeats=3))
    for cat, rows in by_cat.items():
      for c in configs:
        specs[c].reset_drafter()          # no outputs of the warm-up or of other categories
      bs = speedup.batches(rows, b)
      for n in passes:
        for i, batch in enumerate(bs):
          ids = [r[1] for r in batch]
          for c, out, base in speedup.interleaved_runs(
              plain_dec, specs, configs, ids, index=i, repeats=repeats, seed=seed, kw=kw,
              extra=lambda c, batch=batch: extra(c, batch), tick=bar.update):
            accs.setdefault((c[0], c[1], b, label(cat, n)), speedup.Accumulator(c[1])).add(
                out, base, [row[0] for row in batch])
        for c in configs:                 # component times at this pass's state, once each
          state, sampling = specs[c].prefill([r[1] for r in bs[0]], seed=seed,
                                             **kw, **extra(c, bs[0]))
          vkey = (b, c, state.tokens.shape)
          if vkey not in timed:     # first: it consumes the cache, time_draft the drafter state
            timed[vkey] = time_verify(specs[c], state, sampling=sampling)
          parts[(c, b, label(cat, n))] = (timed[vkey], time_draft(specs[c], state, sampling))
    for dec in (plain_dec, *specs.values()):
      dec.clear_compiled()
    jax.clear_caches()
  bar.close()
  bw = sorted(bandwidths)[len(bandwidths) // 2]
  results = []
  for c in configs:
    for b in batch_sizes:
      roofline = b * bw / plain.step_bytes(plain_dec, b, pad_to + max_new_tokens)
      for n in passes:
        total, pooled = speedup.Accumulator(c[1]), []
        for cat in by_cat:
          key = (c[0], c[1], b, label(cat, n))
          acc = accs[key]
          v, dr = parts[(c, b, label(cat, n))]
          results.append(speedup.make_record(key, acc, [(acc.steps, v, dr)], roofline, temperature))
          pooled.append((acc.steps, v, dr))
          speedup.merge_into(total, acc)
        results.append(speedup.make_record((c[0], c[1], b, label("all", n)), total, pooled,
                                       roofline, temperature))
  return dict(schema=speedup.SCHEMA, case=case, model=loaded.name,
              backend=jax.default_backend(), device=str(jax.devices()[0]),
              dtype=str(plain_dec.weights_dtype), jax_version=jax.__version__,
              bandwidth_gb_s=bw / 1e9, settings=dict(case=case, drafters=list(drafters), num_draft=list(num_draft),
                            batch_sizes=list(batch_sizes), temperature=temperature,
                            max_new_tokens=max_new_tokens, repeats=repeats,
                            ignore_eos=ignore_eos, drafter_options=opts, seed=seed,
                            categories=list(by_cat),
                            num_prompts=sum(len(r) for r in by_cat.values()),
                            prompt_padding=pad_to),
              results=results)


def main(argv=None) -> None:
  from jspec.sampling import SamplingParams

  parser = argparse.ArgumentParser(prog="python -m jspec.bench.model_free",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("case", choices=CASES)
  parser.add_argument("--prompts", required=True)
  parser.add_argument("--categories", default=None)
  parser.add_argument("--per-category", type=int, default=None)
  parser.add_argument("--model", default=None)
  parser.add_argument("--drafters", required=True, help="comma-separated registry names")
  parser.add_argument("--num-draft", default="3")
  parser.add_argument("--batch-size", default="1,4")
  parser.add_argument("--temperature", type=float, default=0.0)
  parser.add_argument("--max-new-tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--ignore-eos", action="store_true")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", default=None)
  parser.add_argument("--no-progress", action="store_true")
  cli_args.add_drafter_flags(parser)
  args = parser.parse_args(argv)
  args.outputs, args.saved = [], []
  from models.registry import DEFAULT_MODEL
  num_draft = cli_args.draft_lengths(args.num_draft)
  batch_sizes = cli_args.ints(args.batch_size, "--batch-size")
  cli_args.at_least_1(args, "--max-new-tokens", "--repeats", "--per-category")
  drafters = tuple(d for d in args.drafters.split(",") if d)
  try:      # everything cheap before the model loads
    if args.case == "repeat" and args.repeats != 1:
      raise ValueError("the repeat case runs every prompt exactly twice; leave --repeats at 1")
    prompts = prompt_suite.select(prompt_suite.load(args.prompts),
                                  args.categories.split(",") if args.categories else None,
                                  args.per_category)
    options = cli_args.drafter_options(drafters, num_draft, args)
    SamplingParams.make(1, args.temperature, 0, 1.0)
  except ValueError as e:
    sys.exit(f"jspec: {e}")
  cli_args.check_outputs(args, [args.json])
  loaded = cli_args.load_model(args.model or DEFAULT_MODEL)
  cli_args.check_context(loaded, [p.messages for p in prompts], args.max_new_tokens)
  try:
    report = run(loaded, prompts, case=args.case, drafters=drafters, num_draft=num_draft,
                 batch_sizes=batch_sizes, temperature=args.temperature,
                 max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                 ignore_eos=args.ignore_eos, drafter_options=options, seed=args.seed,
                 progress=not args.no_progress)
  except ValueError as e:
    sys.exit(f"jspec: {e}")
  report["command"] = "python -m jspec.bench.model_free " + " ".join(
      sys.argv[1:] if argv is None else argv)
  text = json.dumps(report, indent=2)
  if args.json and not cli_args.save_text(args, args.json, text):
    print(text)
    sys.exit(f"jspec: the report was not saved to {args.json}; it is printed above")
  print(speedup.markdown(report))


if __name__ == "__main__":
  main()
