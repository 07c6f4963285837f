"""`jspec train prompts OUT`: build the drafter-training prompt corpus (see build.py);
`jspec train magpie OUT_DIR`: target-written prompts steered by family (magpie.py)."""

from __future__ import annotations

import json
import sys


def cmd_prompts(args) -> None:
  from jspec.train.prompts.build import build_corpus
  try:
    manifest = build_corpus(args.out, num=args.num, seed=args.seed, exclude=args.exclude,
                            include=args.include, progress=not args.no_progress)
  except (ValueError, OSError) as e:
    sys.exit(f"jspec: {e}")
  print(json.dumps({k: manifest[k] for k in ("file", "prompts", "bytes", "sha256", "dropped",
                                             "shortfall")}, indent=2))


def cmd_magpie(args) -> None:
  import models
  from jspec.train.prompts.magpie import synthesize_families
  fams = args.families.split(",") if args.families else None
  args.interrupt_note = f"sampled prompts are saved in {args.out}; run again to resume"
  try:
    lm = models.load(args.model, quiet=args.no_progress)
    paths = synthesize_families(lm, lm.tokenizer, args.out, per_family=args.per_family,
                                batch_size=args.batch_size, seed=args.seed, families=fams,
                                progress=not args.no_progress)
  except (ValueError, OSError) as e:
    sys.exit(f"jspec: {e}")
  print(json.dumps(paths, indent=2))


def add_parser(tsub, default_model: str) -> None:
  from jspec.train.prompts.build import DEFAULT_NUM
  p = tsub.add_parser("prompts", help="build the prompt corpus for drafter training (template "
                                      "and third-party-docs prompts in 12 families, deduplicated "
                                      "and decontaminated)")
  p.add_argument("out", help="output file, .jsonl or .jsonl.gz (a .manifest.json is written "
                             "beside it)")
  p.add_argument("--num", type=int, default=DEFAULT_NUM,
                 help="generated prompts, split over the families by fixed shares (0: only the "
                      "--include files, deduplicated and decontaminated)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--exclude", nargs="*", default=[], metavar="FILE",
                 help="also drop prompts sharing a word 13-gram with these files (JSON Lines "
                      "with messages or prompt, or plain text); the benchmark suite, adversarial "
                      "and calibration prompts are always excluded")
  p.add_argument("--include", nargs="*", default=[], metavar="FILE",
                 help="prompt files in the suite's format (e.g. Magpie prompts) merged in, "
                      "deduplicated and decontaminated with the rest")
  p.add_argument("--no-progress", action="store_true")
  p.set_defaults(func=cmd_prompts)

  m = tsub.add_parser("magpie", help="sample user prompts from the target, steered by family "
                                     "with opening words (one JSON Lines file per family)")
  m.add_argument("out", help="output folder (magpie_<family>.jsonl); rerun to resume or extend")
  m.add_argument("--model", default=default_model)
  m.add_argument("--per-family", type=int, default=500)
  m.add_argument("--families", default=None, help="comma-separated (default: all)")
  m.add_argument("--batch-size", type=int, default=64)
  m.add_argument("--seed", type=int, default=0)
  m.add_argument("--no-progress", action="store_true")
  m.set_defaults(func=cmd_magpie)
