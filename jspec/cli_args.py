"""What jspec's commands share (`jspec` and the `python -m jspec.bench.*` scripts): parsing their
flags, the speculative config from them, and the checks made before any work."""

from __future__ import annotations

import json
import os
import sys


WEIGHTS_HELP = ("how the target's weights are held: f32 (dequantised, the default), bf16, int8, "
                "gguf (a GGUF file's Q8_0/Q4_0/Q4_1 blocks read as stored), auto (as stored)")


KV_CACHE_HELP = ("the KV cache's dtype: f32 (the default) or bf16 (half the bytes a long-context "
                 "step reads; attention math stays fp32)")


def load_model(name: str, weights: str = "f32", kv_cache: str = "f32"):
  """The registered model `name`; exits with the loader's message where it cannot load."""
  import models
  try:
    return models.load(name, weights=weights, kv_cache=kv_cache)
  except models.ModelLoadError as e:
    sys.exit(f"jspec: {e}")


def at_least_1(args, *flags: str) -> None:
  """Counts are checked as Python ints before the model loads (no int32 wrap, no wasted load)."""
  for flag in flags:
    value = getattr(args, flag.lstrip("-").replace("-", "_"))
    if value is not None and value < 1:
      sys.exit(f"jspec: {flag} must be >= 1, got {value}")


def check_context(loaded, conversations, max_new: int) -> None:
  """Right after the load, before any work: the longest prompt + --max-new-tokens must fit."""
  tok = loaded.tokenizer
  longest = max(len(tok.encode(tok.apply_chat_template(list(m)))) for m in conversations)
  limit = loaded.model.config.max_position
  if longest + max_new > limit:
    sys.exit(f"jspec: the longest prompt ({longest} tokens) + --max-new-tokens ({max_new}) exceeds "
             f"the model's context of {limit}; " + (
                 f"lower --max-new-tokens to at most {limit - longest}" if longest < limit
                 else "use shorter prompts"))


def check_outputs(args, files=(), folder=None, names=()) -> None:
  """Every file the command will write is checked before any work: `files`, and `names` inside
  `folder` (created if missing). Remembered in args.outputs for the interrupt message."""
  from jspec.io import check_writable
  try:
    args.outputs = [check_writable(p) for p in files if p]
    if folder:
      for name in names:
        check_writable(os.path.join(folder, name), create_folder=True)
      args.outputs.append(os.path.join(os.path.abspath(folder), ""))
  except ValueError as e:
    sys.exit(f"jspec: {e}")


def save_text(args, path: str, text: str) -> bool:
  """Writes `text` atomically; on failure says why and returns False (the caller keeps going so
  that the rest of the report is not lost)."""
  from jspec.io import atomic_write_text
  try:
    atomic_write_text(path, text)
  except OSError as e:
    print(f"jspec: could not write {path}: {e.strerror or e}", file=sys.stderr)
    return False
  args.saved.append(os.path.abspath(path))
  return True


def draft_lengths(text: str, flag: str = "--num-draft") -> tuple:
  """Comma-separated draft lengths: integers >= 1 or 'auto' (adaptive)."""
  values = []
  for x in str(text).split(","):
    if x.strip() == "auto":
      values.append("auto")
      continue
    try:
      values.append(int(x))
    except ValueError:
      sys.exit(f"jspec: {flag} takes comma-separated integers or 'auto', got {text!r}")
    if values[-1] < 1:
      sys.exit(f"jspec: {flag} values must be >= 1 or 'auto', got {text!r}")
  return tuple(values)


def ints(text: str, flag: str) -> tuple[int, ...]:
  """Comma-separated integers >= 1."""
  try:
    values = tuple(int(x) for x in text.split(","))
  except ValueError:
    sys.exit(f"jspec: {flag} takes comma-separated integers, got {text!r}")
  if any(v < 1 for v in values):
    sys.exit(f"jspec: {flag} values must be >= 1, got {text!r}")
  return values


def add_drafter_flags(parser) -> None:
  """Every registered method's own flags (e.g. --ngram-max, --draft-layers, --head)."""
  from jspec.drafters import registry

  flags = {}                     # flag -> (its first declaration, the methods that take it)
  for entry in registry.methods().values():
    for f in entry.cli_flags:
      flags.setdefault(f.flag, (f, []))[1].append(entry.cli_name)
  for flag, (f, names) in flags.items():
    parser.add_argument(flag, type=f.type, default=None, help=f"{f.help} [{', '.join(names)}]")


def parse_drafter(spec: str) -> tuple[str, dict]:
  """A drafter variant: "eagle3:tree_top_k=3:tree_depth=4" -> ("eagle3", {"tree_top_k": 3,
  "tree_depth": 4}); values are JSON where they parse (numbers, true/false), text otherwise."""
  method, *pairs = spec.split(":")
  over = {}
  for pair in pairs:
    key, sep, value = pair.partition("=")
    if not sep or not key:
      raise ValueError(f"drafter variant {spec!r}: write method:key=value[:key=value...]")
    try:
      over[key] = json.loads(value)
    except json.JSONDecodeError:
      over[key] = value
  return method, over


def spec_config(drafter: str, num_draft: int | str | None, args):
  """The SpeculativeConfig for one drafter, with the flags its registry entry declares; num_draft
  None (`generate`'s default): "auto" for chains, 3 where the draft is not a chain of lengths the
  round may cut (see `_default_num_draft`)."""
  from jspec.config import SpeculativeConfig
  from jspec.drafters import registry

  method, over = parse_drafter(drafter)
  entry = registry.get(method)
  cfg = dict(method=entry.name, num_speculative_tokens=num_draft)
  for f in entry.cli_flags:
    value = getattr(args, f.flag.lstrip("-").replace("-", "_"), None)
    if value is not None:
      cfg[f.field] = value
  cfg.update(over)
  if entry.name == "draft_model" and "draft_model" not in cfg:
    cfg["draft_model"] = args.model      # the target as its own draft
  if num_draft is None:
    cfg["num_speculative_tokens"] = _default_num_draft(SpeculativeConfig.from_dict(
        {**cfg, "num_speculative_tokens": 3}))
  return SpeculativeConfig.from_dict(cfg)


def drafter_options(drafters, num_draft, args) -> dict:
  """drafter -> its method's own config keys from the flags (`drafter_options` of the benchmark
  and planner runs); the config is built, so checked, at every draft length in `num_draft`."""
  from jspec.config import TOP_KEYS
  options = {d: spec_config(d, n, args).to_dict() for d in drafters for n in num_draft}
  return {d: {k: v for k, v in o.items() if k not in TOP_KEYS} for d, o in options.items()}


def _default_num_draft(config) -> int | str:
  """`generate`'s default draft length: "auto" (the adaptive length), except a fixed 3 for trees
  (num_speculative_tokens is their node budget), DSpark's confidence schedule (it picks its own
  verify widths) and Medusa (one draft per head: the shipped head has 4, fewer than auto's 7)."""
  opts = config.options
  if (getattr(opts, "tree_top_k", 0) or getattr(opts, "tree_choices", None)
      or getattr(opts, "confidence_schedule", False) or config.method == "medusa"):
    return 3
  return "auto"
