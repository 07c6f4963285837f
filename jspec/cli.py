"""The `jspec` command line: generate text with the default model; benchmark plain decoding."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile

from jspec import cli_args


def _drafter_names() -> list[str]:
  from jspec.drafters import registry
  return sorted(m.cli_name for m in registry.methods().values())


def _compilation_cache() -> None:
  """Compiled programs persist in $JSPEC_CACHE/xla, so that a later run of the same command skips
  XLA's compilation (tracing remains: the adaptive round's 29-34 s compile became 16 s on the
  project's CPU). JAX_COMPILATION_CACHE_DIR, when set, wins (empty: no cache)."""
  if "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return
  import jax
  from models.fetch import cache_dir
  jax.config.update("jax_compilation_cache_dir", os.path.join(cache_dir(), "xla"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def cmd_generate(args) -> None:
  from jspec.decode import Decoder
  from jspec.sampling import SamplingParams
  from models.tokenizer import check_text

  if not args.prompt.strip():
    sys.exit("jspec: the prompt is empty; pass some text to continue")
  cli_args.at_least_1(args, "--max-new-tokens")
  try:
    check_text(args.prompt, "the prompt")
    if args.system is not None:
      check_text(args.system, "--system")
  except ValueError as e:
    sys.exit(f"jspec: {e}")
  prediction = _read_prediction(args)
  if prediction is not None:
    args.drafter = "prediction"     # --prediction alone turns predicted outputs on
  if args.plan and args.drafter == "none":   # the plan's choice for one prompt
    drafter, d = _plan_choice(args, 1)
    if d > 0:
      args.drafter, args.num_draft = drafter.replace("_", "-"), str(d)
  try:   # validate everything cheap before loading a model
    SamplingParams.make(1, args.temperature, args.top_k, args.top_p)
    num_draft, = cli_args.draft_lengths(args.num_draft) if args.num_draft is not None else (None,)
    spec = cli_args.spec_config(args.drafter, num_draft, args) if args.drafter != "none" else None
    if args.plan and spec is not None:
      from jspec.costs import CostTable
      CostTable.load(args.plan, spec.method)
      _check_plan_weights(args)
    mesh = None
    if args.mesh:
      from jspec.sharding import parse_mesh
      mesh = parse_mesh(args.mesh)
  except ValueError as e:
    sys.exit(f"jspec: {e}")
  loaded = cli_args.load_model(args.model, args.weights, args.kv_cache)
  tok = loaded.tokenizer
  try:
    if args.raw:
      text = args.prompt
    else:
      messages = ([{"role": "system", "content": args.system}] if args.system else [])
      text = tok.apply_chat_template(messages + [{"role": "user", "content": args.prompt}])
    ids = tok.encode(text)
  except ValueError as e:
    sys.exit(f"jspec: {e}")
  kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
            top_p=args.top_p, seed=args.seed)
  try:
    plain = Decoder(loaded.model, eos_ids=tok.eos_ids, mesh=mesh)
    if spec is not None:
      # where a speedup is printed, both sides are timed warm: the first run after compiling pays
      # one-time costs (its prefill ran 2.5x, a 6-length adaptive decode 1.7x the warm time)
      plain.generate([ids], **kw)
    base = out = plain.generate([ids], **kw)
    if spec is not None:
      from jspec.spec_decode import SpecDecoder
      draft = (cli_args.load_model(spec.options.draft_model).model
               if spec.method == "draft_model" else None)
      spec_kw = {} if spec.method != "prediction" else dict(prediction=[prediction])
      sd = SpecDecoder(loaded.model, spec, draft_model=draft, eos_ids=tok.eos_ids,
                       tokenizer=tok, cost_table=args.plan, mesh=mesh)
      compile_s = sd.generate([ids], **kw, **spec_kw).compile_s   # the spec program's
      sd.reset_drafter()        # the timed run must not draft from the warm-up's reply
      out = sd.generate([ids], **kw, **spec_kw)
  except ValueError as e:
    sys.exit(f"jspec: {e}")
  new = out.token_ids[0]
  completion = tok.decode(new, skip_special_tokens=True)
  record = dict(model=loaded.name, drafter=args.drafter, prompt=args.prompt, text=completion,
                token_ids=new, num_prompt_tokens=len(ids), num_tokens=len(new),
                finish_reason=out.finish_reason[0], tokens_per_s=out.tokens_per_s,
                prefill_s=out.prefill_s, decode_s=out.decode_s,
                compile_s=out.compile_s if spec is None else compile_s)
  if spec is not None:
    record.update(num_draft=spec.num_speculative_tokens,
                  verified_lengths=out.verified_lengths or None,
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


def _read_prediction(args) -> str | None:
  """--prediction FILE: the expected output's text, checked before the model loads."""
  from models.tokenizer import check_text

  if args.prediction is None:
    return None
  if args.drafter not in ("none", "prediction"):
    sys.exit(f"jspec: --prediction drafts with the prediction method; drop --drafter "
             f"{args.drafter} (or pass --drafter prediction)")
  try:
    with open(args.prediction, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    sys.exit(f"jspec: cannot read --prediction {args.prediction}: "
             f"{getattr(e, 'strerror', None) or e}")
  if not text.strip():
    sys.exit(f"jspec: --prediction {args.prediction} is empty; give the expected output's text")
  try:
    check_text(text, "--prediction")
  except ValueError as e:
    sys.exit(f"jspec: {e}")
  return text


def cmd_bench_decode(args) -> None:
  from jspec.bench import plain

  sizes = cli_args.ints(args.batch_sizes, "--batch-sizes")
  cli_args.at_least_1(args, "--max-new-tokens", "--repeats")
  cli_args.check_outputs(args, [args.json])
  loaded = cli_args.load_model(args.model, args.weights, args.kv_cache)
  cli_args.check_context(loaded, [[{"role": "user", "content": p}] for p in plain.PROMPTS],
                 args.max_new_tokens)
  report = plain.run(loaded, batch_sizes=sizes, max_new_tokens=args.max_new_tokens,
                     repeats=args.repeats)
  text = json.dumps(report, indent=2)
  print(text, flush=True)     # first, so that a failed write below loses nothing
  if args.json and not cli_args.save_text(args, args.json, text + "\n"):
    sys.exit(f"jspec: the report was not saved to {args.json}; it is printed above")


def cmd_bench(args) -> None:
  from jspec import prompt_suite
  from jspec.bench import speedup
  from jspec.sampling import SamplingParams

  num_draft = cli_args.draft_lengths(args.num_draft)
  batch_sizes = cli_args.ints(args.batch_size, "--batch-size")
  cli_args.at_least_1(args, "--max-new-tokens", "--repeats", "--per-category")
  drafters = tuple(d for d in args.drafters.split(",") if d)
  try:   # everything cheap is checked before the model loads
    if args.plan:
      from jspec.costs import CostTable
      CostTable.load(args.plan)
      _check_plan_weights(args)
    prompts = prompt_suite.load(args.prompts)
    cats = args.categories.split(",") if args.categories else None
    prompts = prompt_suite.select(prompts, cats, args.per_category)
    options = cli_args.drafter_options(drafters, num_draft, args)
    SamplingParams.make(1, args.temperature, 0, 1.0)
  except ValueError as e:
    sys.exit(f"jspec: {e}")
  from jspec.bench import plots
  cli_args.check_outputs(args, [args.json], args.plot, plots.FILES)
  loaded = cli_args.load_model(args.model, args.weights, args.kv_cache)
  cli_args.check_context(loaded, [p.messages for p in prompts], args.max_new_tokens)
  report = speedup.run(
      loaded, prompts, drafters=drafters, num_draft=num_draft, batch_sizes=batch_sizes,
      temperature=args.temperature, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
      ignore_eos=args.ignore_eos, drafter_options=options, seed=args.seed,
      progress=not args.no_progress, cost_table=args.plan)
  report["command"] = "jspec bench " + " ".join(args.argv)
  text = json.dumps(report, indent=2)
  failed = []
  if args.json and not cli_args.save_text(args, args.json, text):
    # never lose an hours-long run: keep the report somewhere that takes it
    fallback = os.path.join(tempfile.gettempdir(), f"jspec-bench-{os.getpid()}.json")
    failed.append(f"the report is in {fallback}" if cli_args.save_text(args, fallback, text)
                  else "the report was not saved")
  if args.plot:
    try:
      for path in plots.save_all(report, args.plot):
        print(f"wrote {path}", file=sys.stderr)
      args.saved.append(os.path.join(os.path.abspath(args.plot), ""))
    except OSError as e:
      failed.append(f"plots not all written ({e.strerror or e})")
  print(speedup.markdown(report))
  if failed:
    sys.exit("jspec: " + "; ".join(failed))


def cmd_plan(args) -> None:
  from jspec import prompt_suite
  from jspec.plan import measure, plot

  batch_sizes = cli_args.ints(args.batch_sizes, "--batch-sizes")
  lengths = cli_args.ints(args.num_draft, "--num-draft")
  cli_args.at_least_1(args, "--max-new-tokens", "--repeats", "--calibration-prompts")
  contexts = cli_args.ints(args.context, "--context")
  drafters = tuple(d for d in args.drafters.split(",") if d)
  try:
    if not drafters:
      raise ValueError("--drafters is empty; name at least one drafter")
    prompts = prompt_suite.load(args.calibration)[:args.calibration_prompts]
    options = cli_args.drafter_options(drafters, [max(lengths)], args)
  except ValueError as e:
    sys.exit(f"jspec: {e}")
  cli_args.check_outputs(args, [args.json, args.plot])
  loaded = cli_args.load_model(args.model, args.weights, args.kv_cache)
  cli_args.check_context(loaded, [p.messages for p in prompts], args.max_new_tokens)
  tok = loaded.tokenizer
  ids = [tok.encode(tok.apply_chat_template(list(p.messages))) for p in prompts]
  report = measure.run(loaded, drafters, batch_sizes=batch_sizes, lengths=lengths, prompts=ids,
                       max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                       context=contexts, drafter_options=options,
                       log=lambda m: print(m, file=sys.stderr, flush=True))
  report["command"] = "jspec plan " + " ".join(args.argv)
  report["weights"] = args.weights
  report["kv_cache"] = args.kv_cache
  failed = []
  if not cli_args.save_text(args, args.json, json.dumps(report, indent=2)):
    failed.append("the plan was not saved")
  if args.plot:
    try:
      plot.pareto(report, args.plot)
      args.saved.append(os.path.abspath(args.plot))
    except OSError as e:
      failed.append(f"the plot was not written ({e.strerror or e})")
  print(_plan_text(report))
  if failed:
    sys.exit("jspec: " + "; ".join(failed))


def _plan_text(report: dict) -> str:
  from jspec.plan.model import expected_speedup

  lines = ["| B | best | predicted | runner-up | predicted |", "|---|---|---|---|---|"]
  name = lambda r: "plain" if r["num_draft"] == 0 else f"{r['drafter']} D={r['num_draft']}"
  for b, rows in report["ranking"].items():
    top = rows[:2] + [None] * (2 - len(rows[:2]))
    cells = [f"{name(r)} | {expected_speedup(r):.2f}x" if r else "— | —" for r in top]
    lines.append(f"| {b} | " + " | ".join(cells) + " |")
  lines.append("")
  for g in report["guidelines"]:
    verdict = {True: "holds", False: "does not hold", None: "not testable here"}[g["holds"]]
    lines.append(f"- {g['name']}: {verdict}. {g['hint']}. Measured: {g['evidence']}")
  return "\n".join(lines)


def _check_plan_weights(args) -> None:
  """A plan's costs hold for the weight format it was measured with (a stored format changes
  what a step and a verify cost): refuse another --weights."""
  try:
    with open(args.plan, encoding="utf-8") as f:
      measured = json.load(f).get("weights", "f32")
  except (OSError, ValueError, AttributeError):
    return      # CostTable.load has checked the file
  if measured != args.weights:
    raise ValueError(f"--plan {args.plan} was measured with --weights {measured}; pass --weights "
                     f"{measured}, or plan again with `jspec plan --weights {args.weights}`")


def _plan_choice(args, batch_size: int):
  """--plan FILE: (drafter, D) from the plan's schedule at this batch size; D = 0 is plain."""
  from jspec.plan import pick
  try:
    with open(args.plan, encoding="utf-8") as f:
      report = json.load(f)
    return pick(report["schedule"], batch_size)
  except (OSError, ValueError, KeyError, TypeError) as e:
    sys.exit(f"jspec: --plan {args.plan} is not a jspec plan report ({e}); write one with "
             "`jspec plan --json FILE`")


def main(argv=None) -> None:
  args = None
  current = [None]
  if argv is None:
    _watch_sigint(current)
  try:
    args = current[0] = _parse(argv)
    _compilation_cache()
    if argv is None:   # one of several processes (`python -m jspec.launch`): join the others
      from jspec.sharding import initialize_from_env
      try:
        initialize_from_env()
      except ValueError as e:
        sys.exit(f"jspec: {e}")
    args.func(args)
  except KeyboardInterrupt:
    _interrupted(args, in_process=argv is not None)


def _watch_sigint(current: list) -> None:
  """Ctrl-C raises KeyboardInterrupt as usual and also arms a watchdog: a KeyboardInterrupt that
  lands inside a callback or finaliser can be swallowed (seen: the bench kept running, and Python
  printed the "Exception ignored" traceback), so that one is not printed, and if the process is
  still alive 10 s later the watchdog ends it the same clean way."""
  import threading

  def handler(signum, frame):
    if not getattr(handler, "armed", False):
      handler.armed = True
      timer = threading.Timer(10.0, lambda: _interrupted(current[0], in_process=False))
      timer.daemon = True
      timer.start()
    raise KeyboardInterrupt

  signal.signal(signal.SIGINT, handler)
  default_hook = sys.unraisablehook

  def quiet(unraisable):   # the swallowed KeyboardInterrupt: the watchdog ends the run, no traceback
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
      default_hook(unraisable)

  sys.unraisablehook = quiet


def _parse(argv) -> argparse.Namespace:
  from models.registry import DEFAULT_MODEL
  from models.stored_layers import WEIGHTS

  parser = argparse.ArgumentParser(prog="jspec", description=__doc__)
  sub = parser.add_subparsers(dest="command", required=True)

  g = sub.add_parser("generate", help="generate a reply to PROMPT")
  g.add_argument("prompt")
  g.add_argument("--model", default=DEFAULT_MODEL)
  g.add_argument("--weights", choices=WEIGHTS, default="f32",
                 help=cli_args.WEIGHTS_HELP)
  g.add_argument("--kv-cache", choices=("f32", "bf16"), default="f32",
                 help=cli_args.KV_CACHE_HELP)
  g.add_argument("--max-new-tokens", type=int, default=128)
  g.add_argument("--temperature", type=float, default=0.0)
  g.add_argument("--top-k", type=int, default=0)
  g.add_argument("--top-p", type=float, default=1.0)
  g.add_argument("--seed", type=int, default=0)
  g.add_argument("--system", default=None, help="system message for the chat template")
  g.add_argument("--raw", action="store_true", help="continue PROMPT as-is, no chat template")
  g.add_argument("--json", action="store_true", help="print one JSON object")
  g.add_argument("--drafter", default="none", choices=["none"] + _drafter_names(),
                 help="speculative drafter; with one, plain decoding also runs for the speedup")
  g.add_argument("--num-draft", default=None,
                 help="draft tokens per round (D), or 'auto' (the default for chains): each round "
                 "verifies 0-7 drafts, chosen from the acceptance so far and the measured round "
                 "costs; trees, DSpark's confidence schedule and Medusa default to 3")
  g.add_argument("--prediction", default=None, metavar="FILE",
                 help="text file with the expected output (e.g. the code being edited): "
                 "speculate from it (predicted outputs; implies --drafter prediction)")
  g.add_argument("--plan", default=None, metavar="FILE",
                 help="a `jspec plan` report: its drafter and D for one prompt (unless --drafter "
                 "is given) and its measured cost table for the 'auto' draft length")
  g.add_argument("--mesh", default=None, metavar="SPEC",
                 help="shard the target over a device mesh, e.g. 'data=1,model=4' (axes data, "
                 "model, expert; on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N)")
  cli_args.add_drafter_flags(g)
  g.set_defaults(func=cmd_generate)

  b = sub.add_parser("bench-decode", help="plain-decode tokens/s vs a measured bandwidth roofline")
  b.add_argument("--model", default=DEFAULT_MODEL)
  b.add_argument("--weights", choices=WEIGHTS, default="f32",
                 help=cli_args.WEIGHTS_HELP)
  b.add_argument("--kv-cache", choices=("f32", "bf16"), default="f32",
                 help=cli_args.KV_CACHE_HELP)
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
  s.add_argument("--weights", choices=WEIGHTS, default="f32",
                 help=cli_args.WEIGHTS_HELP)
  s.add_argument("--kv-cache", choices=("f32", "bf16"), default="f32",
                 help=cli_args.KV_CACHE_HELP)
  s.add_argument("--drafters", default="ngram,layer-skip",
                 help="comma-separated, of: " + ", ".join(_drafter_names()) +
                 " (draft-model defaults to the target as its own draft); a variant sets "
                 "method keys, e.g. eagle3:tree_top_k=3:tree_depth=4 (a tree: --num-draft is "
                 "its node budget)")
  s.add_argument("--num-draft", default="1,3,7",
                 help="comma-separated D values; 'auto' for the adaptive draft length")
  s.add_argument("--batch-size", default="1,4")
  s.add_argument("--temperature", type=float, default=0.0)
  s.add_argument("--max-new-tokens", type=int, default=128)
  s.add_argument("--repeats", type=int, default=1, help="runs of every batch")
  s.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens")
  cli_args.add_drafter_flags(s)
  s.add_argument("--seed", type=int, default=0)
  s.add_argument("--json", default=None, help="write the report to this file")
  s.add_argument("--plot", default=None, help="write PNG plots into this folder")
  s.add_argument("--plan", default=None, metavar="FILE",
                 help="a `jspec plan` report: its measured cost tables for 'auto' draft lengths")
  s.add_argument("--no-progress", action="store_true")
  s.set_defaults(func=cmd_bench)

  pl = sub.add_parser("plan", help="measure verify/draft costs and acceptance on this device; "
                      "pick the drafter and D per batch size")
  pl.add_argument("--model", default=DEFAULT_MODEL)
  pl.add_argument("--weights", choices=WEIGHTS, default="f32",
                 help=cli_args.WEIGHTS_HELP)
  pl.add_argument("--kv-cache", choices=("f32", "bf16"), default="f32",
                  help=cli_args.KV_CACHE_HELP)
  pl.add_argument("--drafters", default="ngram,eagle3",
                  help="comma-separated, of: " + ", ".join(_drafter_names()))
  pl.add_argument("--batch-sizes", default="1,4")
  pl.add_argument("--num-draft", default="1,2,3,5,7", help="draft lengths to plan over")
  pl.add_argument("--calibration", default="benchmarks/prompts/calibration.jsonl",
                  help="prompts for the acceptance measurement (never the benchmark suite; the "
                  "default: 32 prompts sampled from the default model, in no drafter's training "
                  "data)")
  pl.add_argument("--calibration-prompts", type=int, default=16)
  pl.add_argument("--max-new-tokens", type=int, default=64)
  pl.add_argument("--context", default="256",
                  help="cache fill (prompt padding) for the verify, draft and round timings: near "
                  "the length of the prompts you will decode; several (e.g. 128,512): the rounds "
                  "are timed at each and decoders price them at their own padding, the forwards "
                  "and drafts at the largest")
  pl.add_argument("--repeats", type=int, default=7, help="timing rounds")
  pl.add_argument("--json", required=True, help="write the plan here")
  pl.add_argument("--plot", default=None, help="write the Pareto plot (PNG) here")
  cli_args.add_drafter_flags(pl)
  pl.set_defaults(func=cmd_plan)

  from jspec.train.cli import add_parser as add_train_parser
  add_train_parser(sub, DEFAULT_MODEL)

  args = parser.parse_args(argv)
  args.argv = list(sys.argv[2:] if argv is None else argv[1:])
  args.outputs, args.saved = [], []
  return args


def _interrupted(args, in_process: bool) -> None:
  """Ctrl-C: one line saying what stopped and what was saved, exit 130, no traceback. Files are
  written atomically, so whatever was not saved is left exactly as it was before the run."""
  import threading
  if not in_process and threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # a second Ctrl-C must not cut this short
  saved = args.saved if args else []
  kept = [p for p in args.outputs if p not in saved] if args else []
  words = [getattr(args, k, None) for k in ("command", "train_command")] if args else []
  said = f"saved {', '.join(saved)}" if saved else "nothing was saved"
  if kept:
    said += f" ({', '.join(kept)} not written; any older copy is untouched)"
  # a command that saves as it goes (checkpoints, shards) sets its own note: what, how to resume
  said = getattr(args, "interrupt_note", None) or said
  line = " ".join(["jspec"] + [w for w in words if w]) + f": interrupted; {said}"
  if "tqdm" in sys.modules:      # end a progress bar's line so that ours starts on a fresh one
    for bar in list(getattr(sys.modules["tqdm"].tqdm, "_instances", ())):
      bar.close()
  print(line, file=sys.stderr, flush=True)
  if in_process:
    raise SystemExit(130)
  try:
    sys.stdout.flush()
  except OSError:
    pass
  # Skip interpreter teardown: with XLA's threads mid-work it segfaulted about one run in three.
  os._exit(130)


if __name__ == "__main__":
  main()
