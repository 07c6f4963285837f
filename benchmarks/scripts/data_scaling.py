"""The REPORT's data-scaling figure (issue 37): EAGLE-3 suite AL at one draft length against the
reply tokens a head was trained on, one line per suite category, from `jspec train replay --json`
files (every file replayed over the same prompts and replies):

.venv/bin/python benchmarks/scripts/data_scaling.py --point 181445:e3-2.json --point 725000:e3-8.json \
  --baseline shipped:shipped.json --json benchmarks/results/data_scaling/cpu.json \
  --plot benchmarks/plots/data_scaling.png

Prints the table as markdown; the JSON keeps every file's categories as replayed."""
import argparse
import json
import sys


def _load(path):
  with open(path) as f:
    d = json.load(f)
  if "categories" not in d or "all" not in d["categories"]:
    sys.exit(f"{path} is not a `jspec train replay --json` file (no categories.all)")
  return d


def _split(spec, what):
  key, sep, path = spec.partition(":")
  if not sep or not key or not path:
    sys.exit(f"--{what} takes KEY:FILE (got {spec!r})")
  return key, path


def _same_replay(files):
  keys = ("prompts", "num_draft", "max_new_tokens", "per_category")
  first = files[0][1]
  for path, d in files[1:]:
    diff = [k for k in keys if d.get(k) != first.get(k)]
    if diff:
      sys.exit(f"{path} was replayed with other settings than {files[0][0]} ({diff}); replay every "
               "head over the same prompts, draft length and reply length")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--point", action="append", default=[], metavar="REPLY_TOKENS:FILE",
                  help="a head trained on REPLY_TOKENS target reply tokens, replayed into FILE")
  ap.add_argument("--baseline", action="append", default=[], metavar="NAME:FILE",
                  help="a reference head drawn as a level (e.g. the shipped one)")
  ap.add_argument("--json", required=True)
  ap.add_argument("--plot")
  args = ap.parse_args(argv)
  if not args.point:
    ap.error("give at least one --point REPLY_TOKENS:FILE")
  points = []
  for spec in args.point:
    tokens, path = _split(spec, "point")
    try:
      tokens = int(tokens)
    except ValueError:
      sys.exit(f"--point takes REPLY_TOKENS:FILE with an integer count (got {spec!r})")
    points.append((tokens, path, _load(path)))
  baselines = [(name, path, _load(path)) for name, path in (_split(s, "baseline")
                                                             for s in args.baseline)]
  _same_replay([(p, d) for _, p, d in points] + [(p, d) for _, p, d in baselines])
  points.sort(key=lambda t: t[0])
  cats = sorted(k for k in points[0][2]["categories"] if k != "all") + ["all"]

  def al(d, c):
    return d["categories"].get(c, {}).get("acceptance_length")

  first = points[0][2]
  out = dict(num_draft=first["num_draft"], max_new_tokens=first["max_new_tokens"],
             per_category=first["per_category"], prompts=first["prompts"],
             points=[dict(reply_tokens=t, head=d["head"], file=p,
                          al={c: al(d, c) for c in cats},
                          per_position=d["categories"]["all"]["per_position_acceptance"])
                     for t, p, d in points],
             baselines=[dict(name=n, head=d["head"], file=p, al={c: al(d, c) for c in cats},
                             per_position=d["categories"]["all"]["per_position_acceptance"])
                        for n, p, d in baselines])
  with open(args.json, "w") as f:
    json.dump(out, f, indent=1)

  cols = [f"{t / 1000:.0f} k" for t, _, _ in points] + [n for n, _, _ in baselines]
  print("| category | " + " | ".join(cols) + " |")
  print("|---|" + "---|" * len(cols))
  for c in cats:
    vals = [al(d, c) for _, _, d in points] + [al(d, c) for _, _, d in baselines]
    name = f"**{c}**" if c == "all" else c
    print(f"| {name} | " + " | ".join("" if v is None else f"{v:.2f}" for v in vals) + " |")

  if args.plot:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [t for t, _, _ in points]
    for c in cats:
      ys = [al(d, c) for _, _, d in points]
      ax.plot(xs, ys, marker="o", lw=3 if c == "all" else 1.2, color="k" if c == "all" else None,
              label=c)
    for name, _, d in baselines:
      ax.axhline(al(d, "all"), ls="--", color="grey", lw=1)
      ax.annotate(f"{name} (all)", (xs[0], al(d, "all")), textcoords="offset points",
                  xytext=(2, 3), fontsize=8, color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("target reply tokens in the training data")
    ax.set_ylabel(f"suite AL, greedy, D = {first['num_draft']}")
    ax.set_title("EAGLE-3 head on SmolLM2-135M-Instruct: data scaling (replayed)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
  main()
