"""`jspec train data` (regenerate replies with the target), `jspec train eagle3` (train, resume,
export a speculators-format head), `jspec train medusa`, `mtp`, `dflash` and `dspark` (the same
for Medusa heads, MTP modules and DFlash / DSpark block drafters), `jspec train calibrate` (the
calibration saved beside a DSpark or Medusa head)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

DEFAULT_EAGLE3_VOCAB = 8192
COMPUTE_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}     # --compute-dtype


def _ints(text: str | None, flag: str) -> tuple[int, ...] | None:
  if text is None:
    return None
  try:
    return tuple(int(x) for x in text.split(","))
  except ValueError:
    sys.exit(f"jspec: {flag} takes comma-separated integers, got {text!r}")


def cmd_data(args) -> None:
  from jspec.train.data import build_dataset

  args.interrupt_note = (f"finished shards are saved in {args.out}; run the same command again "
                         "to resume")
  for flag in ("magpie", "max_new_tokens", "batch_size", "shard_size", "first_shard"):
    v, low = getattr(args, flag), (0 if flag in ("magpie", "first_shard") else 1)
    if v < low:
      sys.exit(f"jspec: --{flag.replace('_', '-')} must be >= {low}, got {v}")
  for path in args.prompts:
    if not os.path.isfile(path):
      sys.exit(f"jspec: prompt file {path} does not exist")
  try:
    manifest = build_dataset(args.model, args.out, prompt_files=args.prompts,
                             num_magpie=args.magpie, max_new_tokens=args.max_new_tokens,
                             batch_size=args.batch_size, shard_size=args.shard_size,
                             temperature=args.temperature, multi_turn=args.multi_turn,
                             max_len=args.max_len, taps=_ints(args.taps, "--taps") or (),
                             shuffle=args.shuffle, first_shard=args.first_shard,
                             seed=args.seed, progress=not args.no_progress)
  except (ValueError, OSError) as e:
    sys.exit(f"jspec: {e}")
  print(json.dumps({k: v for k, v in manifest.items() if k != "shards"}, indent=2))


def cmd_snapshot(args) -> None:
  from jspec.train.shards import snapshot

  sources = []
  for spec in args.sources:
    folder, _, which = spec.rpartition(":")
    first, dash, last = which.partition("-")
    if folder and which.isdigit():
      sources.append((folder, int(which)))
    elif folder and dash and first.isdigit() and (last.isdigit() or not last):
      sources.append((folder, (int(first), int(last) if last else None)))
    else:
      sources.append((spec, None))
  try:
    manifest = snapshot(args.out, sources)
  except (ValueError, OSError) as e:
    sys.exit(f"jspec: {e}")
  print(json.dumps(dict(out=os.path.abspath(args.out), shards=len(manifest["shards"]),
                        totals=manifest["totals"]), indent=2))


def _positive(args, *flags: str) -> None:
  for flag in flags:
    if getattr(args, flag) < 1:
      raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")


def _train(args, weights: str, validate, make_task, prepare_features, save,
           draft_ids=None) -> None:
  """The shared shape of `jspec train eagle3 | medusa | mtp`: cheap checks first (settings, data,
  a writable export), then the draft vocabulary, the method's Task, its feature cache, training
  with checkpoints (resumed by running the same command), and the export.

  validate() raises ValueError for the method's own flags; make_task(target, ids) -> Task;
  prepare_features(target, folder, cfg, task) fills the feature cache; save(module, folder, dtype,
  verifier) -> {file: sha256}; draft_ids: the draft vocabulary of a head training starts from
  (else it is chosen from the data)."""
  import jax.numpy as jnp

  import models
  from jspec.io import check_writable
  from jspec.train import eagle3, trainer
  from jspec.train.shards import read_manifest, token_counts

  try:   # everything cheap first: settings, data, writable outputs
    cfg = trainer.TrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                              lr=args.lr, warmup=args.warmup, save_every=args.save_every,
                              keep=args.keep, eval_every=args.eval_every, holdout=args.holdout,
                              seed=args.seed, reply_windows=args.reply_windows,
                              pack=getattr(args, "pack", False))
    validate()
    if args.vocab_coverage is not None and not 0 < args.vocab_coverage <= 1:
      raise ValueError(f"--vocab-coverage is a share in (0, 1], got {args.vocab_coverage}")
    read_manifest(args.data)
    export = args.export or os.path.join(args.out, "head")
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(export, exist_ok=True)
    check_writable(os.path.join(export, weights))
  except (ValueError, OSError) as e:
    sys.exit(f"jspec: {e}")
  args.interrupt_note = (f"checkpoints are saved in {args.out}/checkpoints; run the same "
                         "command again to resume")
  loaded = models.load(args.model)
  target = loaded.model
  v = target.config.vocab_size
  # rank by reply counts, ties (unseen in replies) by counts over whole conversations
  rank = lambda part: (token_counts(args.data, v, part=part) * (everywhere.sum() + 1)
                       + token_counts(args.data, v, replies_only=False, part=part))
  try:
    counts = token_counts(args.data, v)
    everywhere = token_counts(args.data, v, replies_only=False)
    check = token_counts(args.data, v, part="check")      # a tenth of the sequences, held out
    if draft_ids is not None:
      fit_ids = ids = np.asarray(draft_ids)
    else:
      size = args.draft_vocab
      if args.vocab_coverage is not None:   # sized on the other nine tenths, measured on this one
        size, _ = eagle3.size_for_coverage(rank("fit"), check, args.vocab_coverage)
      fit_ids = eagle3.draft_vocab(rank("fit"), size)
      ids = eagle3.draft_vocab(counts * (everywhere.sum() + 1) + everywhere, size)
    task = make_task(target, ids)
  except ValueError as e:
    sys.exit(f"jspec: {e}")
  coverage = counts[ids].sum() / max(counts.sum(), 1)
  heldout_coverage = check[fit_ids].sum() / max(check.sum(), 1)
  how = ("the head's, chosen from its own data" if draft_ids is not None else
         f"{heldout_coverage:.1%} of held-out replies when chosen without them")
  print(f"jspec: draft vocabulary {len(ids)} tokens covers {coverage:.1%} of reply tokens "
        f"({how})", file=sys.stderr)
  features = args.features or (os.path.join(args.out, "features") if args.cache_features else None)
  try:
    if features is not None:
      prepare_features(target, features, cfg, task)
    history = trainer.train(task, args.data, args.out, cfg, progress=not args.no_progress,
                            stop_after=args.stop_after, features=features)
  except ValueError as e:
    sys.exit(f"jspec: {e}")
  dtype = {"bf16": jnp.bfloat16, "fp32": jnp.float32}[args.dtype]
  sums = save(task.module(task.params), export, dtype, loaded.name)
  last_eval = next((r["eval"] for r in reversed(history) if r.get("eval")), None)
  if draft_ids is not None:   # the head's vocabulary was not chosen on part of this data
    heldout_coverage = None
  print(json.dumps(dict(head=os.path.abspath(export), sha256=sums, steps_run=len(history),
                        draft_vocab=len(ids), draft_vocab_coverage=coverage,
                        draft_vocab_heldout_coverage=heldout_coverage,
                        heldout=last_eval), indent=2))


def cmd_eagle3(args) -> None:
  from jspec.drafters import heads
  from jspec.drafters.eagle3 import attach_target_rows
  from jspec.drafters.eagle3 import checkpoint as speculators_format
  from jspec.train import eagle3
  from jspec.train.features import cache_features

  init = None
  if args.init is not None:   # the head fixes taps, vocabulary and LM head: no flag may differ
    try:
      given = [f for f, v in (("--taps", args.taps), ("--draft-vocab", args.draft_vocab),
                              ("--vocab-coverage", args.vocab_coverage)) if v is not None]
      if given:
        raise ValueError(f"--init takes the taps and draft vocabulary from the head; drop "
                         f"{', '.join(given)}")
      init = speculators_format.load_eagle3(args.init)
      if args.lm_head != init.config.lm_head:
        raise ValueError(f"--init head {args.init} has lm_head={init.config.lm_head!r}; pass "
                         f"--lm-head {init.config.lm_head} or drop --init")
    except (ValueError, OSError) as e:
      sys.exit(f"jspec: {e}")
  elif args.draft_vocab is None:
    args.draft_vocab = DEFAULT_EAGLE3_VOCAB

  compute = COMPUTE_DTYPES[args.compute_dtype]

  def task(target, ids):
    if init is None:
      return eagle3.eagle3_task(target, ids, taps=_ints(args.taps, "--taps"),
                                ttt_steps=args.ttt_steps, decay=args.decay, seed=args.seed,
                                lm_head=args.lm_head, compute_dtype=compute)
    init.config.check_target(target.config)
    attach_target_rows(init, target)
    return eagle3.eagle3_task(target, ids, ttt_steps=args.ttt_steps, decay=args.decay, head=init,
                              compute_dtype=compute)

  def prepare(target, folder, cfg, task):
    cache_features(target, args.data, folder, taps=tuple(task.meta["head"]["taps"]),
                   batch_size=cfg.batch_size, progress=not args.no_progress)

  _train(args, heads.WEIGHTS, lambda: _positive(args, "ttt_steps"), task, prepare,
         lambda head, folder, dtype, verifier: speculators_format.save_eagle3(
             head, folder, dtype=dtype, num_draft=args.ttt_steps, verifier=verifier),
         draft_ids=None if init is None else np.asarray(init.draft_to_target[...]))


def cmd_replay(args) -> None:
  import hashlib

  import models
  from jspec import prompt_suite
  from jspec.drafters.eagle3 import checkpoint as speculators_format
  from jspec.drafters.eagle3 import attach_target_rows
  from jspec.train import eagle3
  from jspec.train.replay import greedy_replies, replay_prompts

  try:
    _positive(args, "num_draft", "batch_size")
    if args.max_new_tokens < 2:
      raise ValueError(f"--max-new-tokens must be >= 2, got {args.max_new_tokens}")
    prompts = prompt_suite.select(prompt_suite.load(args.prompts), per_category=args.per_category)
    loaded = models.load(args.model, quiet=True)
    head = speculators_format.load_eagle3(args.head)
    head.config.check_target(loaded.model.config)
  except (ValueError, OSError) as e:
    sys.exit(f"jspec: {e}")
  target, tok = loaded.model, loaded.tokenizer
  ids = [tok.encode(tok.apply_chat_template(list(p.messages))) for p in prompts]
  # the replies depend only on the target and the prompts: kept in --replies between heads
  key = dict(model=loaded.name, max_new_tokens=args.max_new_tokens, eos_ids=list(tok.eos_ids),
             prompts=hashlib.sha256(json.dumps(ids).encode()).hexdigest())
  replies = None
  if args.replies and os.path.isfile(args.replies):
    try:
      with open(args.replies) as f:
        cached = json.load(f)
      replies = cached["replies"] if cached.get("key") == key else None
    except (ValueError, KeyError, AttributeError):   # unreadable: made again
      replies = None
  if replies is None:
    replies = greedy_replies(target, ids, max_new_tokens=args.max_new_tokens,
                             eos_ids=tok.eos_ids, batch_size=args.batch_size)
    if args.replies:
      from jspec.io import atomic_write_bytes
      atomic_write_bytes(args.replies, json.dumps(dict(key=key, replies=replies)).encode())
  attach_target_rows(head, target)
  result = replay_prompts([(p.category, i) for p, i in zip(prompts, ids)], replies,
                          eagle3.draft_predictor(head, target, args.num_draft))
  report = dict(head=os.path.abspath(args.head), prompts=args.prompts, num_draft=args.num_draft,
                max_new_tokens=args.max_new_tokens, per_category=args.per_category,
                categories={k: dict(acceptance_length=r.acceptance_length, rounds=r.rounds,
                                    per_position_acceptance=(r.accepted_at / r.rounds).tolist())
                            for k, r in sorted(result.items())})
  text = json.dumps(report, indent=2)
  if args.json:
    from jspec.io import atomic_write_bytes
    atomic_write_bytes(args.json, (text + "\n").encode())
  print(text)


def cmd_calibrate(args) -> None:
  import models
  from jspec import prompt_suite
  from jspec.drafters import heads
  from jspec.train.calibrate import calibrate_dspark, calibrate_medusa, pack_replies

  try:
    _positive(args, "num", "max_prompt_tokens", "ranks")
    if args.max_new_tokens < 2:
      raise ValueError(f"--max-new-tokens must be >= 2, got {args.max_new_tokens}")
    loaded = models.load(args.model, quiet=True)
    folder = args.head or heads.shipped_head(args.method, loaded.model.config)[0]
    if not os.path.isdir(folder):
      raise ValueError(f"--head {folder} is not a folder; give a trained {args.method} head")
    tok = loaded.tokenizer
    ids = [tok.encode(tok.apply_chat_template(list(p.messages)))
           for p in prompt_suite.load(args.prompts)]
    ids = [p for p in ids if len(p) <= args.max_prompt_tokens][:args.num]
    if not ids:
      raise ValueError(f"{args.prompts} has no prompt of at most {args.max_prompt_tokens} tokens")
    data = pack_replies(loaded.model, ids, eos_ids=tok.eos_ids, max_new_tokens=args.max_new_tokens)
    run = calibrate_dspark if args.method == "dspark" else calibrate_medusa
    extra = {"ranks": args.ranks} if args.method == "medusa" else {}
    summary = run(loaded.model, folder, data, source=args.prompts, **extra)
  except (ValueError, OSError) as e:
    sys.exit(f"jspec: {e}")
  print(json.dumps({"head": os.path.abspath(folder), "prompts": len(ids),
                    "reply_tokens": data.reply_tokens, **summary}, indent=2))


def _take_from_init(args, what: str, has: dict, clash=()) -> None:
  """--init: the head folder's values of these flags (`has`) become the run's; a flag given with
  another value, `clash`, or --vocab-coverage is refused with each flag named."""
  clash = [f"--{k.replace('_', '-')} {getattr(args, k)} (the head has {v})"
           for k, v in has.items() if getattr(args, k) not in (None, v)] + list(clash)
  if args.vocab_coverage is not None:
    clash.append(f"--vocab-coverage {args.vocab_coverage} (the head has its vocabulary)")
  if clash:
    raise ValueError(f"--init {args.init} fixes {what}; drop {', '.join(clash)}")
  for k, v in has.items():
    setattr(args, k, v)


MEDUSA_SHAPE = dict(num_heads=4, num_layers=1, draft_vocab=2048, lm_head="own")  # the defaults


def cmd_medusa(args) -> None:
  from jspec.drafters import heads
  from jspec.drafters.medusa import attach_target_rows
  from jspec.drafters.medusa import checkpoint as medusa_format
  from jspec.train import medusa
  from jspec.train.features import last_slot_features

  init = None
  if args.init is not None:   # the head fixes its shape and vocabulary: a flag may only agree
    try:
      init = medusa_format.load_medusa(args.init)
      c = init.config
      _take_from_init(args, "the heads' shape and draft vocabulary", dict(
          num_heads=c.num_heads, num_layers=c.num_layers, draft_vocab=c.draft_vocab_size,
          lm_head=c.lm_head))
    except (ValueError, OSError) as e:
      sys.exit(f"jspec: {e}")
  for k, v in MEDUSA_SHAPE.items():
    if getattr(args, k) is None:
      setattr(args, k, v)

  def task(target, ids):
    if init is None:
      return medusa.medusa_task(target, ids, num_heads=args.num_heads, num_layers=args.num_layers,
                                decay=args.decay, seed=args.seed, lm_head=args.lm_head)
    if init.config.hidden_size != target.config.hidden_size or (
        init.config.vocab_size != target.config.vocab_size):
      raise ValueError(f"--init {args.init} was trained for another target (hidden "
                       f"{init.config.hidden_size}, vocabulary {init.config.vocab_size}); "
                       f"this one has {target.config.hidden_size}, {target.config.vocab_size}")
    attach_target_rows(init, target)
    return medusa.medusa_task(target, ids, decay=args.decay, head=init)

  _train(args, heads.WEIGHTS, lambda: _positive(args, "num_heads", "num_layers"), task,
         lambda target, folder, cfg, task: last_slot_features(
             target, args.data, folder, batch_size=cfg.batch_size,
             progress=not args.no_progress),
         lambda head, folder, dtype, verifier: medusa_format.save_medusa(
             head, folder, dtype=dtype, verifier=verifier),
         draft_ids=None if init is None else np.asarray(init.draft_to_target[...]))


MTP_VOCAB = 6144     # `jspec train mtp --draft-vocab` without --init


def cmd_mtp(args) -> None:
  from jspec.drafters import heads
  from jspec.drafters.mtp import checkpoint as mtp_format
  from jspec.train import mtp
  from jspec.train.features import last_slot_features

  init = None
  if args.init is not None:   # the module fixes its draft vocabulary: the flag may only agree
    try:
      init = mtp_format.load_mtp(args.init)
      _take_from_init(args, "the module's draft vocabulary",
                      dict(draft_vocab=init.config.draft_vocab_size))
    except (ValueError, OSError) as e:
      sys.exit(f"jspec: {e}")
  elif args.draft_vocab is None:
    args.draft_vocab = MTP_VOCAB

  def validate():
    _positive(args, "mtp_steps")
    if not 0 < args.beta <= 1:
      raise ValueError(f"--beta must be in (0, 1], got {args.beta}")

  def task(target, ids):
    return mtp.mtp_task(target, ids, steps=args.mtp_steps, beta=args.beta, seed=args.seed,
                        module=init, compute_dtype=COMPUTE_DTYPES[args.compute_dtype])

  _train(args, heads.WEIGHTS, validate, task,
         lambda target, folder, cfg, task: last_slot_features(
             target, args.data, folder, batch_size=cfg.batch_size,
             progress=not args.no_progress),
         lambda module, folder, dtype, verifier: mtp_format.save_mtp(
             module, folder, dtype=dtype, num_draft=args.mtp_steps, verifier=verifier),
         draft_ids=None if init is None else np.asarray(init.draft_to_target[...]))


BLOCK_SHAPE = dict(num_layers=1, block_size=8, sliding_window=0, markov_rank=256,
                   draft_vocab=8192)    # the defaults of `jspec train dflash | dspark`


def _block_init(args, kind: str):
  """--init: the module of a DFlash / DSpark head folder; its shape flags come from the folder (a
  flag given may only agree). None without --init."""
  from jspec.drafters.dflash import checkpoint as dflash_format

  if args.init is None:
    return None
  module = dflash_format.load(args.init, kind)
  c = module.config
  has = dict(num_layers=c.num_layers, block_size=c.block_size, sliding_window=c.sliding_window,
             draft_vocab=c.draft_vocab_size, mask_token=c.mask_token_id,
             taps=",".join(str(t) for t in c.taps))
  if kind == "dspark":
    has["markov_rank"] = c.markov_rank
  if args.taps is not None and _ints(args.taps, "--taps") == tuple(c.taps):
    args.taps = has["taps"]                        # the same taps, written differently
  extra = ["--markov-gated (the head's Markov head is not gated)"] if (
      args.markov_gated and not c.markov_gated) else []
  _take_from_init(args, "the module's shape and draft vocabulary", has, extra)
  args.markov_gated = c.markov_gated
  return module


def _cmd_block(args, kind: str) -> None:
  from jspec.drafters import heads
  from jspec.drafters.dflash import checkpoint as dflash_format
  from jspec.train import dflash
  from jspec.train.shards import token_counts
  from jspec.train.features import cache_features

  try:
    init = _block_init(args, kind)
  except (ValueError, OSError) as e:
    sys.exit(f"jspec: {e}")
  for k, v in BLOCK_SHAPE.items():
    if getattr(args, k) is None:
      setattr(args, k, v)

  def validate():
    _positive(args, "num_layers", "block_size", "max_anchors")
    if args.block_size < 2:
      raise ValueError(f"--block-size must be >= 2, got {args.block_size}")
    if not args.gamma > 0:
      raise ValueError(f"--gamma must be > 0, got {args.gamma}")
    if args.sliding_window < 0:
      raise ValueError(f"--sliding-window must be >= 0, got {args.sliding_window}")
    if kind == "dspark":
      _positive(args, "markov_rank")

  def make_task(target, ids):
    common = dict(gamma=args.gamma, max_anchors=args.max_anchors, seed=args.seed,
                  compute_dtype=COMPUTE_DTYPES[args.compute_dtype])
    if init is not None:
      c, t = init.config, target.config
      if (c.hidden_size, c.vocab_size) != (t.hidden_size, t.vocab_size):
        raise ValueError(f"--init {args.init} was trained for another target (hidden "
                         f"{c.hidden_size}, vocabulary {c.vocab_size}); this one has "
                         f"{t.hidden_size}, {t.vocab_size}")
      return dflash.block_task(target, ids, kind, module=init, **common)
    mask = args.mask_token
    if mask is None:   # the first token id that never occurs in the data
      unused = np.flatnonzero(token_counts(args.data, target.config.vocab_size,
                                           replies_only=False) == 0)
      if not len(unused):
        raise ValueError("every token occurs in the data: choose the MASK token with "
                         "--mask-token ID")
      mask = int(unused[0])
    return dflash.block_task(target, ids, kind, num_layers=args.num_layers,
                             block_size=args.block_size, mask_token_id=mask,
                             taps=_ints(args.taps, "--taps"), markov_rank=args.markov_rank,
                             markov_gated=args.markov_gated,
                             sliding_window=args.sliding_window, **common)

  def prepare(target, folder, cfg, task):
    cache_features(target, args.data, folder, taps=tuple(task.meta["head"]["taps"]),
                   batch_size=cfg.batch_size, progress=not args.no_progress)

  ids = None
  if init is not None:
    ids = np.asarray((init.backbone if kind == "dspark" else init).draft_to_target[...])
  _train(args, heads.WEIGHTS, validate, make_task, prepare,
         lambda module, folder, dtype, verifier: dflash_format.save(module, folder, dtype=dtype,
                                                                    verifier=verifier),
         draft_ids=ids)


def cmd_dflash(args) -> None:
  _cmd_block(args, "dflash")


def cmd_dspark(args) -> None:
  _cmd_block(args, "dspark")


def _compute_dtype_flag(p) -> None:
  p.add_argument("--compute-dtype", choices=sorted(COMPUTE_DTYPES), default="bf16",
                 help="bf16: mixed precision, the products in bfloat16 with float32 results, "
                      "float32 weights, norms, softmax and loss (1.5x faster where the CPU has "
                      "AVX512-BF16); fp32: every product in float32")


def _pack_flag(p) -> None:
  p.add_argument("--pack", action="store_true",
                 help="pack several conversations (or, with --reply-windows, windows) into "
                      "each row, kept apart in attention, labels and positions; needs a feature "
                      "cache. On the default corpus: about 1.17x the labels per step (236 a "
                      "row with --reply-windows, which label twice the reply tokens an epoch)")


def _reply_windows_flag(p) -> None:
  p.add_argument("--reply-windows", action="store_true",
                 help="train on windows that label every reply token, however long the "
                      "conversation (default: each conversation's first --seq-len tokens)")


def _common(p, default_model: str, lr: float, warmup: int, draft_vocab: int) -> None:
  """The flags every `jspec train METHOD` shares."""
  p.add_argument("--data", required=True, help="a folder written by `jspec train data`")
  p.add_argument("--out", required=True, help="checkpoints, train_log.jsonl and head/")
  p.add_argument("--model", default=default_model)
  p.add_argument("--export", default=None, help="head folder (default OUT/head)")
  p.add_argument("--steps", type=int, default=2000)
  p.add_argument("--stop-after", type=int, default=None,
                 help="end after this many steps of this run (resume later)")
  p.add_argument("--batch-size", type=int, default=8)
  p.add_argument("--seq-len", type=int, default=512)
  p.add_argument("--lr", type=float, default=lr)
  p.add_argument("--warmup", type=int, default=warmup)
  p.add_argument("--draft-vocab", type=int, default=draft_vocab)
  p.add_argument("--vocab-coverage", type=float, default=None,
                 help="size the draft vocabulary (a multiple of 256) to hold this share of "
                      "held-out reply tokens, e.g. 0.97; overrides --draft-vocab")
  p.add_argument("--save-every", type=int, default=100)
  p.add_argument("--keep", type=int, default=3)
  p.add_argument("--eval-every", type=int, default=200)
  p.add_argument("--holdout", type=int, default=32)
  _reply_windows_flag(p)
  p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="exported weights")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--no-progress", action="store_true")


def add_parser(sub, default_model: str) -> None:
  t = sub.add_parser("train", help="build drafter training data; train a learned drafter")
  tsub = t.add_subparsers(dest="train_command", required=True)

  d = tsub.add_parser("data", help="regenerate replies with the target (resumable shards)")
  d.add_argument("out", help="output folder (shards + manifest.json); rerun to resume")
  d.add_argument("--model", default=default_model)
  d.add_argument("--prompts", nargs="*", default=["benchmarks/prompts/train.jsonl"],
                 help="prompt files in the suite's JSON Lines format")
  d.add_argument("--magpie", type=int, default=0,
                 help="also sample this many user prompts from the target (Magpie)")
  d.add_argument("--max-new-tokens", type=int, default=512)
  d.add_argument("--batch-size", type=int, default=64,
                 help="rows decoded together; a finished row's slot takes the next prompt")
  d.add_argument("--max-len", type=int, default=None,
                 help="tokens per row (prompt + replies; default 2048 or the model's context); "
                      "longer prompts are skipped")
  d.add_argument("--taps", default=None,
                 help="comma-separated layers whose hidden states are saved while generating "
                      "(the final one is added), e.g. 2,15,27: EAGLE-3's for the default model; "
                      "`jspec train eagle3 --cache-features` then copies them, no second pass")
  d.add_argument("--shuffle", action="store_true",
                 help="answer the prompts in a seeded random order (every shard then holds each "
                      "family in proportion; a partial run is a fair sample)")
  d.add_argument("--shard-size", type=int, default=256)
  d.add_argument("--first-shard", type=int, default=0,
                 help="start at this shard of the (shuffled) order, skipping the earlier ones: "
                      "fresh prompts beyond another folder's first N shards, with the same bytes "
                      "as that folder's shard N onwards")
  d.add_argument("--temperature", type=float, default=0.0, help="for the replies")
  d.add_argument("--multi-turn", type=float, default=0.0,
                 help="fraction of conversations continued for one more user turn")
  d.add_argument("--seed", type=int, default=0)
  d.add_argument("--no-progress", action="store_true")
  d.set_defaults(func=cmd_data)
  sn = tsub.add_parser("snapshot", help="a fixed training set: finished shards of regenerated "
                                          "folders, linked")
  sn.add_argument("out", help="a new folder")
  sn.add_argument("sources", nargs="+", metavar="SRC[:N|:A-B|:A-]",
                  help="a `jspec train data` folder and which of its finished shards to take: the "
                       "first N, those numbered A to B in their file names (both included), or "
                       "from A on (default all); several are joined in order")
  sn.set_defaults(func=cmd_snapshot)
  r = tsub.add_parser("replay", help="an EAGLE-3 head's greedy acceptance per prompt category, "
                                     "replayed from one teacher-forced pass over the target's "
                                     "replies (equal to SpecDecoder's, without decoding)")
  r.add_argument("--head", required=True, help="an EAGLE-3 head folder (speculators format)")
  r.add_argument("--prompts", required=True, help="a prompt suite (JSON Lines with categories)")
  r.add_argument("--model", default=default_model)
  r.add_argument("--num-draft", type=int, default=5)
  r.add_argument("--max-new-tokens", type=int, default=128)
  r.add_argument("--per-category", type=int, default=None, help="the first N prompts per category")
  r.add_argument("--batch-size", type=int, default=8, help="rows per greedy generation")
  r.add_argument("--replies", default=None,
                 help="a JSON file keeping the target's greedy replies between runs (written "
                      "when missing or made for other prompts, settings or model)")
  r.add_argument("--json", default=None, help="also write the result here")
  r.set_defaults(func=cmd_replay)
  c = tsub.add_parser("calibrate", help="measure a trained head's calibration on prompts it never "
                                       "saw and save it beside the head: DSpark's confidence "
                                       "temperatures (confidence_schedule), Medusa's rank "
                                       "accuracies (tree_choices='auto')")
  c.add_argument("method", choices=["dspark", "medusa"])
  c.add_argument("--prompts", required=True,
                 help="prompts the head never trained on, not the benchmark suite (JSON Lines)")
  c.add_argument("--head", default=None, help="the head folder (default: the shipped head)")
  c.add_argument("--model", default=default_model)
  c.add_argument("--num", type=int, default=24, help="prompts used")
  c.add_argument("--max-prompt-tokens", type=int, default=192, help="longer prompts are skipped")
  c.add_argument("--max-new-tokens", type=int, default=96, help="greedy reply tokens per prompt")
  c.add_argument("--ranks", type=int, default=4, help="medusa: candidates ranked per head")
  c.set_defaults(func=cmd_calibrate)
  from jspec.train.prompts.cli import add_parser as add_prompts_parser
  add_prompts_parser(tsub, default_model)

  e = tsub.add_parser("eagle3", help="train an EAGLE-3 head (orbax checkpoints; resumes)")
  e.add_argument("--data", required=True, help="a folder written by `jspec train data`")
  e.add_argument("--out", required=True, help="checkpoints, train_log.jsonl and head/")
  e.add_argument("--model", default=default_model)
  e.add_argument("--export", default=None, help="head folder (default OUT/head)")
  e.add_argument("--steps", type=int, default=2000)
  e.add_argument("--stop-after", type=int, default=None,
                 help="end after this many steps of this run (resume later)")
  e.add_argument("--batch-size", type=int, default=8)
  e.add_argument("--seq-len", type=int, default=512)
  e.add_argument("--lr", type=float, default=3e-4)
  e.add_argument("--warmup", type=int, default=100)
  e.add_argument("--ttt-steps", type=int, default=3)
  e.add_argument("--decay", type=float, default=0.8, help="loss weight decay per TTT step")
  e.add_argument("--draft-vocab", type=int, default=None,
                 help=f"draft vocabulary size (default {DEFAULT_EAGLE3_VOCAB})")
  e.add_argument("--vocab-coverage", type=float, default=None,
                 help="size the draft vocabulary (a multiple of 256) to hold this share of "
                      "held-out reply tokens, e.g. 0.97; overrides --draft-vocab")
  e.add_argument("--lm-head", choices=["own", "target"], default="own",
                 help="own: the head trains and saves its LM head; target: it drafts with the "
                      "target's LM-head rows of the draft vocabulary (frozen, not saved: a large "
                      "draft vocabulary costs no checkpoint bytes)")
  e.add_argument("--taps", default=None, help="target layers, e.g. 2,15,27 (default 2,L//2,L-3)")
  e.add_argument("--init", default=None,
                 help="start from this EAGLE-3 head folder (its taps, draft vocabulary and "
                      "weights; the optimiser and schedule start afresh), e.g. to train an "
                      "exported head further")
  e.add_argument("--save-every", type=int, default=100)
  e.add_argument("--keep", type=int, default=3)
  e.add_argument("--eval-every", type=int, default=200)
  e.add_argument("--holdout", type=int, default=32)
  _reply_windows_flag(e)
  _pack_flag(e)
  e.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="exported weights")
  _compute_dtype_flag(e)
  e.add_argument("--cache-features", action="store_true",
                 help="compute the target's features once into OUT/features (bf16, about "
                      "4.6 KB per token for SmolLM2) instead of every step")
  e.add_argument("--features", default=None,
                 help="feature cache folder (computed there if missing, reused if complete; "
                      "shareable between runs on the same data)")
  e.add_argument("--seed", type=int, default=0)
  e.add_argument("--no-progress", action="store_true")
  e.set_defaults(func=cmd_eagle3)

  m = tsub.add_parser("medusa", help="train Medusa heads (orbax checkpoints; resumes)")
  m.add_argument("--data", required=True, help="a folder written by `jspec train data`")
  m.add_argument("--out", required=True, help="checkpoints, train_log.jsonl and head/")
  m.add_argument("--model", default=default_model)
  m.add_argument("--export", default=None, help="head folder (default OUT/head)")
  m.add_argument("--steps", type=int, default=2000)
  m.add_argument("--stop-after", type=int, default=None,
                 help="end after this many steps of this run (resume later)")
  m.add_argument("--batch-size", type=int, default=8)
  m.add_argument("--seq-len", type=int, default=512)
  m.add_argument("--lr", type=float, default=1e-3)
  m.add_argument("--warmup", type=int, default=30)
  m.add_argument("--num-heads", type=int, default=None,
                 help="K heads: head k predicts the token k+2 ahead (drafts D <= K; default 4)")
  m.add_argument("--num-layers", type=int, default=None, help="ResBlocks per head (default 1)")
  m.add_argument("--decay", type=float, default=0.8, help="loss weight decay per head")
  m.add_argument("--draft-vocab", type=int, default=None, help="draft vocabulary (default 2048)")
  m.add_argument("--vocab-coverage", type=float, default=None,
                 help="size the draft vocabulary (a multiple of 256) to hold this share of "
                      "held-out reply tokens, e.g. 0.97; overrides --draft-vocab")
  m.add_argument("--lm-head", choices=["own", "target"], default=None,
                 help="own (default): each head trains and saves its LM head; target: the heads "
                      "share the target's LM-head rows of the draft vocabulary (frozen, not "
                      "saved: a large draft vocabulary costs no checkpoint bytes)")
  m.add_argument("--init", default=None,
                 help="start from this Medusa head folder (its shape, draft vocabulary and "
                      "weights; the optimiser and schedule start afresh), e.g. to train "
                      "exported heads further on new data")
  m.add_argument("--save-every", type=int, default=100)
  m.add_argument("--keep", type=int, default=3)
  m.add_argument("--eval-every", type=int, default=200)
  m.add_argument("--holdout", type=int, default=32)
  _reply_windows_flag(m)
  m.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="exported weights")
  m.add_argument("--cache-features", action="store_true",
                 help="compute the target's final hidden states once into OUT/features")
  m.add_argument("--features", default=None,
                 help="feature cache folder (computed there if missing; an existing cache, "
                      "e.g. an EAGLE-3 run's, is reused: Medusa reads its last slot)")
  m.add_argument("--seed", type=int, default=0)
  m.add_argument("--no-progress", action="store_true")
  m.set_defaults(func=cmd_medusa)

  mt = tsub.add_parser("mtp", help="train an MTP module, DeepSeek-V3 layout (orbax checkpoints; "
                                   "resumes)")
  mt.add_argument("--data", required=True, help="a folder written by `jspec train data`")
  mt.add_argument("--out", required=True, help="checkpoints, train_log.jsonl and head/")
  mt.add_argument("--model", default=default_model)
  mt.add_argument("--export", default=None, help="head folder (default OUT/head)")
  mt.add_argument("--steps", type=int, default=2000)
  mt.add_argument("--stop-after", type=int, default=None,
                 help="end after this many steps of this run (resume later)")
  mt.add_argument("--batch-size", type=int, default=8)
  mt.add_argument("--seq-len", type=int, default=512)
  mt.add_argument("--lr", type=float, default=1e-3)
  mt.add_argument("--warmup", type=int, default=30)
  mt.add_argument("--mtp-steps", type=int, default=3,
                 help="K recursive steps trained: step k predicts the token k+1 ahead")
  mt.add_argument("--beta", type=float, default=0.6,
                 help="step k's loss weight is beta^(k-1), normalised (FastMTP)")
  mt.add_argument("--draft-vocab", type=int, default=None,
                 help="rows of the target's LM head the module drafts from (and the loss uses; "
                      f"default {MTP_VOCAB})")
  mt.add_argument("--vocab-coverage", type=float, default=None,
                  help="size the draft vocabulary (a multiple of 256) to hold this share of "
                       "held-out reply tokens, e.g. 0.97; overrides --draft-vocab")
  mt.add_argument("--init", default=None,
                  help="start from this MTP head folder (its draft vocabulary and weights; the "
                       "optimiser and schedule start afresh), e.g. to train an exported module "
                       "further on new data")
  mt.add_argument("--save-every", type=int, default=100)
  mt.add_argument("--keep", type=int, default=3)
  mt.add_argument("--eval-every", type=int, default=200)
  mt.add_argument("--holdout", type=int, default=32)
  _reply_windows_flag(mt)
  _pack_flag(mt)
  mt.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="exported weights")
  _compute_dtype_flag(mt)
  mt.add_argument("--cache-features", action="store_true",
                 help="compute the target's final hidden states once into OUT/features")
  mt.add_argument("--features", default=None,
                 help="feature cache folder (computed there if missing; an existing cache, "
                      "e.g. an EAGLE-3 run's, is reused: MTP reads its last slot)")
  mt.add_argument("--seed", type=int, default=0)
  mt.add_argument("--no-progress", action="store_true")
  mt.set_defaults(func=cmd_mtp)

  for kind, text in (("dflash", "a DFlash block drafter"),
                     ("dspark", "a DSpark block drafter (DFlash backbone + Markov and confidence "
                                "heads)")):
    b = tsub.add_parser(kind, help=f"train {text} (orbax checkpoints; resumes)")
    _common(b, default_model, lr=6e-4, warmup=30, draft_vocab=None)
    b.add_argument("--num-layers", type=int, default=None,
                   help="draft layers (target-shaped; default 1)")
    b.add_argument("--block-size", type=int, default=None,
                   help="block slots, the anchor included (drafts: bs-1 for DFlash, bs for "
                        "DSpark; default 8)")
    b.add_argument("--gamma", type=float, default=4.0,
                   help="slot j's loss weight is exp(-(j-1)/gamma)")
    b.add_argument("--max-anchors", type=int, default=64, help="blocks per sequence per step")
    b.add_argument("--taps", default=None,
                   help="target taps (tap t = output of layer t-1), e.g. 2,15,27 (default "
                        "2,L//2,L-3: EAGLE-3's, so one feature cache serves both)")
    b.add_argument("--mask-token", type=int, default=None,
                   help="target token id whose embedding fills the MASK slots (default: the "
                        "first id that never occurs in the data)")
    b.add_argument("--sliding-window", type=int, default=None,
                   help="a block query at position p sees context positions > p - W (0, the "
                        "default: all)")
    b.add_argument("--markov-rank", type=int, default=None,
                   help="DSpark's Markov head rank (default 256)")
    b.add_argument("--init", default=None,
                   help=f"start from this {kind} head folder (its shape, draft vocabulary, MASK "
                        "token, taps and weights; the optimiser and schedule start afresh), e.g. "
                        "to train an exported head further on new data")
    b.add_argument("--markov-gated", action="store_true", help="DSpark's gated Markov head")
    _compute_dtype_flag(b)
    b.add_argument("--cache-features", action="store_true",
                   help="compute the target's taps once into OUT/features")
    b.add_argument("--features", default=None,
                   help="feature cache folder (computed there if missing, reused if complete; "
                        "an EAGLE-3 run's cache with the same taps serves)")
    b.set_defaults(func=cmd_dflash if kind == "dflash" else cmd_dspark)
