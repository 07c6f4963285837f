"""Peer benchmark: HF transformers (torch, CPU) against jspec on the same model, prompts and
token ids, one process, interleaved per prompt; batch size 1 (HF's assisted generation needs it).

  python -m jspec.bench.hf_peer --prompts benchmarks/prompts/suite.jsonl --per-category 2 \
      --num-draft 3 --max-new-tokens 64 --json OUT.json
Methods: plain greedy; n-gram (HF prompt_lookup_num_tokens); the target as its own draft model
(HF assistant_model); layer-skip (HF assistant_early_exit). Needs the `test` extra (torch,
transformers). Throughput is end to end (prefill + decode) for both, since HF cannot split them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

METHODS = ("plain", "ngram", "draft-model", "layer-skip")


def _hf_kwargs(method: str, d: int, ngram_max: int, layers: int, model) -> dict:
  if method == "ngram":
    return dict(prompt_lookup_num_tokens=d, max_matching_ngram_size=ngram_max)
  if method == "draft-model":
    model.generation_config.num_assistant_tokens = d
    model.generation_config.num_assistant_tokens_schedule = "constant"
    model.generation_config.assistant_confidence_threshold = 0.0
    return dict(assistant_model=model)
  if method == "layer-skip":
    model.generation_config.num_assistant_tokens = d
    model.generation_config.num_assistant_tokens_schedule = "constant"
    model.generation_config.assistant_confidence_threshold = 0.0
    return dict(assistant_early_exit=layers)
  return {}


def _jspec_decoder(method: str, d: int, ngram_max: int, layers: int, loaded):
  from jspec.decode import Decoder
  from jspec.spec_decode import SpecDecoder

  eos = loaded.tokenizer.eos_ids
  if method == "plain":
    return Decoder(loaded.model, eos_ids=eos)
  cfg = {"method": method, "num_speculative_tokens": d}
  if method == "ngram":
    cfg["prompt_lookup_max"] = ngram_max
  if method == "layer-skip":
    cfg["num_layers"] = layers
  return SpecDecoder(loaded.model, cfg, eos_ids=eos,
                     draft_model=loaded.model if method == "draft-model" else None)


def run(loaded, prompts, *, methods=METHODS, num_draft=3, max_new_tokens=64, ngram_max=2,
        layers=None, threads=None) -> dict:
  import torch
  import transformers

  torch.set_num_threads(threads or os.cpu_count())
  path = loaded.source
  hf = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
  layers = layers or max(1, loaded.model.config.num_layers // 4)
  tok = loaded.tokenizer
  ids = [(p.id, tok.encode(tok.apply_chat_template(list(p.messages)))) for p in prompts]
  eos = list(tok.eos_ids)
  rows = {m: [] for m in methods}
  for m in methods:
    dec = _jspec_decoder(m, num_draft, ngram_max, layers, loaded)
    kw = _hf_kwargs(m, num_draft, ngram_max, layers, hf)
    for pid, x in ids[:1]:     # warm-up: jspec compiles, torch allocates
      dec.generate([x], max_new_tokens=max_new_tokens)
      with torch.no_grad():
        hf.generate(torch.tensor([x]), max_new_tokens=max_new_tokens, do_sample=False,
                    eos_token_id=eos, pad_token_id=eos[0], **kw)
    for pid, x in ids:
      with torch.no_grad():
        t = time.perf_counter()
        out = hf.generate(torch.tensor([x]), max_new_tokens=max_new_tokens, do_sample=False,
                          eos_token_id=eos, pad_token_id=eos[0], **kw)
        hf_s = time.perf_counter() - t
      hf_new = out[0, len(x):].tolist()
      js = dec.generate([x], max_new_tokens=max_new_tokens)
      rows[m].append(dict(id=pid, hf_tokens=len(hf_new), hf_s=hf_s, jspec_tokens=js.num_tokens,
                          jspec_s=js.prefill_s + js.decode_s,
                          same_tokens=hf_new == js.token_ids[0]))
      print(f"  {m} {pid}: HF {len(hf_new) / hf_s:.1f} tok/s, jspec {js.tokens_per_s:.1f} tok/s",
            file=sys.stderr, flush=True)
  results = []
  for m, rs in rows.items():
    hf_rate = sum(r["hf_tokens"] for r in rs) / sum(r["hf_s"] for r in rs)
    js_rate = sum(r["jspec_tokens"] for r in rs) / sum(r["jspec_s"] for r in rs)
    ratios = [(r["jspec_tokens"] / r["jspec_s"]) / (r["hf_tokens"] / r["hf_s"]) for r in rs]
    results.append(dict(method=m, num_draft=None if m == "plain" else num_draft,
                        hf_tokens_per_s=hf_rate, jspec_tokens_per_s=js_rate,
                        jspec_over_hf=js_rate / hf_rate, jspec_over_hf_median=statistics.median(ratios),
                        same_tokens=sum(r["same_tokens"] for r in rs), prompts=len(rs), runs=rs))
  plain = {r["method"]: r for r in results}.get("plain")
  for r in results:   # each library's own speculative speedup over its own plain decoding
    if plain:
      r["hf_speedup"] = r["hf_tokens_per_s"] / plain["hf_tokens_per_s"]
      r["jspec_speedup"] = r["jspec_tokens_per_s"] / plain["jspec_tokens_per_s"]
  return dict(model=loaded.name, torch_version=torch.__version__,
              transformers_version=transformers.__version__, torch_threads=torch.get_num_threads(),
              max_new_tokens=max_new_tokens, ngram_max=ngram_max, layer_skip_layers=layers,
              results=results)


def markdown(report: dict) -> str:
  lines = ["| method | D | HF tok/s | jspec tok/s | jspec / HF | HF speedup | jspec speedup | "
           "same tokens |", "|---|---|---|---|---|---|---|---|"]
  for r in report["results"]:
    lines.append(f"| {r['method']} | {r['num_draft'] or '—'} | {r['hf_tokens_per_s']:.1f} | "
                 f"{r['jspec_tokens_per_s']:.1f} | {r['jspec_over_hf']:.2f}× | "
                 f"{r.get('hf_speedup', 1):.2f}× | {r.get('jspec_speedup', 1):.2f}× | "
                 f"{r['same_tokens']}/{r['prompts']} |")
  return "\n".join(lines)


def main(argv=None) -> None:
  from jspec import prompt_suite

  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--prompts", required=True)
  p.add_argument("--categories", default=None)
  p.add_argument("--per-category", type=int, default=1)
  p.add_argument("--methods", default=",".join(METHODS))
  p.add_argument("--num-draft", type=int, default=3)
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--ngram-max", type=int, default=2, help="longest n-gram matched (both libraries)")
  p.add_argument("--draft-layers", type=int, default=None, help="layer-skip / early-exit depth")
  p.add_argument("--json", default=None)
  args = p.parse_args(argv)
  methods = tuple(args.methods.split(","))
  bad = [m for m in methods if m not in METHODS]
  if bad:
    sys.exit(f"hf_peer: unknown method(s) {bad}; choose from {METHODS}")
  try:
    prompts = prompt_suite.select(prompt_suite.load(args.prompts),
                                  args.categories.split(",") if args.categories else None,
                                  args.per_category)
  except prompt_suite.SuiteError as e:
    sys.exit(f"hf_peer: {e}")
  if not all(importlib.util.find_spec(m) for m in ("torch", "transformers")):
    sys.exit("hf_peer: needs torch and transformers: pip install -e '.[test]'")
  import models
  loaded = models.load(models.DEFAULT_MODEL)
  report = run(loaded, prompts, methods=methods, num_draft=args.num_draft,
               max_new_tokens=args.max_new_tokens, ngram_max=args.ngram_max,
               layers=args.draft_layers)
  report["command"] = "python -m jspec.bench.hf_peer " + " ".join(sys.argv[1:] if argv is None else argv)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=2)
  print(markdown(report))


if __name__ == "__main__":
  main()
