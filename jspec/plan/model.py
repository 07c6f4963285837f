"""The co-design cost model over measured tables (pure arithmetic; jspec/plan/measure.py measures).

For a drafter proposing D tokens at batch size B, with verify and draft costs in units of a plain
decode step T_verif(B, 1):
  AL(D)          = 1 + sum_{k <= D} r_k,  r_k = prod_{i <= k} a_i (P(the first k drafts accepted))
  speedup(B, D)  = AL(D) / (c_verify(B, 1 + D) + c_draft(B, D))
  low-latency    = AL(D) / (1 + rho * D),  rho = the marginal cost of a draft token at D_max
  round speedup  = AL(D) / c_round(B, D), with the whole round measured (when it was): what the
                   ranking and the schedule go by, since the forward timings leave out the round's
                   own work
"""

from __future__ import annotations

import dataclasses

from jspec.costs import CostTable


def acceptance_length(reach: list[float], d: int) -> float:
  """reach[k-1] = P(the first k drafts are accepted), measured at some D_max >= d."""
  if d > len(reach):
    raise ValueError(f"acceptance measured for D <= {len(reach)}, asked for D = {d}")
  return 1.0 + sum(reach[:d])


def conditional_acceptance(reach: list[float]) -> list[float]:
  """a_k = r_k / r_{k-1}: P(draft k accepted | drafts < k were)."""
  out, prev = [], 1.0
  for r in reach:
    out.append(r / prev if prev > 0 else 0.0)
    prev = r
  return out


def offered_acceptance(accepted_at: list[int], offered_at: list[int]) -> list[float]:
  """a_k = P(draft k accepted | it was verified with drafts < k accepted), counting only rounds
  that proposed draft k: what the adaptive estimates track, unlike conditional_acceptance(reach),
  which a drafter proposing nothing in some rounds (n-gram without a match) pulls down. A
  position never verified so takes the one before it's value (0.5 at the first)."""
  out, prev = [], 0.5
  for a, o in zip(accepted_at, offered_at):
    prev = a / o if o else prev
    out.append(prev)
  return out


def speedup(al: float, verify_cost: float, draft_cost: float) -> float:
  return al / (verify_cost + draft_cost)


def low_latency_speedup(al: float, rho: float, d: int) -> float:
  return al / (1.0 + rho * d)


@dataclasses.dataclass(frozen=True)
class DrafterProfile:
  method: str
  reach: tuple[float, ...]                       # measured at D_max = len(reach)
  draft: dict[int, dict[int, float]]             # B -> {D: T_draft(B, D) / T_verif(B, 1)}
  round: dict[int, dict[int, float]] = dataclasses.field(default_factory=dict)
  # B -> {D: seconds per (adaptive) round verifying D / seconds per plain step}, when measured
  # (at the largest padding of round_at)
  round_at: dict[int, dict[int, dict[int, float]]] = dataclasses.field(default_factory=dict)
  # prompt padding -> such a table, where the rounds were timed at several paddings
  acceptance: tuple[float, ...] = ()
  # offered_acceptance at D_max (the adaptive estimates' start); empty: from reach


def rank(verify: dict[int, dict[int, float]], profiles: list[DrafterProfile],
         lengths: list[int]) -> dict[int, list[dict]]:
  """Per batch size, every (drafter, D) with its predicted speedups, best first. verify: B -> {T:
  T_verif(B, T) / T_verif(B, 1)}."""
  out = {}
  for b in sorted(verify):
    rows = [dict(drafter=None, num_draft=0, acceptance_length=1.0, verify_cost=1.0, draft_cost=0.0,
                 speedup=1.0, low_latency_speedup=1.0, breakeven_acceptance_length=1.0)]
    for prof in profiles:
      table = CostTable(verify, prof.draft)
      d_max = len(prof.reach)
      rho = (table.verify_cost(b, 1 + d_max) + table.draft_cost(b, d_max) - 1.0) / d_max
      for d in lengths:
        if d == 0 or d > d_max:
          continue
        al = acceptance_length(list(prof.reach), d)
        cv, cd = table.verify_cost(b, 1 + d), table.draft_cost(b, d)
        row = dict(drafter=prof.method, num_draft=d, acceptance_length=al,
                   verify_cost=cv, draft_cost=cd, speedup=speedup(al, cv, cd),
                   low_latency_speedup=low_latency_speedup(al, rho, d),
                   breakeven_acceptance_length=cv + cd)
        if prof.round:
          cr = CostTable(verify, round=prof.round).round_costs(b, (d,), d)[0]
          row.update(round_cost=cr, round_speedup=al / cr)
        rows.append(row)
    out[b] = sorted(rows, key=lambda r: -expected_speedup(r))
  return out


def expected_speedup(row: dict) -> float:
  """A ranking row's best estimate: the measured-round speedup where there is one."""
  return row.get("round_speedup", row["speedup"])


def schedule(ranking: dict[int, list[dict]]) -> dict[int, dict]:
  """Batch size -> the best (drafter, D), or D = 0 (plain decoding) where nothing beats 1.0."""
  out = {}
  for b, rows in ranking.items():
    best = rows[0] if rows and expected_speedup(rows[0]) > 1.0 and rows[0]["num_draft"] else None
    out[b] = (dict(drafter=best["drafter"], num_draft=best["num_draft"],
                   predicted_speedup=expected_speedup(best)) if best else
              dict(drafter=None, num_draft=0, predicted_speedup=1.0))
  return out


def pick(sched: dict, batch_size: int) -> tuple[str | None, int]:
  """The schedule's (drafter, D) for a batch size: the entry of the largest planned B <= it (the
  smallest planned B below that). D = 0 means plain decoding."""
  table = {int(b): e for b, e in sched.items()}     # JSON keys are strings
  keys = sorted(table)
  if not keys:
    raise ValueError("the plan's schedule is empty")
  below = [k for k in keys if k <= batch_size]
  e = table[below[-1] if below else keys[0]]
  return e["drafter"], int(e["num_draft"])


def guidelines(config, verify: dict[int, dict[int, float]], ranking: dict[int, list[dict]],
               roofline: dict, backend: str) -> list[dict]:
  """The five co-design guidelines, each with its hint for this target and whether the
  measurements here bear it out (None: not testable on this hardware)."""
  g = config.num_heads // config.num_kv_heads
  bs = sorted(verify)
  best = {b: ranking[b][0] for b in bs if ranking[b]}
  out = []

  # 1. breakeven
  wins = {b: expected_speedup(r) > 1.0 for b, r in best.items()}
  out.append(dict(
      name="at low batch a drafter clears the breakeven acceptance length",
      hint="speculation pays where AL(D) > (T_verif(B, 1+D) + T_draft(B, D)) / T_verif(B, 1); "
           "the planner plans D = 0 (plain decoding) where no drafter clears it",
      holds=wins[min(best)] if best else None,
      evidence="; ".join(f"B={b}: best {r['drafter']} D={r['num_draft']} AL {r['acceptance_length']:.2f}"
                         f" vs breakeven {r.get('round_cost', r['breakeven_acceptance_length']):.2f}"
                         f"{' (whole round)' if 'round_cost' in r else ''} -> "
                         f"{'speculate' if wins[b] else 'plain'}" for b, r in best.items())))

  # 2. D shrinks as B grows
  ds = [best[b]["num_draft"] for b in bs if b in best]
  slopes = [(verify[b].get(max(verify[b])) - 1) / (max(verify[b]) - 1) for b in bs
            if max(verify[b]) > 1]
  out.append(dict(
      name="the best draft length shrinks as the batch grows",
      hint="verification grows costlier per token with B (GEMMs leave the memory-bound region)",
      holds=(all(x >= y for x, y in zip(ds, ds[1:])) and
             all(x <= y for x, y in zip(slopes, slopes[1:]))) if len(bs) > 1 else None,
      evidence=f"best D per B {dict(zip(bs, ds))}; marginal verify cost per token "
               f"{[round(s, 3) for s in slopes]}"))

  # 3. attention rows per KV head on one MMA tile
  d_tile = 128 // g - 1
  aligned = [d for d in range(1, 33) if (g * (1 + d)) % 16 == 0][:4]
  out.append(dict(
      name="attention verification is free while G(1+D) fits one 128-row MMA tile",
      hint=f"G = {g}: D <= 128/G - 1 = {d_tile}; G(1+D) on a multiple of 16 rows at D in "
           f"{aligned}",
      holds=None,
      evidence="not testable here: a CPU has no MMA tile; the CPU verify cost grows from T = 2 "
               "(table above)" if backend == "cpu" else "needs the attention-only timing on this "
               "device (jspec.bench.verify_cost --impls pallas)"))

  # 4. GEMMs memory- vs compute-bound at B(1+D) rows
  ridge = roofline["flops_per_s"] / roofline["bytes_per_s"]        # FLOP per byte
  itemsize = roofline.get("weight_bytes", 4)
  m_star = ridge * itemsize / 2                                    # rows where 2M/itemsize = ridge
  cheap = {b: max([t for t, c in sorted(verify[b].items()) if c <= 1.25] or [1]) for b in bs}
  out.append(dict(
      name="verification is nearly free while the target's GEMMs stay memory-bound",
      hint=f"a GEMM over M = B(1+D) rows of {itemsize}-byte weights does 2M/{itemsize} FLOP per "
           f"weight byte; the measured ridge is {ridge:.1f} FLOP/byte, so up to M = {m_star:.0f} "
           "rows should cost about one step",
      # holds if the measured cheap region (verify <= 1.25 steps) reaches half the ridge's rows
      holds=all(b * cheap[b] >= m_star / 2 for b in bs),
      evidence="; ".join(f"B={b}: T_verif within 1.25x of a step up to T={cheap[b]} "
                         f"(M={b * cheap[b]})" for b in bs)))

  # 5. serial draft cost
  serial = sorted({r["drafter"] for b in bs for r in ranking[b] if r["draft_cost"] > 0.02})
  best_d = {(m, b): max((r for r in ranking[b] if r["drafter"] == m), key=expected_speedup)
            for m in serial for b in bs}
  longest = {m: max(r["num_draft"] for b in bs for r in ranking[b] if r["drafter"] == m)
             for m in serial}
  out.append(dict(
      name="a serial drafter pays per draft token: AL/(1 + rho D) caps its useful D",
      hint="single-pass drafters (DFlash/DSpark) keep the draft cost flat in D; model-free "
           "drafters cost almost nothing, so their D is limited by verification only",
      holds=None if not serial else all(r["num_draft"] < longest[m]
                                        for (m, _), r in best_d.items()),
      evidence="no serial drafter measured" if not serial else "; ".join(
          f"{m} B={b}: best D={r['num_draft']} of <= {longest[m]}, draft {r['draft_cost']:.2f} "
          f"steps" for (m, b), r in best_d.items())))
  return out
