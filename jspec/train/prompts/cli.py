"""`jspec train prompts OUT`: build the drafter-training prompt corpus (see build.py)."""

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


def add_parser(tsub) -> None:
  from jspec.train.prompts.build import DEFAULT_NUM
  p = tsub.add_parser("prompts", help="build the prompt corpus for drafter training (template "
                                      "and third-party-docs prompts in 12 families, deduplicated "
                                      "and decontaminated)")
  p.add_argument("out", help="output file, .jsonl or .jsonl.gz (a .manifest.json is written "
                             "beside it)")
  p.add_argument("--num", type=int, default=DEFAULT_NUM,
                 help="generated prompts, split over the families by fixed shares")
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
