"""Attention cost against context length on this device: the default model's decode step, verify
forward (1 + D tokens) and prefill, beside llama.cpp (llama-cpp-python on the same GGUF, B = 1) in
the same run, interleaved; JSON out with the goals of issue 43 judged.

  python -m jspec.bench.long_context --json benchmarks/results/long_context/cpu.json
      [--contexts 64,512,2048,8128] [--batch-sizes 1,4,16] [--draft 3,7]
      [--prefill 1x64,1x512,1x2048,1x8128,16x2048] [--calls 10] [--repeats 3]
      [--weights f32|bf16|int8|gguf] [--kv-cache f32|bf16] [--no-llama-cpp] [--no-padded]

A step's buffer is what a call allocates for it: the context plus 64 new tokens. "padded" runs
B = 16 rows of 64-token prompts in a 2048-token buffer (`pad_to=2048`) against the same rows
unpadded. Prefill memory is the compiled prefill program's (XLA's buffer assignment): its
temporaries beside the cache it fills in place. 8128 = the model's 8192 positions less 64 new.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jspec import decode
from jspec.bench.step_latency import PlainStep, wall_us
from jspec.io import atomic_write_text, check_writable
from models import registry
from models.kv_cache import KVCache
from models.stored_layers import WEIGHTS

NEW_TOKENS = 64   # buffer room past the context, as a call with max_new_tokens=64 allocates
PAD_TO = 2048


def _ints(text: str) -> list[int]:
  return [int(x) for x in text.split(",") if x]


def _prefill_points(text: str) -> list[tuple[int, int]]:
  points = []
  for item in text.split(","):
    b, _, p = item.partition("x")
    points.append((int(b), int(p)))
  return points


def prefill_memory(model, batch: int, width: int, buffer: int) -> dict:
  """The compiled prefill program's memory (XLA's buffer assignment): its temporaries, and the
  cache it fills in place (donated), in MB."""
  graphdef, weights = nnx.split(model)
  cache = jax.eval_shape(lambda: model.init_cache(batch, buffer))
  tokens = jax.ShapeDtypeStruct((batch, width), jnp.int32)
  lens = jax.ShapeDtypeStruct((batch,), jnp.int32)
  stats = decode.prefill.lower(graphdef, weights, cache, tokens, lens).compile().memory_analysis()
  cache_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(cache))
  return dict(temp_mb=round(stats.temp_size_in_bytes / 2**20, 3),
              cache_mb=round(cache_bytes / 2**20, 3))


def random_prompt(n: int, vocab: int, seed: int) -> list[int]:
  return np.random.default_rng(seed).integers(100, vocab, n).tolist()   # cost ignores the values


class LlamaCppPeer:
  """llama.cpp decode steps at a fixed context: the prompt is evaluated once, then each call
  evaluates one token and rolls the context back (`n_tokens`; eval drops the KV cells past it)."""

  def __init__(self, gguf: str, context: int, vocab: int):
    import llama_cpp
    self.llm = llama_cpp.Llama(model_path=gguf, n_ctx=context + NEW_TOKENS, n_threads=os.cpu_count(),
                               n_batch=512, verbose=False)
    prompt = random_prompt(context, vocab, seed=context)
    start = time.perf_counter()
    self.llm.eval(prompt)
    self.prefill_s = time.perf_counter() - start
    self.context = context
    self.version = llama_cpp.__version__

  def __call__(self):
    self.llm.n_tokens = self.context
    self.llm.eval([1234])


def _goal(value: float, limit: float, op: str) -> dict:
  ok = value <= limit if op == "<=" else value >= limit
  return dict(value=round(value, 3), goal=f"{op} {limit}", met=bool(ok))


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", required=True)
  p.add_argument("--contexts", default="64,512,2048,8128")
  p.add_argument("--batch-sizes", default="1,4,16")
  p.add_argument("--draft", default="3,7", help="draft lengths D of the verify forwards (B = 1)")
  p.add_argument("--prefill", default="1x64,1x512,1x2048,1x8128,16x2048",
                 help="prefill points BxP (rows x prompt tokens)")
  p.add_argument("--calls", type=int, default=10, help="timed calls per point and repeat")
  p.add_argument("--repeats", type=int, default=3, help="interleaved passes over all points")
  p.add_argument("--weights", default="f32", choices=WEIGHTS,
                 help="how jspec holds the default model's weights (models.load); the peer always "
                      "reads the GGUF as stored")
  p.add_argument("--kv-cache", default="f32", choices=tuple(registry.KV_CACHES),
                 help="the KV cache's dtype (the peer keeps llama.cpp's default f16 cache)")
  p.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp peer")
  p.add_argument("--no-padded", action="store_true", help="skip the padded-buffer comparison")
  p.add_argument("--tiny", action="store_true",
                 help="a tiny random model and no llama.cpp (a smoke test of the script)")
  args = p.parse_args(argv)
  try:
    check_writable(args.json)
    contexts, batches, drafts = _ints(args.contexts), _ints(args.batch_sizes), _ints(args.draft)
    prefills = _prefill_points(args.prefill)
  except ValueError as e:
    p.error(f"{e} (lists are comma-separated integers; --prefill items look like 16x2048)")
  if min(contexts + batches + drafts + [args.calls, args.repeats]) < 1:
    p.error("every context, batch size, draft length, --calls and --repeats must be >= 1")
  if not (args.no_llama_cpp or args.tiny):
    try:
      import llama_cpp  # noqa: F401  (the peer; not a jspec dependency)
    except ImportError:
      p.error("the llama.cpp peer needs llama-cpp-python (pip install llama-cpp-python==0.3.36; "
              "build it with CMAKE_ARGS turning GGML_AMX_* off on CPUs that report AMX), or "
              "pass --no-llama-cpp")

  if args.tiny:
    from models import Llama, LlamaConfig
    model, name, gguf = Llama(LlamaConfig.tiny(), rngs=nnx.Rngs(0)), "tiny", None
    args.no_llama_cpp = True
  else:
    loaded = registry.load(quiet=True, weights=args.weights, kv_cache=args.kv_cache)
    model, name, gguf = loaded.model, loaded.name, loaded.source
  cfg = model.config
  padded_len = 0 if args.no_padded else PAD_TO + NEW_TOKENS
  if max(max(contexts) + NEW_TOKENS, padded_len, max(q for _, q in prefills)) > cfg.max_position:
    p.error(f"each context + {NEW_TOKENS} new tokens, each prompt and the padded buffer "
            f"({PAD_TO + NEW_TOKENS}; --no-padded skips it) must fit the model's context of "
            f"{cfg.max_position}")

  # Step points: (kind, B, context, width, buffer) -> callable; compiled before any timing.
  points = {}
  for b in batches:
    for c in contexts:
      points[("decode", b, c, 1, c + NEW_TOKENS)] = PlainStep(model, b, c, c + NEW_TOKENS)
  for c in contexts:
    for d in drafts:
      points[("verify", 1, c, 1 + d, c + NEW_TOKENS)] = PlainStep(model, 1, c, c + NEW_TOKENS,
                                                                  width=1 + d)
  if not args.no_padded:
    points[("padded", 16, 64, 1, PAD_TO + NEW_TOKENS)] = PlainStep(model, 16, 64,
                                                                   PAD_TO + NEW_TOKENS)
  peers = {}
  if not args.no_llama_cpp:
    for c in contexts:
      peers[c] = LlamaCppPeer(gguf, c, cfg.vocab_size)
  for fn in list(points.values()) + list(peers.values()):
    wall_us(fn, 1)   # compile and warm
  times = {key: [] for key in list(points) + [("llama.cpp", 1, c, 1, 0) for c in peers]}
  for rep in range(args.repeats):
    for key, fn in points.items():
      times[key].append(wall_us(fn, args.calls) / 1e3)
      if key[0] == "decode" and key[1] == 1 and key[2] in peers:   # the peer beside it
        times[("llama.cpp", 1, key[2], 1, 0)].append(wall_us(peers[key[2]], args.calls) / 1e3)
    print(f"pass {rep + 1}/{args.repeats} done", flush=True)
  ms = {key: statistics.median(v) for key, v in times.items()}
  del points

  decoder = decode.Decoder(model)
  prefill_rows = []
  for b, n in prefills:
    prompts = [random_prompt(n, cfg.vocab_size, seed=i) for i in range(b)]
    decoder.generate(prompts, max_new_tokens=1, eos=False)          # compile
    s = statistics.median(decoder.generate(prompts, max_new_tokens=1, eos=False).prefill_s
                          for _ in range(args.repeats))
    prefill_rows.append(dict(batch_size=b, prompt_tokens=n, seconds=round(s, 3),
                             tokens_per_s=round(b * n / s, 1),
                             **prefill_memory(model, b, decode.bucket(n), n + 1)))
    print(json.dumps(prefill_rows[-1]), flush=True)
  padded_prefill = {}
  if not args.no_padded:
    prompts = [random_prompt(64, cfg.vocab_size, seed=i) for i in range(16)]
    for pad in (0, PAD_TO):
      decoder.generate(prompts, max_new_tokens=1, eos=False, pad_to=pad)
      padded_prefill[pad] = statistics.median(
          decoder.generate(prompts, max_new_tokens=1, eos=False, pad_to=pad).prefill_s
          for _ in range(args.repeats))

  decode_rows = [dict(batch_size=k[1], context=k[2], buffer=k[4], ms=round(v, 2))
            for k, v in ms.items() if k[0] == "decode"]
  verify = [dict(batch_size=1, context=k[2], tokens=k[3], ms=round(v, 2),
                 vs_decode=round(v / ms[("decode", 1, k[2], 1, k[4])], 3))
            for k, v in ms.items() if k[0] == "verify"]
  peer = [dict(context=k[2], ms=round(v, 2), prefill_tokens_per_s=round(k[2] / peers[k[2]].prefill_s, 1),
               jspec_ms=round(ms[("decode", 1, k[2], 1, k[2] + NEW_TOKENS)], 2),
               jspec_over_llama_cpp_tokens_per_s=round(v / ms[("decode", 1, k[2], 1,
                                                                k[2] + NEW_TOKENS)], 3))
          for k, v in ms.items() if k[0] == "llama.cpp"]
  goals = {}
  step = lambda b, c: ms.get(("decode", b, c, 1, c + NEW_TOKENS))
  for b, limit in ((1, 1.3), (16, 2.0)):
    if step(b, 2048) and step(b, 64):
      goals[f"decode_B{b}_2048_over_64"] = _goal(step(b, 2048) / step(b, 64), limit, "<=")
  if ("padded", 16, 64, 1, PAD_TO + NEW_TOKENS) in ms and step(16, 64):
    goals["padded_decode_over_unpadded"] = _goal(
        ms[("padded", 16, 64, 1, PAD_TO + NEW_TOKENS)] / step(16, 64), 1.1, "<=")
  if padded_prefill:
    goals["padded_prefill_over_unpadded"] = _goal(padded_prefill[PAD_TO] / padded_prefill[0], 1.1,
                                                  "<=")
  rate = {(r["batch_size"], r["prompt_tokens"]): r["tokens_per_s"] for r in prefill_rows}
  if (1, 2048) in rate and (1, 512) in rate:
    goals["prefill_rate_2048_over_512"] = _goal(rate[(1, 2048)] / rate[(1, 512)], 0.8, ">=")
  ratio = {(r["context"], r["tokens"]): r["vs_decode"] for r in verify}
  for d in drafts:
    if (2048, 1 + d) in ratio and (64, 1 + d) in ratio:
      goals[f"verify_T{1 + d}_ratio_2048_minus_64"] = _goal(
          abs(ratio[(2048, 1 + d)] - ratio[(64, 1 + d)]), 0.1, "<=")
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
  report = dict(
      command="python -m jspec.bench.long_context " + " ".join(argv if argv is not None else
                                                               sys.argv[1:]),
      commit=commit, backend=jax.default_backend(), device=str(jax.devices()[0]),
      jax_version=jax.__version__, cpus=os.cpu_count(), model=name,
      weights=None if args.tiny else args.weights,
      kv_cache=None if args.tiny else args.kv_cache, calls=args.calls,
      repeats=args.repeats, decode=decode_rows, verify=verify, prefill=prefill_rows,
      padded=dict(batch_size=16, prompt_tokens=64, pad_to=PAD_TO,
                  decode_ms={"unpadded": step(16, 64),
                             "padded": ms.get(("padded", 16, 64, 1, PAD_TO + NEW_TOKENS))},
                  prefill_s={"unpadded": padded_prefill.get(0),
                             "padded": padded_prefill.get(PAD_TO)}) if not args.no_padded else None,
      llama_cpp=dict(version=next(iter(peers.values())).version, threads=os.cpu_count(),
                     decode=peer) if peers else None,
      goals=goals)
  atomic_write_text(args.json, json.dumps(report, indent=2))
  print(json.dumps(goals, indent=2))


if __name__ == "__main__":
  main()
