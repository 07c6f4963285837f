"""The cost of drawing one token per row (`jspec.sampling.sample`) against the textbook way (a full
sort of the vocabulary for top-k / top-p, Gumbel-max for the draw), on the default model's own
next-token logits, interleaved, at several batch sizes; JSON out.

  python -m jspec.bench.sampling --json benchmarks/results/sampling/cpu.json
      [--batch-sizes 1,16,64] [--calls 10]

Rows are the model's logits at positions spread over 8 committed training prompts (real
distributions: how often a top-p cut lies past the 256 candidates depends on them).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jspec.bench.step_latency import wall_us
from jspec.io import atomic_write_text, check_writable
from jspec.sampling import TOP_CANDIDATES, SamplingParams, sample

SETTINGS = {"greedy": (0.0, 0, 1.0), "T=1": (1.0, 0, 1.0), "T=0.7 top_p=0.9": (0.7, 0, 0.9),
            "T=1 top_k=50": (1.0, 50, 1.0)}


def textbook(keys, logits, params: SamplingParams):
  """Full-sort top-k / top-p (skipped when no row filters), then Gumbel-max (skipped when every
  row is greedy): the usual implementation, and jspec's before; the same distribution."""
  t = params.temperature[:, None]
  scaled = logits / jnp.where(t > 0, t, 1.0)
  v = scaled.shape[-1]

  def cut(scaled):
    desc = -jnp.sort(-scaled, axis=-1)
    k = jnp.where(params.top_k > 0, jnp.minimum(params.top_k, v), v)[:, None]
    kth = jnp.take_along_axis(desc, k - 1, axis=-1)
    in_k = jnp.where(jnp.arange(v) < k, desc, -jnp.inf)
    p_sorted = jax.nn.softmax(in_k, axis=-1)
    before = jnp.cumsum(p_sorted, axis=-1) - p_sorted
    n_keep = jnp.maximum(jnp.sum(before < params.top_p[:, None], axis=-1, keepdims=True), 1)
    pth = jnp.where(params.top_p[:, None] >= 1, -jnp.inf,
                    jnp.take_along_axis(desc, n_keep - 1, -1))
    return jnp.where(scaled >= jnp.maximum(kth, pth), scaled, -jnp.inf)

  greedy = jnp.argmax(logits, -1).astype(jnp.int32)

  def draw(_):
    filters = jnp.any((params.top_k > 0) | (params.top_p < 1.0))
    logp = jax.nn.log_softmax(jax.lax.cond(filters, cut, lambda s: s, scaled), -1)
    g = jax.vmap(lambda key: jax.random.gumbel(key, (v,)))(keys)
    return jnp.where(params.temperature == 0, greedy, jnp.argmax(logp + g, -1).astype(jnp.int32))

  return jax.lax.cond(jnp.all(params.temperature == 0), lambda _: greedy, draw, None)


def model_logits(rows: int) -> np.ndarray:
  """[rows, V] next-token logits of the default model over committed training prompts."""
  import models
  from jspec.prompt_suite import load
  from models.kv_cache import KVCache
  lm = models.load(models.DEFAULT_MODEL, quiet=True)
  tok, out = lm.tokenizer, []
  for p in load("benchmarks/prompts/train.jsonl")[:8]:
    ids = tok.encode(tok.apply_chat_template(list(p.messages)))[:256]
    x = jnp.asarray([ids], jnp.int32)
    logits = lm.model(x, KVCache.init(lm.model.config, 1, len(ids))).logits[0]
    out.append(np.asarray(logits, np.float32))
  pool = np.concatenate(out)
  return pool[np.linspace(0, len(pool) - 1, rows).astype(int)]    # spread over the prompts


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m jspec.bench.sampling",
                               description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", required=True)
  ap.add_argument("--batch-sizes", default="1,16,64")
  ap.add_argument("--calls", type=int, default=10)
  args = ap.parse_args(argv)
  try:
    check_writable(args.json)
    sizes = [int(x) for x in args.batch_sizes.split(",") if x]
    if not sizes or min(sizes) < 1 or args.calls < 1:
      raise ValueError("--batch-sizes values and --calls must be >= 1")
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  pool = model_logits(max(sizes))
  ours, theirs = jax.jit(sample), jax.jit(textbook)
  table, deep = {}, {}
  for b in sizes:
    logits = jnp.asarray(pool[:b])
    keys = jax.random.split(jax.random.key(0), b)
    for name, (t, k, p) in SETTINGS.items():
      params = SamplingParams.make(b, t, k, p)
      ms = {"jspec": wall_us(lambda: ours(keys, logits, params), args.calls) / 1e3,
            "textbook": wall_us(lambda: theirs(keys, logits, params), args.calls) / 1e3}
      table.setdefault(str(b), {})[name] = {k2: round(v, 3) for k2, v in ms.items()}
      print(f"B={b} {name}: jspec {ms['jspec']:.2f} ms, textbook {ms['textbook']:.2f} ms",
            file=sys.stderr)
  # how often a top-p cut (T = 0.7, p = 0.9) lies past the candidates (then: bisection)
  probs = jax.nn.softmax(jnp.asarray(pool) / 0.7, axis=-1)
  top = jax.lax.top_k(probs, TOP_CANDIDATES)[0].sum(-1)
  deep["top_p_0.9_rows_past_candidates"] = float(np.mean(np.asarray(top) < 0.9))
  result = dict(command="python -m jspec.bench.sampling " + " ".join(argv or sys.argv[1:]),
                machine=platform.processor() or platform.machine(), backend=jax.default_backend(),
                vocab=int(pool.shape[1]), what="ms per draw of one token per row, median of calls",
                ms=table, **deep)
  atomic_write_text(args.json, json.dumps(result, indent=1) + "\n")
  print(json.dumps(result, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
