"""PNG plots of a `jspec bench` report: acceptance length and speedup against D, per-position
acceptance per category, and the cost model's prediction against the measured speedup."""

from __future__ import annotations

import os
from collections import defaultdict

from jspec.io import atomic_open

FILES = ("acceptance_length_vs_d.png", "speedup_vs_d.png", "per_position_acceptance.png",
         "cost_model.png")


def _series(results, key, where):
  """{label: sorted [(D, record)]} of records matching `where`, grouped by `key`."""
  out = defaultdict(list)
  for r in results:
    if where(r) and isinstance(r["num_draft"], int):    # 'auto' has no place on a D axis
      out[key(r)].append((r["num_draft"], r))
  return {k: sorted(v, key=lambda t: t[0]) for k, v in sorted(out.items())}


def save_all(report: dict, folder: str) -> list[str]:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  os.makedirs(folder, exist_ok=True)
  res = report["results"]
  sizes = sorted({r["batch_size"] for r in res})
  title = f"{report['model']} on {report['backend']}, T={report['settings']['temperature']}"
  paths = []

  def save(fig, name):
    assert name in FILES, name   # FILES is what the CLI checks for writability before the run
    path = os.path.join(folder, name)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:   # an interrupt never leaves half a PNG
      fig.savefig(f, format="png", dpi=110)
    plt.close(fig)
    paths.append(path)

  fig, ax = plt.subplots(figsize=(5.5, 4))
  for b in sizes:
    for drafter, pts in _series(res, lambda r: r["drafter"],
                                lambda r: r["category"] == "all" and r["batch_size"] == b).items():
      ax.plot([d for d, _ in pts], [r["acceptance_length"] for _, r in pts], marker="o",
              label=f"{drafter}, B={b}")
  ax.set(xlabel="D (draft tokens per round)", ylabel="acceptance length (tokens / verify)",
         title=f"Acceptance length, all categories\n{title}")
  ax.legend(fontsize=8)
  save(fig, "acceptance_length_vs_d.png")

  fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False)
  for ax, b in zip(axes[0], sizes):
    for drafter, pts in _series(res, lambda r: r["drafter"],
                                lambda r: r["category"] == "all" and r["batch_size"] == b).items():
      ds = [d for d, _ in pts]
      med = [r["speedup"] for _, r in pts]
      err = [[m - r["speedup_p25"] for m, (_, r) in zip(med, pts)],
             [r["speedup_p75"] - m for m, (_, r) in zip(med, pts)]]
      ax.errorbar(ds, med, yerr=err, marker="o", capsize=3, label=drafter)
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set(xlabel="D", ylabel="speedup over plain (median, p25–p75)", title=f"B={b}")
    ax.legend(fontsize=8)
  fig.suptitle(title, fontsize=9)
  save(fig, "speedup_vs_d.png")

  drafters = sorted({r["drafter"] for r in res})
  fig, axes = plt.subplots(1, len(drafters), figsize=(5 * len(drafters), 4), squeeze=False)
  for ax, drafter in zip(axes[0], drafters):
    mine = [r for r in res if r["drafter"] == drafter and r["batch_size"] == sizes[0]
            and isinstance(r["num_draft"], int)]
    if not mine:
      continue
    d = max(r["num_draft"] for r in mine)
    for r in mine:
      if r["num_draft"] == d:
        ax.plot(range(1, d + 1), r["per_position_acceptance"], marker="o", label=r["category"],
                lw=2.5 if r["category"] == "all" else 1.2)
    ax.set(xlabel="draft position", ylabel="fraction of rounds accepting it", ylim=(0, 1),
           title=f"{drafter}, D={d}, B={sizes[0]}")
    ax.legend(fontsize=7)
  fig.suptitle(title, fontsize=9)
  save(fig, "per_position_acceptance.png")

  fig, ax = plt.subplots(figsize=(5, 4.5))
  for drafter in drafters:
    pts = [r for r in res if r["drafter"] == drafter and r["category"] != "all"
           and r["predicted_speedup"] is not None]
    ax.scatter([r["predicted_speedup"] for r in pts], [r["speedup"] for r in pts], s=12,
               label=drafter)
  lim = [0, max(1.2, max(max(r["predicted_speedup"] or 0, r["speedup"]) for r in res) * 1.05)]
  ax.plot(lim, lim, color="gray", lw=0.8, ls="--")
  ax.set(xlim=lim, ylim=lim, xlabel="predicted AL·T(1) / (T(1+D) + T_draft)",
         ylabel="measured speedup (median)", title="Cost model vs measurement\n(per category, D, B)")
  ax.legend(fontsize=8)
  save(fig, "cost_model.png")
  return paths
