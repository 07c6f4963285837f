"""`jspec bench`: speculative vs plain decoding of the same prompts, per category, JSON out.

For each batch size, every batch of a category's prompts runs once plainly and once per
speculative configuration, back to back (order alternating), after a warm-up; compilation is
excluded. Results are flat records (RECORD_FIELDS), one per (drafter, D, batch size, category) plus
category "all".
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import defaultdict

import jax

from jspec.bench import cost_model, plain, stats
from jspec.cli_args import parse_drafter
from jspec.config import SpeculativeConfig
from jspec.decode import Decoder, bucket
from jspec.prompt_suite import Prompt
from jspec.spec_decode import SpecDecoder
from jspec.timing import measure_bandwidth, time_draft, time_verify

SCHEMA = "jspec.bench/1"
# name -> (type, meaning). The JSON's stable contract; tests check every record against it.
RECORD_FIELDS = {
    "drafter": (str, "a registered method's CLI name: ngram | layer-skip | suffix | ..."),
    "num_draft": ((int, str), "D, draft tokens per round, or 'auto' (adaptive, D_max = 7)"),
    "batch_size": (int, "rows per batch"),
    "temperature": (float, "sampling temperature (0 = greedy)"),
    "category": (str, "prompt category, or 'all'"),
    "num_prompts": (int, "distinct prompts"),
    "num_runs": (int, "batch runs measured (batches x repeats)"),
    "generated_tokens": (int, "decode tokens of the speculative runs (first tokens excluded)"),
    "acceptance_length": (float, "tokens committed per target verify, bonus included"),
    "per_position_acceptance": (list, "[D] fraction of rounds accepting draft position i"),
    "tokens_per_s": (float, "speculative decode tokens/s (all runs' tokens / all runs' time)"),
    "baseline_tokens_per_s": (float, "plain decode tokens/s of the same batches"),
    "speedup": (float, "median over runs of spec/plain tokens/s of the same batch"),
    "speedup_p25": (float, "first quartile of the per-run speedups"),
    "speedup_p75": (float, "third quartile"),
    "speedup_min": (float, "smallest per-run speedup"),
    "speedup_max": (float, "largest per-run speedup"),
    "speedup_runs": (list, "the per-run speedups in run order (batches, then repeats), the same "
                     "order in every config's record of a category and batch size: paired"),
    "draft_time_share": (float, "rounds x measured draft time / decode time"),
    "verify_time_share": (float, "rounds x measured verify time / decode time"),
    "t1_ms": (float, "plain decode step (decode time / steps)"),
    "verify_ms": (float, "target pass over 1+D tokens, timed alone at this batch's state"),
    "draft_ms": (float, "drafter propose + commit, timed alone"),
    "predicted_speedup": ((float, type(None)), "AL * T(1) / (T(1+D) + T_draft); null for 'auto' "
                          "(its verify width varies by round)"),
    "verified_lengths": ((dict, type(None)), "'auto': batch rounds that verified each draft "
                         "length (0 = a plain step); else null"),
    "round_ms": ((dict, type(None)), "'auto': ms per round verifying each length as timed at "
                 "warm-up and chosen by (SpecDecoder time_rounds), median over the runs; else null"),
    "baseline_fraction_of_roofline": (float, "plain step rate B/T(1) over the bandwidth roofline"),
    "same_as_plain": ((bool, type(None)), "greedy: every output equals plain decoding; else null"),
}


def spec_config(drafter: str, d: int, options: dict | None = None) -> SpeculativeConfig:
  """drafter: a method, or a variant (`parse_drafter`); options: the method's own config keys
  (e.g. {"num_layers": 7} for layer-skip); a variant's keys override them."""
  method, over = parse_drafter(drafter)
  return SpeculativeConfig.from_dict({"method": method, "num_speculative_tokens": d,
                                      **(options or {}), **over})


def _num(x) -> str:
  return "—" if x is None else f"{x:.2f}"


def batches(rows: list, b: int) -> list[list]:
  """Consecutive groups of b rows; the last group is filled up by cycling from the start."""
  n = math.ceil(len(rows) / b)
  return [[rows[(i * b + j) % len(rows)] for j in range(b)] for i in range(n)]


def _add_lists(a: list, b: list) -> list:
  """Elementwise sum, the shorter list padded with zeros."""
  n = max(len(a), len(b))
  return [x + y for x, y in zip(list(a) + [0] * (n - len(a)), list(b) + [0] * (n - len(b)))]


def interleaved_runs(plain_dec, specs: dict, configs: list, ids, *, index: int, repeats: int,
                     seed: int, kw: dict, extra=lambda c: {}, tick=lambda: None):
  """Runs one batch `repeats` times: plain decoding first, then every config, in an order that
  alternates between batches and runs (so that a slow phase of the machine hits all alike).
  Yields (config, spec output, plain output)."""
  for r in range(repeats):
    order = configs if (index + r) % 2 == 0 else configs[::-1]
    base = plain_dec.generate(ids, seed=seed + r, **kw)
    tick()
    for c in order:
      out = specs[c].generate(ids, seed=seed + r, **kw, **extra(c))
      tick()
      yield c, out, base


class Accumulator:
  """Sums over runs of one (config, batch size, category)."""

  def __init__(self, d):
    self.rounds = self.emitted = self.tokens = self.base_tokens = self.steps = 0
    self.decode_s = self.base_decode_s = self.base_steps_s = 0.0
    self.base_steps = 0
    self.accepted_at = [0] * d if isinstance(d, int) else []   # "auto": grows to D_max
    self.verified_lengths: dict[int, int] = {}
    self.round_costs: list[dict[int, float]] = []
    self.ratios, self.same, self.prompts = [], [], set()
    self.parts = None            # (t_verify, t_draft) seconds, timed once

  def add(self, out, base, prompt_ids):
    self.rounds += out.rounds
    self.emitted += out.emitted
    self.accepted_at = _add_lists(self.accepted_at, out.accepted_at)
    for w, c in out.verified_lengths.items():
      self.verified_lengths[w] = self.verified_lengths.get(w, 0) + c
    if out.round_costs:
      self.round_costs.append(out.round_costs)
    self.tokens += sum(max(len(t) - 1, 0) for t in out.token_ids)
    self.decode_s += out.decode_s
    self.steps += out.steps
    self.base_tokens += sum(max(len(t) - 1, 0) for t in base.token_ids)
    self.base_decode_s += base.decode_s
    self.base_steps += max(len(t) for t in base.token_ids) - 1
    self.ratios.append(out.decode_tokens_per_s / base.decode_tokens_per_s)
    self.same.append(out.token_ids == base.token_ids)
    self.prompts.update(prompt_ids)


def make_record(key, acc: Accumulator, parts_by_cat: dict, roofline: float,
                temperature: float) -> dict:
  drafter, d, b, category = key
  t1 = acc.base_decode_s / max(acc.base_steps, 1)
  # step-weighted over the categories pooled in this record (one category unless "all")
  t_verify = sum(s * v for s, v, _ in parts_by_cat) / max(sum(s for s, _, _ in parts_by_cat), 1)
  t_draft = sum(s * dr for s, _, dr in parts_by_cat) / max(sum(s for s, _, _ in parts_by_cat), 1)
  al = acc.emitted / max(acc.rounds, 1)
  spread = stats.spread(acc.ratios)
  return dict(
      drafter=drafter, num_draft=d, batch_size=b, temperature=float(temperature),
      category=category, num_prompts=len(acc.prompts), num_runs=len(acc.ratios),
      generated_tokens=acc.tokens, acceptance_length=al,
      per_position_acceptance=[a / max(acc.rounds, 1) for a in acc.accepted_at],
      tokens_per_s=acc.tokens / acc.decode_s, baseline_tokens_per_s=acc.base_tokens / acc.base_decode_s,
      speedup=spread["median"], speedup_p25=spread["p25"], speedup_p75=spread["p75"],
      speedup_min=spread["min"], speedup_max=spread["max"], speedup_runs=list(acc.ratios),
      draft_time_share=acc.steps * t_draft / acc.decode_s,
      verify_time_share=acc.steps * t_verify / acc.decode_s,
      t1_ms=1e3 * t1, verify_ms=1e3 * t_verify, draft_ms=1e3 * t_draft,
      predicted_speedup=cost_model.predicted_speedup(max(al, 1.0), t1, t_verify, t_draft)
      if isinstance(d, int) else None,
      verified_lengths={str(w): c for w, c in sorted(acc.verified_lengths.items())} or None,
      round_ms={str(w): 1e3 * statistics.median(r[w] for r in acc.round_costs)
                for w in acc.round_costs[0]} if acc.round_costs else None,
      baseline_fraction_of_roofline=(b / t1) / roofline,
      same_as_plain=all(acc.same) if temperature == 0 else None)


def run(loaded, prompts: list[Prompt], *, drafters=("ngram", "layer-skip"), num_draft=(1, 3, 7),
        batch_sizes=(1, 4), temperature=0.0, max_new_tokens=128, repeats=1, ignore_eos=False,
        drafter_options: dict[str, dict] | None = None, seed=0, progress: bool = True,
        cost_table=None) -> dict:
  """drafter_options: per drafter name, its method's config keys (registry options). cost_table:
  for 'auto' draft lengths, a CostTable or a `jspec plan` report path."""
  from tqdm import tqdm

  tok = loaded.tokenizer
  by_cat = defaultdict(list)
  for p in prompts:
    by_cat[p.category].append((p.id, tok.encode(tok.apply_chat_template(list(p.messages)))))
  configs = [(dr, d) for dr in drafters for d in num_draft]
  # validate every configuration before any model work
  opts = drafter_options or {}
  spec_cfgs = {c: spec_config(c[0], c[1], opts.get(c[0])) for c in configs}
  plain_dec = Decoder(loaded.model, eos_ids=tok.eos_ids)
  specs = {c: SpecDecoder(loaded.model, cfg, eos_ids=tok.eos_ids,
                          draft_model=loaded.model if cfg.method == "draft_model" else None,
                          cost_table=cost_table)
           for c, cfg in spec_cfgs.items()}
  # One padded prompt shape for the whole run: one compile per (config, B) instead of per length
  # bucket (the padding is attended over by plain and speculative runs alike).
  pad_to = bucket(max(len(x) for rows in by_cat.values() for _, x in rows))
  kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, eos=not ignore_eos,
            pad_to=pad_to)
  plan = {b: {cat: batches(rows, b) for cat, rows in by_cat.items()} for b in batch_sizes}
  total = sum(len(bs) for per_b in plan.values() for bs in per_b.values()) * repeats * (1 + len(configs))
  bar = tqdm(total=total, desc="jspec bench", unit="run", file=sys.stderr, disable=not progress)
  bandwidths = [measure_bandwidth(repeats=3)]
  accs, parts, timed = {}, {}, {}
  for b in batch_sizes:
    first = next(iter(plan[b].values()))[0]
    ids = [r[1] for r in first]
    plain_dec.generate(ids, seed=seed, **kw)          # warm-up (and compile) everything at B
    for c in configs:
      specs[c].generate(ids, seed=seed, **kw)
      specs[c].reset_drafter()          # the warm-up's outputs join no suffix cache
    bandwidths.append(measure_bandwidth(repeats=3))
    for cat, bs in plan[b].items():
      for i, batch in enumerate(bs):
        ids = [r[1] for r in batch]
        for c, out, base in interleaved_runs(plain_dec, specs, configs, ids, index=i,
                                             repeats=repeats, seed=seed, kw=kw, tick=bar.update):
          accs.setdefault((c[0], c[1], b, cat), Accumulator(c[1])).add(out, base,
                                                                [row[0] for row in batch])
        for c in configs:                 # component times at this category's shapes, once each
          if (c, b, cat) not in parts:
            state, params = specs[c].prefill(ids, seed=seed, **kw)
            vkey = (b, c[1], state.tokens.shape, specs[c].drafter.target_taps,
                    specs[c].drafter.num_extra)
            dkey = (c, b, state.tokens.shape)
            if vkey not in timed:     # first: it consumes the cache, time_draft the drafter state
              timed[vkey] = time_verify(specs[c], state, sampling=params)
            if dkey not in timed:
              timed[dkey] = time_draft(specs[c], state, params)
            parts[(c, b, cat)] = (timed[vkey], timed[dkey])
    # Executables of a 30-layer unrolled model are large: keep one batch size's at a time.
    for dec in (plain_dec, *specs.values()):
      dec.clear_compiled()
    jax.clear_caches()
  bar.close()
  bw = statistics.median(bandwidths)
  results = []
  for c in configs:
    for b in batch_sizes:
      roofline = b * bw / plain.step_bytes(plain_dec, b, pad_to + max_new_tokens)
      total_acc = Accumulator(c[1])
      pooled = []
      for cat in plan[b]:
        acc = accs[(c[0], c[1], b, cat)]
        v, dr = parts[(c, b, cat)]
        results.append(make_record((c[0], c[1], b, cat), acc, [(acc.steps, v, dr)], roofline,
                               temperature))
        pooled.append((acc.steps, v, dr))
        merge_into(total_acc, acc)
      results.append(make_record((c[0], c[1], b, "all"), total_acc, pooled, roofline, temperature))
  return dict(schema=SCHEMA, model=loaded.name, backend=jax.default_backend(),
              device=str(jax.devices()[0]), dtype=str(plain_dec.weights_dtype),
              jax_version=jax.__version__, bandwidth_gb_s=bw / 1e9,
              settings=dict(drafters=list(drafters), num_draft=list(num_draft),
                            batch_sizes=list(batch_sizes), temperature=temperature,
                            max_new_tokens=max_new_tokens, repeats=repeats, ignore_eos=ignore_eos,
                            drafter_options=opts, seed=seed,
                            categories=list(by_cat), num_prompts=len(prompts),
                            prompt_padding=pad_to),
              results=results)


def merge_into(into: Accumulator, acc: Accumulator) -> None:
  for name in ("rounds", "emitted", "tokens", "base_tokens", "steps", "decode_s", "base_decode_s",
               "base_steps"):
    setattr(into, name, getattr(into, name) + getattr(acc, name))
  into.accepted_at = _add_lists(into.accepted_at, acc.accepted_at)
  for w, c in acc.verified_lengths.items():
    into.verified_lengths[w] = into.verified_lengths.get(w, 0) + c
  into.round_costs += acc.round_costs
  into.ratios += acc.ratios
  into.same += acc.same
  into.prompts |= acc.prompts


def check_record(rec: dict) -> None:
  """Raises ValueError unless `rec` has exactly RECORD_FIELDS with their types."""
  if set(rec) != set(RECORD_FIELDS):
    raise ValueError(f"record fields differ: missing {sorted(set(RECORD_FIELDS) - set(rec))}, "
                     f"extra {sorted(set(rec) - set(RECORD_FIELDS))}")
  for name, (typ, _) in RECORD_FIELDS.items():
    if not isinstance(rec[name], typ) or (typ is int and isinstance(rec[name], bool)):
      raise ValueError(f"record field {name!r} should be {typ}, got {type(rec[name]).__name__}")


def markdown(report: dict, categories: bool = True) -> str:
  lines = ["| drafter | D | B | category | AL | speedup median (p25–p75) | predicted | spec tok/s | "
           "plain tok/s | draft / verify time | same as plain |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in report["results"]:
    if not categories and r["category"] != "all":
      continue
    same = "—" if r["same_as_plain"] is None else ("yes" if r["same_as_plain"] else "NO")
    lines.append(
        f"| {r['drafter']} | {r['num_draft']} | {r['batch_size']} | {r['category']} | "
        f"{r['acceptance_length']:.2f} | {r['speedup']:.2f} ({r['speedup_p25']:.2f}–"
        f"{r['speedup_p75']:.2f}) | {_num(r['predicted_speedup'])} | {r['tokens_per_s']:.1f} | "
        f"{r['baseline_tokens_per_s']:.1f} | {100 * r['draft_time_share']:.0f}% / "
        f"{100 * r['verify_time_share']:.0f}% | {same} |")
  return "\n".join(lines)
