"""The planner's Pareto plot: predicted tokens/s per user vs total tokens/s, per drafter and D."""

from __future__ import annotations

from jspec.plan.model import expected_speedup


def pareto(report: dict, path: str) -> str:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6.5, 4.8))
  series: dict = {}
  for b, rows in report["ranking"].items():
    step_s = report["verify_ms"][b]["1"] / 1e3
    for r in rows:
      per_user = expected_speedup(r) / step_s
      series.setdefault((r["drafter"], r["num_draft"]), []).append((int(b) * per_user, per_user,
                                                                     int(b)))
  for (drafter, d), pts in sorted(series.items(), key=lambda kv: (kv[0][1] > 0, str(kv[0]))):
    pts.sort()
    label = "plain" if d == 0 else f"{drafter} D={d}"
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=4,
            lw=2.5 if d == 0 else 1.0, color="black" if d == 0 else None, label=label)
    for x, y, b in pts:
      if d == 0:
        ax.annotate(f"B={b}", (x, y), fontsize=7, textcoords="offset points", xytext=(4, -8))
  ax.set(xlabel="total tokens/s (B x per user)", ylabel="tokens/s per user",
         title=f"Predicted speculative decoding, {report['model']} on {report['backend']}")
  ax.legend(fontsize=6, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path
