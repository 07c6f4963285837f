"""Measures what the cost model needs on the current device and writes the plan (`jspec plan`).

- T_verif(B, T): the target's forward over T tokens against a filled cache, every (B, T) compiled
  and warmed up, then timed round-robin (medians), as jspec.bench.verify_cost does (both with
  jspec.timing.Point);
- T_draft(B, D): each drafter's propose + commit at a post-prefill state of calibration prompts
  (jspec.timing.time_draft);
- acceptance: per-position reach r_k from greedy generation on calibration prompts (by default
  prompts sampled from the default model that no drafter trained on; never the benchmark suite)
  at D_max;
- the whole round: seconds per round of the adaptive round forced to each D (0 included, per step
  of its plain round) over seconds per step of plain decoding, generating from calibration prompts, interleaved, medians:
  the costs the adaptive choice uses (everything the forward timings leave out is in them);
- a roofline: read bandwidth and fp32 GEMM FLOP/s, for the memory- vs compute-bound guideline.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from jspec.costs import CostTable
from jspec.plan import model as cm
from jspec.timing import Point, measure_bandwidth, time_draft


def measure_verify(target, batch_sizes, tokens, context: int, repeats: int,
                   log=print) -> dict[int, dict[int, float]]:
  """Seconds per forward, B -> {T: median}."""
  graphdef, weights = nnx.split(target)
  max_len = context + max(tokens) + 8
  points = []
  for b in batch_sizes:
    for t in tokens:
      points.append(Point(graphdef, weights, target.config, "model", "model", b, t, context,
                          max_len))
      log(f"compiled verify B={b} T={t}")
  for _ in range(repeats):
    for p in points:
      p.call()                      # untimed: a decode loop runs steps back to back
      p.times.append(p.call())
  out: dict[int, dict[int, float]] = {}
  for p in points:
    out.setdefault(p.key["batch_size"], {})[p.key["tokens"]] = statistics.median(p.times)
  return out


def measure_roofline(repeats: int = 5) -> dict:
  bw = measure_bandwidth(repeats=repeats)
  n = 1024
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x, y: x @ y)
  f(a, a).block_until_ready()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    f(a, a).block_until_ready()
    times.append(time.perf_counter() - t)
  return dict(bytes_per_s=bw, flops_per_s=2 * n ** 3 / statistics.median(times), weight_bytes=4)


def measure_drafter(loaded, method: str, lengths, batch_sizes, prompts, *, max_new_tokens: int,
                    repeats: int, t1: dict[int, float], context: int = 0,
                    options: dict | None = None, log=print) -> cm.DrafterProfile:
  """Acceptance at D_max = max(lengths) on the calibration prompts, and the draft cost at every
  (B, D) relative to the plain step t1[B], with the prompts padded to `context` tokens."""
  from jspec.config import SpeculativeConfig
  from jspec.spec_decode import SpecDecoder

  tok = loaded.tokenizer
  draft_model = loaded.model if method in ("draft_model", "draft-model") else None

  def decoder(d):
    cfg = SpeculativeConfig.from_dict({"method": method, "num_speculative_tokens": d,
                                       **(options or {})})
    return SpecDecoder(loaded.model, cfg, eos_ids=tok.eos_ids, draft_model=draft_model)

  d_max = max(lengths)
  sd = decoder(d_max)
  accepted, offered, rounds = [0] * d_max, [0] * d_max, 0
  for i in range(0, len(prompts), 8):
    out = sd.generate(prompts[i:i + 8], max_new_tokens=max_new_tokens, pad_to=_pad(prompts))
    accepted = [a + b for a, b in zip(accepted, out.accepted_at)]
    offered = [a + b for a, b in zip(offered, out.offered_at)]
    rounds += out.rounds
  reach = tuple(a / max(rounds, 1) for a in accepted)
  acceptance = tuple(cm.offered_acceptance(accepted, offered))
  log(f"{method}: AL(D={d_max}) = {1 + sum(reach):.2f} on {len(prompts)} calibration prompts; "
      f"acceptance when proposed " + ", ".join(f"{a:.2f}" for a in acceptance))
  draft = {}
  for d in sorted((x for x in lengths if x > 0), reverse=True):
    sd = sd if d == d_max else decoder(d)     # D_max (first) reuses the acceptance decoder
    for b in batch_sizes:
      ids = [prompts[j % len(prompts)] for j in range(b)]
      state, sampling = sd.prefill(ids, max_new_tokens=max_new_tokens,
                                   pad_to=_pad(prompts, context))
      draft.setdefault(b, {})[d] = time_draft(sd, state, sampling, repeats=repeats) / t1[b]
    log(f"{method}: draft D={d} timed")
  draft = {b: dict(sorted(row.items())) for b, row in draft.items()}
  return cm.DrafterProfile(method.replace("-", "_"), reach, draft, acceptance=acceptance)


def measure_rounds(loaded, method: str, lengths, batch_sizes, prompts, *, max_new_tokens: int,
                   repeats: int, context: int = 0, options: dict | None = None,
                   log=print) -> dict[int, dict[int, float]]:
  """B -> {D: seconds per adaptive round forced to verify D / seconds per plain decode step}, for
  D in {0} + lengths (D = 0: per step of the plain round): one compiled program per B (the forced choice is a parameter), plain
  decoding interleaved with the rounds, medians of `repeats`. The prompts are padded to `context`
  tokens (bucketed), the cache fill the verify timings use: a round's own work is a fixed time, so
  its cost in plain steps grows as the step gets cheaper with a shorter context."""
  from jspec.decode import Decoder
  from jspec.spec_decode import SpecDecoder

  lengths = sorted({0} | set(lengths))
  draft_model = loaded.model if method in ("draft_model", "draft-model") else None
  sd = SpecDecoder(loaded.model, {"method": method, "num_speculative_tokens": max(lengths),
                                  "draft_lengths": lengths, **(options or {})},
                   draft_model=draft_model, time_rounds=False)     # forced below, by cost
  base = sd.drafter_params
  forced = {d: dataclasses.replace(base, cost=jnp.where(
      jnp.arange(len(lengths)) == k, 1.0, 1e3) * jnp.ones_like(base.cost))
      for k, d in enumerate(lengths)}
  plain = Decoder(loaded.model)
  pad = _pad(prompts, context)
  out: dict[int, dict[int, float]] = {}
  for b in batch_sizes:
    ids = [prompts[j % len(prompts)] for j in range(b)]

    def spec(d):
      sd.drafter_params = forced[d]
      o = sd.generate(ids, max_new_tokens=max_new_tokens, eos=False, pad_to=pad)
      if o.verified_lengths[d] != o.steps:
        raise RuntimeError(f"the round forced to D={d} verified {o.verified_lengths}")
      # the plain round (D = 0) is priced per token: it runs plain_block steps
      return o.decode_s / max(o.steps, 1) / (sd.drafter.plain_block if d == 0 else 1)

    def step():
      o = plain.generate(ids, max_new_tokens=max_new_tokens, eos=False, pad_to=pad)
      return o.decode_s / max(max_new_tokens - 1, 1)

    step()
    for d in lengths:
      spec(d)                                     # compiles once, warms up every length
    times = {d: [] for d in ["plain"] + lengths}
    for r in range(repeats):
      # each repeat decodes other calibration prompts (same padded shape: nothing recompiles),
      # so that one prompt's content does not set the costs
      ids = [prompts[(j + (r + 1) * b) % len(prompts)] for j in range(b)]
      times["plain"].append(step())
      for d in lengths:
        times[d].append(spec(d))
    t1 = statistics.median(times["plain"])
    out[b] = {d: statistics.median(times[d]) / t1 for d in lengths}
    log(f"{method}: rounds at B={b}, padding {pad} timed: " + ", ".join(f"D={d} {c:.2f}"
                                                         for d, c in out[b].items()))
  sd.drafter_params = base
  return out


def _pad(prompts, context: int = 0) -> int:
  from jspec.decode import bucket
  return bucket(max([len(p) for p in prompts] + [context]))


def run(loaded, drafters, *, batch_sizes=(1, 4), lengths=(1, 2, 3, 5, 7), prompts, max_new_tokens=64,
        repeats: int = 7, context: int | tuple[int, ...] = 256,
        drafter_options: dict | None = None, log=print) -> dict:
  """The plan: measured tables, the ranking per batch size, the schedule and the guidelines.
  `repeats` times each forward and draft; the whole rounds, each a generate call, take
  min(repeats, max(5, repeats - 2)). `context`: the prompt padding of the timings, or several:
  the forwards and drafts are timed at the largest, the rounds at each (the cost tables'
  `round_at`, which decoders read at their own padding)."""
  lengths = sorted(set(lengths))
  tokens = sorted({1} | {1 + d for d in lengths})
  paddings = sorted({_pad(prompts, c) for c in ((context,) if isinstance(context, int)
                                                 else context)})
  context = max(context) if not isinstance(context, int) else context
  roof = measure_roofline()
  secs = measure_verify(loaded.model, batch_sizes, tokens, context, repeats, log)
  verify = {b: {t: s / row[1] for t, s in row.items()} for b, row in secs.items()}
  t1 = {b: row[1] for b, row in secs.items()}
  profiles = []
  for m in drafters:
    opts = (drafter_options or {}).get(m)
    prof = measure_drafter(loaded, m, lengths, batch_sizes, prompts, max_new_tokens=max_new_tokens,
                           repeats=repeats, t1=t1, context=context, options=opts, log=log)
    rounds = {p: measure_rounds(loaded, m, lengths, batch_sizes, prompts,
                                max_new_tokens=max_new_tokens,
                                repeats=min(repeats, max(5, repeats - 2)),
                                context=p, options=opts, log=log) for p in paddings}
    profiles.append(dataclasses.replace(prof, round=rounds[paddings[-1]],
                                        round_at=rounds if len(paddings) > 1 else {}))
  ranking = cm.rank(verify, profiles, [0] + lengths)
  sched = cm.schedule(ranking)
  tables = {p.method: CostTable(verify, p.draft, source="jspec plan",
                                acceptance=p.acceptance or tuple(
                                    cm.conditional_acceptance(list(p.reach))),
                                round=p.round, round_at=p.round_at).to_dict()
            for p in profiles}
  first = sched[min(sched)]["drafter"]
  return dict(
      backend=jax.default_backend(), device=str(jax.devices()[0]), jax_version=jax.__version__,
      model=loaded.name, context=context, round_paddings=paddings, calibration_prompts=len(prompts),
      max_new_tokens=max_new_tokens, repeats=repeats, roofline=roof,
      verify_ms={str(b): {str(t): 1e3 * s for t, s in row.items()} for b, row in secs.items()},
      drafters={p.method: dict(reach=list(p.reach),
                               conditional_acceptance=cm.conditional_acceptance(list(p.reach)),
                               acceptance_when_proposed=list(p.acceptance),
                               acceptance_length={str(d): cm.acceptance_length(list(p.reach), d)
                                                  for d in [0] + lengths},
                               draft_cost={str(b): {str(d): c for d, c in r.items()}
                                           for b, r in p.draft.items()},
                               round_cost={str(b): {str(d): c for d, c in r.items()}
                                           for b, r in p.round.items()})
                for p in profiles},
      ranking={str(b): rows for b, rows in ranking.items()},
      schedule={str(b): e for b, e in sched.items()},
      cost_table=tables.get(first) or CostTable(verify, source="jspec plan").to_dict(),
      cost_tables=tables,
      guidelines=cm.guidelines(loaded.model.config, verify, ranking, roof,
                               jax.default_backend()))
