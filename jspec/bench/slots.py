"""Throughput of batch generation on this device: slot refill (`jspec.slots.SlotDecoder`) against
static batches (prompts sorted by length, `Decoder.generate` per batch, each batch waiting on its
longest row), on the same prompts, greedy; with the plain decode step's tokens/s at B = 1 and at
the slot count beside them (the ceiling a stream could reach without prefill and idle rows).

  python -m jspec.bench.slots --json benchmarks/results/slots/cpu.json [--prompts FILE ...] [--num 192]
      [--max-new-tokens 256] [--slots 32,64] [--batch-size 16] [--taps] [--tiny]

Reply tokens/s counts generated tokens over the whole wall time (prefill included). "same" counts
requests whose tokens equal the static batches' (greedy: differences are near-ties, where another
batch composition rounds a top-2 logit gap the other way).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np
from flax import nnx

from jspec import prompt_suite
from jspec.bench.step_latency import PlainStep, wall_us
from jspec.decode import Decoder
from jspec.io import atomic_write_text, check_writable
from jspec.slots import Request, SlotDecoder

EAGLE3_TAPS = (2, 15, 27)       # captured with --taps: the default model's EAGLE-3 taps


def static_batches(decoder: Decoder, prompts: list[list[int]], max_new: int, batch: int):
  """Sorted by length, `batch` rows per call; returns (tokens per prompt, seconds)."""
  order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
  out: list[list[int]] = [[] for _ in prompts]
  seconds = 0.0
  for lo in range(0, len(order), batch):
    idx = order[lo:lo + batch]
    rows = [prompts[i] for i in idx]
    res = decoder.generate(rows + [rows[-1]] * (batch - len(rows)), max_new_tokens=max_new)
    seconds += res.prefill_s + res.decode_s
    for i, r in zip(idx, res.token_ids):
      out[i] = r
  return out, seconds


def plain_step_tokens_per_s(model, batch: int, context: int, calls: int = 8) -> float:
  step = PlainStep(model, batch, context, context + 64)
  return batch / (wall_us(step, calls) * 1e-6)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m jspec.bench.slots",
                               description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", required=True, help="result file (overwritten)")
  ap.add_argument("--prompts", nargs="+", default=["benchmarks/prompts/train.jsonl"])
  ap.add_argument("--num", type=int, default=192, help="prompts taken (spread over categories)")
  ap.add_argument("--max-new-tokens", type=int, default=256)
  ap.add_argument("--max-prompt-tokens", type=int, default=1024)
  ap.add_argument("--slots", default="32,64")
  ap.add_argument("--batch-size", type=int, default=16, help="rows per static batch")
  ap.add_argument("--taps", action="store_true", help="also capture EAGLE-3 features")
  ap.add_argument("--tiny", action="store_true", help="smoke run: a random tiny model, few prompts")
  args = ap.parse_args(argv)
  try:
    check_writable(args.json)
    slot_counts = [int(x) for x in args.slots.split(",") if x]
    if args.num < 1 or args.max_new_tokens < 1 or not slot_counts or min(slot_counts) < 1:
      raise ValueError("--num, --max-new-tokens and every --slots value must be >= 1")
    records = [p for f in args.prompts for p in prompt_suite.load(f)]
  except (ValueError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2

  if args.tiny:
    from models import Llama, LlamaConfig
    cfg = LlamaConfig.tiny()
    model, eos, name = Llama(cfg, rngs=nnx.Rngs(0)), (3,), "tiny (random)"
    rng = np.random.default_rng(0)
    prompts = [rng.integers(4, cfg.vocab_size, int(rng.integers(4, 60))).tolist()
               for _ in range(args.num)]
    taps = (0, 1) if args.taps else ()
  else:
    import models
    loaded = models.load(models.DEFAULT_MODEL, quiet=True)
    model, tok, name = loaded.model, loaded.tokenizer, loaded.name
    eos = tok.eos_ids
    by_cat: dict[str, list] = {}
    for p in records:
      by_cat.setdefault(p.category, []).append(p)
    picked, k = [], 0
    while len(picked) < args.num and any(k < len(v) for v in by_cat.values()):
      picked += [v[k] for v in by_cat.values() if k < len(v)]
      k += 1
    prompts = [ids for ids in (tok.encode(tok.apply_chat_template(list(p.messages)))
                               for p in picked) if len(ids) <= args.max_prompt_tokens]
    prompts = prompts[:args.num]
    taps = EAGLE3_TAPS if args.taps else ()
  max_new = args.max_new_tokens
  longest = max(len(p) for p in prompts)
  result = dict(command="python -m jspec.bench.slots " + " ".join(argv or sys.argv[1:]),
                model=name, machine=platform.processor() or platform.machine(),
                prompts=len(prompts), prompt_tokens=int(sum(map(len, prompts))),
                longest_prompt=longest, max_new_tokens=max_new, taps=list(taps), runs={})

  decoder = Decoder(model, eos_ids=eos)
  static_batches(decoder, prompts[:args.batch_size], max_new, args.batch_size)   # compile
  ref, sec = static_batches(decoder, prompts, max_new, args.batch_size)
  gen = sum(map(len, ref))
  result["runs"][f"static_B{args.batch_size}"] = dict(
      seconds=round(sec, 2), reply_tokens=gen, reply_tokens_per_s=round(gen / sec, 1))
  print(f"static batches of {args.batch_size}: {gen / sec:.1f} reply tok/s", file=sys.stderr)
  decoder.clear_compiled()
  for b in slot_counts:
    max_len = longest + max_new + 1
    sd = SlotDecoder(model, eos_ids=eos, slots=b, max_len=max_len, max_new_tokens=max_new,
                     taps=taps)
    sd.generate([Request(p, max_new) for p in prompts[:2 * sd.admit_width]])   # compile
    sd.stats.update(admits=0, runs=0, prefill_tokens=0, generated_tokens=0, seconds=0.0)
    t0 = time.perf_counter()
    res = sd.generate([Request(p, max_new) for p in prompts])
    sec = time.perf_counter() - t0
    gen = sum(len(r.token_ids) for r in res)
    same = sum(r.token_ids == t for r, t in zip(res, ref))
    result["runs"][f"slots_B{b}"] = dict(
        seconds=round(sec, 2), reply_tokens=gen, reply_tokens_per_s=round(gen / sec, 1),
        admit_width=sd.admit_width, admits=sd.stats["admits"], runs=sd.stats["runs"],
        prefill_s=round(sd.stats["admit_s"], 2), decode_s=round(sd.stats["run_s"], 2),
        same_as_static=same, plain_step_tokens_per_s=round(
            plain_step_tokens_per_s(model, b, int(np.mean([len(p) for p in prompts]))
                                    + max_new // 2), 1))
    print(f"slots {b}: {gen / sec:.1f} reply tok/s, {same}/{len(res)} equal", file=sys.stderr)
    del sd
  result["plain_step_tokens_per_s_B1"] = round(plain_step_tokens_per_s(
      model, 1, int(np.mean([len(p) for p in prompts])) + max_new // 2), 1)
  atomic_write_text(args.json, json.dumps(result, indent=1) + "\n")
  print(json.dumps(result, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
