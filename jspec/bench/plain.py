"""Plain-decode throughput against a memory-bandwidth roofline measured in the same run.

Decoding at small batch is bound by reading weights (and the KV cache) once per step, so the
roofline is  tokens/s <= B * bandwidth / bytes_read_per_step.  Bandwidth is measured here, now, by
an XLA reduction over a buffer much larger than the caches, interleaved with the decode runs.
"""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp

from jspec.decode import Decoder, bucket
from jspec.timing import measure_bandwidth

PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about a compiler.",
    "List three uses of a hash map.",
    "What is the capital of Japan, and what is it known for?",
    "Give me a short recipe for pancakes.",
    "Summarise the rules of chess in one paragraph.",
    "Why do programmers prefer dark mode?",
    "Translate 'good morning' into French, Spanish and German.",
]


def step_bytes(decoder: Decoder, batch_size: int, cache_len: int) -> int:
  """Bytes one decode step must read: every weight once, plus the K/V it attends over."""
  weights = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(decoder.weights))
  cfg = decoder.config
  kv = 2 * cfg.num_layers * batch_size * cache_len * cfg.num_kv_heads * cfg.head_dim
  return weights + kv * jnp.dtype(decoder.cache_dtype).itemsize


def run(loaded, batch_sizes=(1, 8), max_new_tokens: int = 64, repeats: int = 5) -> dict:
  tok = loaded.tokenizer
  decoder = Decoder(loaded.model, eos_ids=tok.eos_ids)
  prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS]
  results = []
  for b in batch_sizes:
    batch = [prompts[i % len(prompts)] for i in range(b)]
    decoder.generate(batch, max_new_tokens=max_new_tokens, eos=False)   # warm-up / compile
    rates, bws = [], []
    for _ in range(repeats):   # interleave bandwidth and decode so both see the same machine state
      bws.append(measure_bandwidth(repeats=3))
      out = decoder.generate(batch, max_new_tokens=max_new_tokens, eos=False)
      rates.append(b * (max_new_tokens - 1) / out.decode_s)   # decode steps only, prefill excluded
    cache_len = bucket(max(len(p) for p in batch)) + max_new_tokens
    bytes_per_step = step_bytes(decoder, b, cache_len)
    bw = statistics.median(bws)
    roofline = b * bw / bytes_per_step
    rate = statistics.median(rates)
    results.append(dict(batch_size=b, max_new_tokens=max_new_tokens, repeats=repeats,
                        decode_tokens_per_s=rate, decode_tokens_per_s_min=min(rates),
                        decode_tokens_per_s_max=max(rates), bandwidth_gb_s=bw / 1e9,
                        bytes_per_step=int(bytes_per_step), roofline_tokens_per_s=roofline,
                        fraction_of_roofline=rate / roofline))
  return dict(model=loaded.name, backend=jax.default_backend(), device=str(jax.devices()[0]),
              dtype=str(decoder.weights_dtype), jax_version=jax.__version__, results=results)
