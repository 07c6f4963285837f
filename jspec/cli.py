"""The `jspec` command line: generate text with the default model; benchmark plain decoding."""

from __future__ import annotations

import argparse
import json
import sys


def _load(name: str):
  import models
  try:
    return models.load(name)
  except models.ModelLoadError as e:
    sys.exit(f"jspec: {e}")


def _spec_config(args):
  from jspec.config import SpeculativeConfig

  cfg = dict(method=args.drafter, num_speculative_tokens=args.num_draft)
  if args.drafter == "ngram":
    cfg.update(prompt_lookup_min=args.ngram_min, prompt_lookup_max=args.ngram_max)
  elif args.drafter == "layer-skip":
    cfg.update(num_layers=args.draft_layers)
  elif args.drafter == "draft-model":
    cfg.update(draft_model=args.draft_model)
  return SpeculativeConfig.from_dict(cfg)


def cmd_generate(args) -> None:
  from jspec.decode import Decoder
  from jspec.sampling import SamplingParams

  if not args.prompt.strip():
    sys.exit("jspec: the prompt is empty; pass some text to continue")
  try:   # validate everything cheap before loading a model
    SamplingParams.make(1, args.temperature, args.top_k, args.top_p)
    spec = _spec_config(args) if args.drafter != "none" else None
  except ValueError as e:
    sys.exit(f"jspec: {e}")
  loaded = _load(args.model)
  tok = loaded.tokenizer
  if args.raw:
    text = args.prompt
  else:
    messages = ([{"role": "system", "content": args.system}] if args.system else [])
    text = tok.apply_chat_template(messages + [{"role": "user", "content": args.prompt}])
  ids = tok.encode(text)
  kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
            top_p=args.top_p, seed=args.seed)
  try:
    base = Decoder(loaded.model, eos_ids=tok.eos_ids).generate([ids], **kw)
    out = base
    if spec is not None:
      from jspec.spec_decode import SpecDecoder
      draft = _load(spec.draft_model).model if spec.method == "draft_model" else None
      out = SpecDecoder(loaded.model, spec, draft_model=draft, eos_ids=tok.eos_ids).generate([ids], **kw)
  except ValueError as e:
    sys.exit(f"jspec: {e}")
  new = out.token_ids[0]
  completion = tok.decode(new, skip_special_tokens=True)
  record = dict(model=loaded.name, drafter=args.drafter, prompt=args.prompt, text=completion,
                token_ids=new, num_prompt_tokens=len(ids), num_tokens=len(new),
                finish_reason=out.finish_reason[0], tokens_per_s=out.tokens_per_s,
                prefill_s=out.prefill_s, decode_s=out.decode_s, compile_s=out.compile_s)
  if spec is not None:
    record.update(num_draft=spec.num_speculative_tokens,
                  acceptance_length=out.acceptance_length,
                  per_position_acceptance=out.per_position_acceptance,
                  baseline_tokens_per_s=base.tokens_per_s,
                  speedup=out.tokens_per_s / base.tokens_per_s,
                  same_as_baseline=new == base.token_ids[0])
  if args.json:
    print(json.dumps(record))
    return
  print(completion)
  line = f"[{len(new)} tokens, {out.tokens_per_s:.1f} tokens/s"
  if spec is not None:
    line += (f" vs plain {base.tokens_per_s:.1f} tokens/s: speedup {record['speedup']:.2f}x, "
             f"acceptance length {out.acceptance_length:.2f}")
  print(line + f"; finish: {out.finish_reason[0]}; compilation excluded]", file=sys.stderr)


def cmd_bench_decode(args) -> None:
  from jspec.bench import plain

  loaded = _load(args.model)
  sizes = tuple(int(x) for x in args.batch_sizes.split(","))
  report = plain.run(loaded, batch_sizes=sizes, max_new_tokens=args.max_new_tokens,
                     repeats=args.repeats)
  text = json.dumps(report, indent=2)
  if args.json:
    with open(args.json, "w") as f:
      f.write(text + "\n")
  print(text)


def _ints(text: str, flag: str) -> tuple[int, ...]:
  try:
    values = tuple(int(x) for x in text.split(","))
  except ValueError:
    sys.exit(f"jspec: {flag} takes comma-separated integers, got {text!r}")
  if any(v < 1 for v in values):
    sys.exit(f"jspec: {flag} values must be >= 1, got {text!r}")
  return values


def cmd_bench(args) -> None:
  from jspec.bench import speedup, suite
  from jspec.sampling import SamplingParams

  num_draft = _ints(args.num_draft, "--num-draft")
  batch_sizes = _ints(args.batch_size, "--batch-size")
  drafters = tuple(d for d in args.drafters.split(",") if d)
  try:   # everything cheap is checked before the model loads
    prompts = suite.load(args.prompts)
    cats = args.categories.split(",") if args.categories else None
    prompts = suite.select(prompts, cats, args.per_category)
    for d in drafters:
      for n in num_draft:
        speedup.spec_config(d, n, args.draft_layers)
    SamplingParams.make(1, args.temperature, 0, 1.0)
  except ValueError as e:
    sys.exit(f"jspec: {e}")
  loaded = _load(args.model)
  report = speedup.run(
      loaded, prompts, drafters=drafters, num_draft=num_draft, batch_sizes=batch_sizes,
      temperature=args.temperature, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
      ignore_eos=args.ignore_eos, layer_skip_layers=args.draft_layers, seed=args.seed,
      progress=not args.no_progress)
  report["command"] = "jspec bench " + " ".join(args.argv)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=2)
  if args.plot:
    from jspec.bench import plots
    for path in plots.save_all(report, args.plot):
      print(f"wrote {path}", file=sys.stderr)
  print(speedup.markdown(report))


def main(argv=None) -> None:
  from models.registry import DEFAULT_MODEL

  parser = argparse.ArgumentParser(prog="jspec", description=__doc__)
  sub = parser.add_subparsers(dest="command", required=True)

  g = sub.add_parser("generate", help="generate a reply to PROMPT")
  g.add_argument("prompt")
  g.add_argument("--model", default=DEFAULT_MODEL)
  g.add_argument("--max-new-tokens", type=int, default=128)
  g.add_argument("--temperature", type=float, default=0.0)
  g.add_argument("--top-k", type=int, default=0)
  g.add_argument("--top-p", type=float, default=1.0)
  g.add_argument("--seed", type=int, default=0)
  g.add_argument("--system", default=None, help="system message for the chat template")
  g.add_argument("--raw", action="store_true", help="continue PROMPT as-is, no chat template")
  g.add_argument("--json", action="store_true", help="print one JSON object")
  g.add_argument("--drafter", default="none", choices=["none", "ngram", "draft-model", "layer-skip"],
                 help="speculative drafter; with one, plain decoding also runs for the speedup")
  g.add_argument("--num-draft", type=int, default=3, help="draft tokens per round (D)")
  g.add_argument("--draft-model", default=DEFAULT_MODEL, help="model for --drafter draft-model")
  g.add_argument("--draft-layers", type=int, default=None,
                 help="target layers the layer-skip drafter keeps (default: a quarter)")
  g.add_argument("--ngram-min", type=int, default=1)
  g.add_argument("--ngram-max", type=int, default=4)
  g.set_defaults(func=cmd_generate)

  b = sub.add_parser("bench-decode", help="plain-decode tokens/s vs a measured bandwidth roofline")
  b.add_argument("--model", default=DEFAULT_MODEL)
  b.add_argument("--batch-sizes", default="1,8")
  b.add_argument("--max-new-tokens", type=int, default=64)
  b.add_argument("--repeats", type=int, default=5)
  b.add_argument("--json", default=None, help="also write the report to this file")
  b.set_defaults(func=cmd_bench_decode)

  s = sub.add_parser("bench", help="speculative vs plain decoding per prompt category, JSON out")
  s.add_argument("--prompts", required=True,
                 help="JSON Lines prompt suite (e.g. benchmarks/prompts/suite.jsonl)")
  s.add_argument("--categories", default=None, help="comma-separated subset of the categories")
  s.add_argument("--per-category", type=int, default=None, help="first N prompts per category")
  s.add_argument("--model", default=DEFAULT_MODEL)
  s.add_argument("--drafters", default="ngram,layer-skip",
                 help="comma-separated: ngram, layer-skip, draft-model (the target as its own draft)")
  s.add_argument("--num-draft", default="1,3,7")
  s.add_argument("--batch-size", default="1,4")
  s.add_argument("--temperature", type=float, default=0.0)
  s.add_argument("--max-new-tokens", type=int, default=128)
  s.add_argument("--repeats", type=int, default=1, help="runs of every batch")
  s.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens")
  s.add_argument("--draft-layers", type=int, default=None, help="layer-skip depth")
  s.add_argument("--seed", type=int, default=0)
  s.add_argument("--json", default=None, help="write the report to this file")
  s.add_argument("--plot", default=None, help="write PNG plots into this folder")
  s.add_argument("--no-progress", action="store_true")
  s.set_defaults(func=cmd_bench)

  args = parser.parse_args(argv)
  args.argv = list(sys.argv[2:] if argv is None else argv[1:])
  args.func(args)


if __name__ == "__main__":
  main()
