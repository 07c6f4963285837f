"""Calibrates a DSpark head's confidences (per-position temperature scaling, jspec/confidence.py)
on prompts the head never saw and that are not the benchmark suite: the target answers them
greedily, every reply position opens a block, and position k's temperature is fitted to the greedy
survival (slots 1..k all equal the target's argmax). Saves calibration.json beside the head, which
`confidence_schedule=true` then reads.
Usage: python benchmarks/scripts/dspark_calibrate.py HEAD_FOLDER PROMPTS.jsonl [NUM_PROMPTS]"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import models
from jspec import Decoder, prompt_suite
from jspec.confidence import fit_temperatures, save_calibration
from jspec.drafters.dflash import checkpoint as dflash_format
from jspec.train.dflash import block_loss
from jspec.train.shared import target_features

folder, path = sys.argv[1], sys.argv[2]
num = int(sys.argv[3]) if len(sys.argv) > 3 else 24
lm = models.load(models.DEFAULT_MODEL, quiet=True)
tok, target = lm.tokenizer, lm.model
module = dflash_format.load(folder, "dspark")
prompts = [tok.encode(tok.apply_chat_template(list(p.messages))) for p in prompt_suite.load(path)]
prompts = [p for p in prompts if len(p) <= 192][:num]
replies = Decoder(target, eos_ids=tok.eos_ids).generate(prompts, max_new_tokens=96).token_ids
n = max(len(p) + len(r) for p, r in zip(prompts, replies))
tokens = np.zeros((len(prompts), n), np.int32)
mask = np.zeros((len(prompts), n), np.int32)
for i, (p, r) in enumerate(zip(prompts, replies)):
  tokens[i, :len(p) + len(r)] = p + r
  mask[i, len(p):len(p) + len(r)] = 1
length = jnp.asarray([len(p) + len(r) for p, r in zip(prompts, replies)], jnp.int32)
ids = module.backbone.draft_to_target[...]
feats = target_features(target, jnp.asarray(tokens), module.config.taps, ids)
_, _, out = jax.jit(lambda t, m, l: block_loss(
    module, target.embed.embedding[...], target.head_rows(ids), feats.taps,
    feats.target_logits, t, m, l, jax.random.key(0), gamma=4.0, max_anchors=128,
    outputs=True))(jnp.asarray(tokens), jnp.asarray(mask), length)
full = np.asarray(jnp.all(out["w"] > 0, axis=-1)).reshape(-1)          # blocks with every label
conf = np.asarray(out["confidence"]).reshape(-1, module.config.max_draft)[full]
survived = np.cumprod(np.asarray(out["hit"]).reshape(-1, module.config.max_draft)[full], axis=1)
temps, before, after = fit_temperatures(conf, survived)
save_calibration(folder, temps, ece_before=before, ece_after=after,
                 source=f"{path}: {len(prompts)} prompts, {int(full.sum())} blocks, greedy "
                        "survival")
print(json.dumps({"prompts": len(prompts), "blocks": int(full.sum()),
                  "temperatures": np.round(temps, 3).tolist(),
                  "survival": np.round(survived.mean(0), 3).tolist(),
                  "ece_before": np.round(before, 4).tolist(),
                  "ece_after": np.round(after, 4).tolist()}, indent=2))
