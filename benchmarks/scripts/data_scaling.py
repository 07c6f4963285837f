"""The REPORT's data-scaling figure (issue 37): EAGLE-3 suite AL at one draft length against the
reply tokens a head was trained on, one line per suite category, from `jspec train replay --json`
files (every file replayed over the same prompts and replies):

.venv/bin/python benchmarks/scripts/data_scaling.py --point 181445:e3-2.json --point 725000:e3-8.json \
  --baseline shipped:shipped.json --json benchmarks/results/data_scaling/cpu.json \
  --plot benchmarks/plots/data_scaling.png

Prints the table as markdown; the JSON keeps every file's categories as replayed."""
import argparse
import json
import os
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


def _settings(d):
  return (os.path.basename(str(d.get("prompts"))), d.get("num_draft"), d.get("max_new_tokens"),
          d.get("per_category"))


def _same_replay(files):
  keys = ("prompts", "num_draft", "max_new_tokens", "per_category")
  first = _settings(files[0][1])
  for path, d in files[1:]:
    diff = [k for k, a, b in zip(keys, _settings(d), first) if a != b]
    if diff:
      sys.exit(f"{path} was replayed with other settings than {files[0][0]} ({diff}); replay every "
               "head over the same prompts, draft length and reply length")


def _entry(tokens, path, d, cats, series):
  return dict(reply_tokens=tokens, series=series, head=d["head"], file=path,
              al={c: d["categories"].get(c, {}).get("acceptance_length") for c in cats},
              per_position=d["categories"]["all"]["per_position_acceptance"])


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--point", action="append", default=[], metavar="REPLY_TOKENS:FILE",
                  help="a head trained on REPLY_TOKENS target reply tokens, replayed into FILE")
  ap.add_argument("--continued", action="append", default=[], metavar="REPLY_TOKENS:FILE",
                  help="a head trained further from an earlier export, REPLY_TOKENS distinct reply "
                       "tokens read by all its runs")
  ap.add_argument("--baseline", action="append", default=[], metavar="NAME:FILE",
                  help="a reference head drawn as a level (e.g. the shipped one)")
  ap.add_argument("--previous", default=None, metavar="OLD.json",
                  help="an earlier output of this script: its points and baselines are kept")
  ap.add_argument("--json", required=True)
  ap.add_argument("--plot")
  args = ap.parse_args(argv)
  old = None
  if args.previous:
    with open(args.previous) as f:
      old = json.load(f)
  if not args.point and not args.continued and not (old and old.get("points")):
    ap.error("give at least one --point REPLY_TOKENS:FILE")
  given = []
  for series, specs in (("scratch", args.point), ("continued", args.continued)):
    for spec in specs:
      tokens, path = _split(spec, "point" if series == "scratch" else "continued")
      try:
        tokens = int(tokens)
      except ValueError:
        sys.exit(f"--{'point' if series == 'scratch' else 'continued'} takes REPLY_TOKENS:FILE with "
                 f"an integer count (got {spec!r})")
      given.append((series, tokens, path, _load(path)))
  baselines = [(name, path, _load(path)) for name, path in (_split(s, "baseline")
                                                             for s in args.baseline)]
  files = [(p, d) for _, _, p, d in given] + [(p, d) for _, p, d in baselines]
  if old is not None:
    files.append((args.previous, old))
  _same_replay(files)
  first = files[0][1]
  def names(d):
    if "categories" in d:
      return d["categories"]
    return {c for e in d.get("points", []) + d.get("baselines", []) for c in e["al"]}
  cats = sorted({c for _, d in files for c in names(d) if c != "all"}) + ["all"]
  points = [_entry(t, p, d, cats, series) for series, t, p, d in given]
  bases = [dict(_entry(None, p, d, cats, None), name=n) for n, p, d in baselines]
  for b in bases:
    del b["reply_tokens"], b["series"]
  if old is not None:
    files_given = {e["file"] for e in points} | {b["file"] for b in bases}
    points += [dict(e, series=e.get("series", "scratch")) for e in old.get("points", [])
               if e["file"] not in files_given]
    names = {b["name"] for b in bases}
    bases += [b for b in old.get("baselines", []) if b["name"] not in names]
  points.sort(key=lambda e: (e["series"] != "scratch", e["reply_tokens"]))
  out = dict(num_draft=first["num_draft"], max_new_tokens=first["max_new_tokens"],
             per_category=first["per_category"], prompts=first["prompts"], points=points,
             baselines=bases)
  with open(args.json, "w") as f:
    json.dump(out, f, indent=1)

  mark = {"scratch": "", "continued": " (further)"}
  cols = [f"{e['reply_tokens'] / 1000:.0f} k{mark[e['series']]}" for e in points] + \
      [b["name"] for b in bases]
  print("| category | " + " | ".join(cols) + " |")
  print("|---|" + "---|" * len(cols))
  for c in cats:
    vals = [e["al"].get(c) for e in points] + [b["al"].get(c) for b in bases]
    name = f"**{c}**" if c == "all" else c
    print(f"| {name} | " + " | ".join("" if v is None else f"{v:.2f}" for v in vals) + " |")

  if args.plot:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = {}
    for series, style in (("scratch", "-"), ("continued", "--")):
      line = [e for e in points if e["series"] == series]
      if not line:
        continue
      xs = [e["reply_tokens"] for e in line]
      for c in cats:
        ys = [e["al"].get(c) for e in line]
        kw = dict(color="k", lw=3) if c == "all" else dict(lw=1.2, color=colors.get(c))
        (drawn,) = ax.plot(xs, ys, ls=style, marker="o" if series == "scratch" else "s",
                           label=c if series == "scratch" or not any(
                               e["series"] == "scratch" for e in points) else None, **kw)
        colors[c] = drawn.get_color()
    for b in bases:
      ax.axhline(b["al"]["all"], ls=":", color="grey", lw=1)
      ax.annotate(f"{b['name']} (all)", (min(e["reply_tokens"] for e in points), b["al"]["all"]),
                  textcoords="offset points", xytext=(2, 3), fontsize=8, color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("target reply tokens in the training data (dashed: trained further from the "
                  "previous head)", fontsize=8)
    ax.set_ylabel(f"suite AL, greedy, D = {first['num_draft']}")
    ax.set_title("EAGLE-3 head on SmolLM2-135M-Instruct: data scaling (replayed)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
  main()
