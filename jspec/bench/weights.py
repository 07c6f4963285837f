"""Weights as stored against float32, and against llama.cpp on the same GGUF (JSON out).

Per weight format of the default model (`--weights`): the bytes it holds and the process's resident
memory after loading it (each in a fresh process), plain greedy decode tokens/s at each batch size
on suite prompts against the bandwidth roofline of the bytes one step reads (bandwidth measured in
the same run), T(1 + D)/T(1) of a verify forward, and speculative decoding (n-gram, D drafts)
against plain; beside them llama.cpp (llama-cpp-python) on the same GGUF and prompt tokens, plain
and with its prompt-lookup drafter, B = 1, greedy. Every format's runs are interleaved prompt by
prompt with the others and with llama.cpp, so a slow phase of the machine hits all alike.
  python -m jspec.bench.weights --json OUT.json [--formats f32,bf16,int8,gguf]
      [--per-category 2] [--max-new-tokens 64] [--batch-sizes 1,4] [--drafts 3,7]
      [--spec-draft 4] [--no-llama-cpp]
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
import numpy as np
from flax import nnx

import models
from jspec import Decoder, SpecDecoder
from jspec.decode import bucket
from jspec.io import atomic_write_text, check_writable
from jspec.prompt_suite import load as load_suite
from jspec.timing import Point, measure_bandwidth
from models.stored_layers import WEIGHTS, weight_bytes

SUITE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "prompts", "suite.jsonl")
CONTEXT = 128       # committed tokens of the verify-cost forwards


def resident_mb(fmt: str) -> dict:
  """Loads the default model with `fmt` in a fresh process: RSS after the load (and after
  jax's own start-up) in MB, and the load's wall seconds."""
  code = ("import gc, time, jax.numpy as jnp, models\n"
          "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20\n"
          "jnp.ones(1).block_until_ready(); base = rss(); t = time.perf_counter()\n"
          f"m = models.load(models.DEFAULT_MODEL, quiet=True, weights={fmt!r}); gc.collect()\n"
          "print(base, rss(), time.perf_counter() - t)\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  base, after, secs = (float(x) for x in out.stdout.split()[-3:])
  return dict(rss_mb=round(after, 1), rss_over_startup_mb=round(after - base, 1),
              load_s=round(secs, 2))


class LlamaCpp:
  """llama.cpp greedy decoding of token-id prompts: plain (argmax of each step's logits) and with
  its prompt-lookup drafter (`generate`, temperature 0)."""

  def __init__(self, gguf: str, n_ctx: int, lookup: int):
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    kw = dict(model_path=gguf, n_ctx=n_ctx, n_threads=os.cpu_count(), n_batch=512, verbose=False)
    self.plain = llama_cpp.Llama(**kw)
    # the drafter verifies with every position's logits: without logits_all the score buffer is
    # sized for one batch and a prompt longer than n_batch overflows it (llama-cpp-python 0.3.36)
    self.spec = llama_cpp.Llama(**kw, logits_all=True, draft_model=LlamaPromptLookupDecoding(
        num_pred_tokens=lookup))
    self.version = llama_cpp.__version__

  def _argmax(self) -> int:
    """The greedy token from the last evaluated position's logits."""
    import llama_cpp
    llm = self.plain
    return int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx),
                                               shape=(llm.n_vocab(),))))

  def decode_plain(self, ids: list[int], n: int) -> tuple[list[int], float]:
    """(tokens, seconds of the n - 1 decode steps after the first token)."""
    llm = self.plain
    llm.reset()
    llm.eval(ids)
    out = [self._argmax()]
    start = time.perf_counter()
    for _ in range(n - 1):
      llm.eval([out[-1]])
      out.append(self._argmax())
    return out, time.perf_counter() - start

  def decode_spec(self, ids: list[int], n: int) -> tuple[list[int], float]:
    llm = self.spec
    llm.reset()
    out, start = [], None
    for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
      if start is None:
        start = time.perf_counter()      # after the prompt and the first token
      out.append(int(tok))
      if len(out) == n:
        break
    return out, time.perf_counter() - start


def suite_prompts(tok, per_category: int) -> list[list[int]]:
  by_cat: dict = {}
  for p in load_suite(SUITE):
    by_cat.setdefault(p.category, []).append(p)
  chosen = [p for ps in by_cat.values() for p in ps[:per_category]]
  return [tok.encode(tok.apply_chat_template(list(p.messages))) for p in chosen]


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", required=True)
  p.add_argument("--formats", default="f32,bf16,int8,gguf")
  p.add_argument("--per-category", type=int, default=2, help="suite prompts per category")
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--batch-sizes", default="1,4")
  p.add_argument("--drafts", default="3,7", help="D of the T(1 + D)/T(1) forwards")
  p.add_argument("--spec-draft", type=int, default=4, help="n-gram D (llama.cpp: lookup tokens)")
  p.add_argument("--repeats", type=int, default=10, help="rounds of the verify-cost forwards")
  p.add_argument("--no-llama-cpp", action="store_true")
  args = p.parse_args(argv)
  formats = args.formats.split(",")
  bad = [f for f in formats if f not in WEIGHTS]
  ints = lambda s: [int(x) for x in s.split(",")]
  if bad:
    p.error(f"unknown format(s) {bad}; choose from {', '.join(WEIGHTS)}")
  if min(ints(args.batch_sizes) + ints(args.drafts) + [args.per_category, args.max_new_tokens,
                                                       args.spec_draft, args.repeats]) < 1:
    p.error("batch sizes, drafts, --per-category, --max-new-tokens, --spec-draft and --repeats "
            "must be >= 1")
  if not args.no_llama_cpp:
    try:
      import llama_cpp  # noqa: F401  (the peer; not a jspec dependency)
    except ImportError:
      p.error("the llama.cpp peer needs llama-cpp-python (pip install llama-cpp-python==0.3.36; "
              "on CPUs that report AMX build it with CMAKE_ARGS='-DGGML_AMX_TILE=OFF "
              "-DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF'), or pass --no-llama-cpp")
  try:
    check_writable(args.json)
  except ValueError as e:
    p.error(str(e))

  memory = {f: resident_mb(f) for f in formats}
  loaded = {f: models.load(models.DEFAULT_MODEL, quiet=True, weights=f) for f in formats}
  tok = loaded[formats[0]].tokenizer
  prompts = suite_prompts(tok, args.per_category)
  n = args.max_new_tokens
  plain = {f: Decoder(m.model, eos_ids=tok.eos_ids) for f, m in loaded.items()}
  spec_cfg = {"method": "ngram", "num_speculative_tokens": args.spec_draft}
  spec = {f: SpecDecoder(m.model, spec_cfg, eos_ids=tok.eos_ids, time_rounds=False)
          for f, m in loaded.items()}
  peer = None
  if not args.no_llama_cpp:
    peer = LlamaCpp(loaded[formats[0]].source, max(len(x) for x in prompts) + n + 16,
                    args.spec_draft)
  batches = {b: [prompts[i:i + b] for i in range(0, len(prompts) - b + 1, b)]
             for b in ints(args.batch_sizes)}
  # one prompt width for all: one program per (format, B, mode); chunked prefill and attention
  # over the keys a row holds make the padding cost nothing (docs/models.md, long contexts)
  pad = bucket(max(len(x) for x in prompts))
  kw = dict(max_new_tokens=n, eos=False, pad_to=pad)

  # warm-up: every program compiled once
  for f in formats:
    for b, group in batches.items():
      plain[f].generate(group[0], **kw)
    spec[f].generate(prompts[:1], **kw)
  if peer:
    peer.decode_plain(prompts[0], 4)
    peer.decode_spec(prompts[0], 4)

  bws = [measure_bandwidth(repeats=3)]
  time_s = {}             # (who, mode, B) -> [decode seconds], tokens counted alike
  tokens = {}
  agree = []
  for b, group in batches.items():
    for batch in group:
      for f in formats:
        out = plain[f].generate(batch, **kw)
        time_s.setdefault((f, "plain", b), []).append(out.decode_s)
        tokens[(f, "plain", b)] = tokens.get((f, "plain", b), 0) + b * (n - 1)
        if b == 1:
          sd = spec[f]
          sd.reset_drafter()
          o = sd.generate(batch, **kw)
          time_s.setdefault((f, "ngram", 1), []).append(o.decode_s)
          tokens[(f, "ngram", 1)] = tokens.get((f, "ngram", 1), 0) + (n - 1)
          if f == "gguf" and peer:
            ref = out.token_ids[0]
      if b == 1 and peer:
        toks, secs = peer.decode_plain(batch[0], n)
        time_s.setdefault(("llama.cpp", "plain", 1), []).append(secs)
        tokens[("llama.cpp", "plain", 1)] = tokens.get(("llama.cpp", "plain", 1), 0) + (n - 1)
        _, secs = peer.decode_spec(batch[0], n)
        time_s.setdefault(("llama.cpp", "lookup", 1), []).append(secs)
        tokens[("llama.cpp", "lookup", 1)] = tokens.get(("llama.cpp", "lookup", 1), 0) + (n - 1)
        if "gguf" in formats:
          agree.append(next((i for i, (x, y) in enumerate(zip(ref, toks)) if x != y), n))
  bws.append(measure_bandwidth(repeats=3))
  bw = statistics.mean(bws)

  rate = {k: tokens[k] / sum(v) for k, v in time_s.items()}
  decode = []
  for (who, mode, b), r in sorted(rate.items(), key=str):
    row = dict(who=who, mode=mode, batch_size=b, tokens_per_s=round(r, 2))
    if who in loaded and mode == "plain":
      cfg = loaded[who].model.config
      ctx = statistics.mean(len(x) for x in prompts) + n / 2
      step = weight_bytes(loaded[who].model) + 2 * cfg.num_layers * b * ctx * cfg.num_kv_heads \
          * cfg.head_dim * 4
      row.update(bytes_per_step=int(step), roofline_tokens_per_s=round(b * bw / step, 1),
                 fraction_of_roofline=round(r / (b * bw / step), 3))
    if mode != "plain" and (who, "plain", b) in rate:
      row["speedup_vs_own_plain"] = round(r / rate[(who, "plain", b)], 3)
    decode.append(row)
  ratios = {}
  for f in formats:
    for mode, peer_mode in (("plain", "plain"), ("ngram", "lookup")):
      if peer and (f, mode, 1) in rate:
        ratios[f"{f}_{mode}_over_llama_cpp_{peer_mode}_b1"] = round(
            rate[(f, mode, 1)] / rate[("llama.cpp", peer_mode, 1)], 3)

  verify = []
  draws = ints(args.drafts)
  for f in formats:
    model = loaded[f].model
    graphdef, weights = nnx.split(model)
    points = {t: Point(graphdef, weights, model.config, "model", "model", 1, t, CONTEXT,
                       CONTEXT + max(draws) + 8) for t in [1] + [1 + d for d in draws]}
    for _ in range(args.repeats):
      for pt in points.values():
        pt.call()
        pt.times.append(pt.call())
    t1 = statistics.median(points[1].times)
    verify.append(dict(format=f, t1_ms=round(1e3 * t1, 2), **{
        f"T(1+{d})/T(1)": round(statistics.median(points[1 + d].times) / t1, 3) for d in draws}))

  report = dict(model=models.DEFAULT_MODEL, backend=jax.default_backend(),
                device=str(jax.devices()[0]), jax_version=jax.__version__, cpus=os.cpu_count(),
                prompts=len(prompts), per_category=args.per_category, max_new_tokens=n,
                prompt_width=pad,
                bandwidth_gb_s=round(bw / 1e9, 2),
                formats={f: dict(weight_bytes=weight_bytes(loaded[f].model), **memory[f])
                         for f in formats},
                decode=decode, verify_context=CONTEXT, verify=verify, ratios=ratios,
                llama_cpp=None if not peer else dict(
                    version=peer.version, threads=os.cpu_count(), lookup_tokens=args.spec_draft,
                    tokens_agreeing_with_jspec_gguf_median=statistics.median(agree) if agree
                    else None))
  atomic_write_text(args.json, json.dumps(report, indent=2))
  print(json.dumps(report, indent=2))


if __name__ == "__main__":
  main()
