"""Greedy Medusa (or another method) on the real default model equals plain decoding, in one B=8
generate call per D; acceptance length (benchmarks/REPORT.md, Medusa).
Usage: python benchmarks/scripts/medusa_identity.py [METHOD] [D,...] [HEAD_FOLDER]"""
import json
import sys
import time

import numpy as np

import models
from jspec import Decoder, SpecDecoder, prompt_suite
from jspec.drafters import heads
from jspec.drafters.medusa import checkpoint as medusa_format

method = sys.argv[1] if len(sys.argv) > 1 else "medusa"
depths = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "3,4").split(",")]
head = sys.argv[3] if len(sys.argv) > 3 else None          # default: the shipped head
lm = models.load(models.DEFAULT_MODEL, quiet=True)
tok = lm.tokenizer
cats = ["coding", "code_editing", "summarization", "rag_qa", "math", "writing", "multi_turn"]
picked = prompt_suite.select(prompt_suite.load("benchmarks/prompts/suite.jsonl"), categories=cats,
                             per_category=2)
picked = [p for p in picked if p.id.endswith("-01")] + [p for p in picked if p.id == "math-02"]
prompts = [tok.encode(tok.apply_chat_template(list(p.messages))) for p in picked]
print("prompts:", [p.id for p in picked], "tokens:", [len(p) for p in prompts], flush=True)
plain = Decoder(lm.model).generate(prompts, max_new_tokens=64, eos=False).token_ids
ids = set(np.asarray(medusa_format.load_medusa(heads.shipped_head("medusa",
    lm.model.config)[0]).draft_to_target[...]).tolist())
replies = [t for row in plain for t in row]
print(f"medusa draft vocabulary covers {np.mean([t in ids for t in replies]):.3f} of the "
      f"{len(replies)} reply tokens", flush=True)
for d in depths:
  cfg = {"method": method, "num_speculative_tokens": d, "draft_sampling": False}
  if head:
    cfg["head"] = head
  spec = SpecDecoder(lm.model, cfg)
  spec.generate(prompts, max_new_tokens=64, eos=False)                    # compile
  t0 = time.perf_counter()
  out = spec.generate(prompts, max_new_tokens=64, eos=False)
  dt = time.perf_counter() - t0
  rows = sum(a == b for a, b in zip(out.token_ids, plain))
  print(json.dumps(dict(method=method, D=d, identical=out.token_ids == plain,
                        identical_rows=f"{rows}/{len(plain)}",
                        acceptance_length=round(out.acceptance_length, 3), rounds=out.rounds,
                        per_position=[round(x, 3) for x in out.per_position_acceptance],
                        seconds=round(dt, 2))), flush=True)
