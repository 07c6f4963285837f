"""Measures the shipped Medusa head's rank accuracies (how often head k's rank-r candidate is the
next-but-k token) on calibration prompts the head never saw and that are not the benchmark suite,
and saves them beside the head for `tree_choices="auto"` (benchmarks/REPORT.md, Medusa trees).
Usage: python benchmarks/scripts/medusa_calibrate.py PROMPTS.jsonl [NUM_PROMPTS] [RANKS]"""
import json
import sys

import jax.numpy as jnp
import numpy as np

import models
from jspec import Decoder, prompt_suite
from jspec.drafters import heads
from jspec.drafters.medusa import checkpoint as medusa_format
from jspec.train.medusa import final_hidden, rank_accuracy

path = sys.argv[1]
num = int(sys.argv[2]) if len(sys.argv) > 2 else 24
ranks = int(sys.argv[3]) if len(sys.argv) > 3 else 4
lm = models.load(models.DEFAULT_MODEL, quiet=True)
tok = lm.tokenizer
folder = heads.shipped_head("medusa", lm.model.config)[0]
head = medusa_format.load_medusa(folder)
prompts = [tok.encode(tok.apply_chat_template(list(p.messages))) for p in prompt_suite.load(path)]
prompts = [p for p in prompts if len(p) <= 192][:num]
replies = Decoder(lm.model, eos_ids=tok.eos_ids).generate(prompts, max_new_tokens=96).token_ids
n = max(len(p) + len(r) for p, r in zip(prompts, replies))
tokens = np.zeros((len(prompts), n), np.int32)
reply = np.zeros((len(prompts), n), bool)
for i, (p, r) in enumerate(zip(prompts, replies)):
  tokens[i, :len(p) + len(r)] = p + r
  reply[i, len(p):len(p) + len(r)] = True
hidden = final_hidden(lm.model, jnp.asarray(tokens))
acc = rank_accuracy(head, hidden, jnp.asarray(tokens), jnp.asarray(reply), ranks)
medusa_format.save_rank_accuracy(folder, acc, source=f"{path}: {len(prompts)} prompts, "
                                 f"{int(reply.sum())} greedy reply tokens")
print(json.dumps({"prompts": len(prompts), "reply_tokens": int(reply.sum()),
                  "rank_accuracy": np.round(acc, 4).tolist()}, indent=2))
