"""Builds the drafter-training prompt corpus: generates each family's candidates, merges --include
files, drops exact duplicates, prompts sharing a word 13-gram with the evaluation prompts, the
--exclude files or the standard library, and near duplicates; writes JSON Lines (gzip if the name
ends in .gz) and a manifest beside it."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import statistics
import sys
import time
from typing import Callable, Sequence

import numpy as np

from jspec.train.prompts import advice, code, dedup, docs, mathgen, puzzles, roleplay, sources
from jspec.train.prompts import writing
from jspec.train.prompts.common import LONG_TOKENS, Candidate, Uses, est_tokens

FORMAT = "jspec-prompt-corpus/1"
DEFAULT_NUM = 32_000
OVERSHOOT = 1.25     # candidates generated per needed prompt (filters drop some)
# family -> (share of --num, generator(lib, uses, rng, n)); the order is the generation order
# (families earlier in it get first pick of the passages, see common.Uses).
FAMILIES: dict[str, tuple[float, Callable]] = {
    "coding": (0.10, code.coding),
    "code_explain": (0.08, code.code_explain),
    "code_edit": (0.10, code.code_edit),
    "summarization": (0.09, docs.summarization),
    "rag_qa": (0.10, docs.rag_qa),
    "extraction": (0.07, docs.extraction),
    "translation": (0.07, docs.translation),
    "writing": (0.10, writing.writing),
    "math": (0.10, mathgen.math_problems),
    "reasoning": (0.07, puzzles.reasoning),
    "roleplay": (0.06, roleplay.roleplay),
    "advice": (0.06, advice.advice),
}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
EVAL_FILES = tuple(os.path.join(REPO, "benchmarks", "prompts", f)
                   for f in ("suite.jsonl", "adversarial.jsonl", "calibration.jsonl"))


def quotas(num: int) -> dict[str, int]:
  """Prompts per family: num split by FAMILIES' shares (largest remainders; ties by order)."""
  exact = {f: num * w for f, (w, _) in FAMILIES.items()}
  out = {f: int(x) for f, x in exact.items()}
  for f in sorted(exact, key=lambda f: -(exact[f] - out[f]))[:num - sum(out.values())]:
    out[f] += 1
  return out


def min_num() -> int:
  """The smallest --num that gives every family at least one prompt."""
  return math.ceil(1 / min(w for w, _ in FAMILIES.values()))


def _open(path: str):
  return gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else \
      open(path, encoding="utf-8")


def read_reference(path: str) -> list[str]:
  """The texts of an --exclude file: JSON Lines with "messages" or "prompt" per line (.jsonl,
  optionally .gz), otherwise plain text (one reference)."""
  if not os.path.isfile(path):
    raise ValueError(f"--exclude file {path} does not exist")
  try:
    with _open(path) as f:
      text = f.read()
  except (OSError, UnicodeDecodeError, EOFError) as e:
    raise ValueError(f"--exclude file {path} cannot be read as UTF-8 text ({e})") from None
  if not path.endswith((".jsonl", ".jsonl.gz")):
    return [text]
  out = []
  for n, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"--exclude file {path}:{n}: not valid JSON ({e.msg}); give JSON Lines "
                       "with \"messages\" or \"prompt\", or a file not named .jsonl for plain "
                       "text") from None
    if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
      out.append(obj["prompt"])
    elif isinstance(obj, dict) and isinstance(obj.get("messages"), list):
      out.append("\n".join(str(m.get("content", "")) for m in obj["messages"]
                           if isinstance(m, dict)))
    else:
      raise ValueError(f"--exclude file {path}:{n}: each line needs \"messages\" (a list of "
                       "{role, content}) or \"prompt\" (a string)")
  return out


def read_include(path: str) -> list[dict]:
  """Prompt records in the benchmark suite's format (jspec.prompt_suite), e.g. Magpie prompts."""
  from jspec import prompt_suite
  if not os.path.isfile(path):
    raise ValueError(f"--include file {path} does not exist")
  try:
    with _open(path) as f:
      prompts = prompt_suite.parse(f, path)
  except (OSError, UnicodeDecodeError, EOFError) as e:
    raise ValueError(f"--include file {path} cannot be read as UTF-8 text ({e})") from None
  return [dict(id=p.id, category=p.category, messages=[dict(m) for m in p.messages],
               source=p.source) for p in prompts]


def _log(progress: bool, t0: float, msg: str) -> None:
  if progress:
    print(f"[{time.time() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def _check_out(out: str) -> None:
  if not out.endswith((".jsonl", ".jsonl.gz")):
    raise ValueError(f"output {out} must end in .jsonl or .jsonl.gz")
  folder = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(folder):
    raise ValueError(f"output folder {folder} does not exist")


def manifest_path(out: str) -> str:
  return out.removesuffix(".gz").removesuffix(".jsonl") + ".manifest.json"


def _filter(cands: list[Candidate], refs: dict[str, list[str]], progress: bool,
            t0: float) -> tuple[np.ndarray, dict]:
  """(kept mask, dropped counts by reason); each dropped prompt counts under its first reason."""
  texts = [c.text for c in cands]
  alive = ~dedup.exact_duplicates(["\n".join(f"{m['role']}: {m['content']}" for m in c.messages)
                                   for c in cands])
  dropped: dict = {"exact_duplicate": int((~alive).sum()), "contamination": {}}
  for name, ref in refs.items():
    hit = dedup.contaminated(texts, ref) & alive
    dropped["contamination"][name] = int(hit.sum())
    alive &= ~hit
    _log(progress, t0, f"13-gram check against {name}: {int(hit.sum())} dropped")
  idx = np.flatnonzero(alive)
  near = dedup.near_duplicates([texts[i] for i in idx], [cands[i].passage for i in idx],
                               [cands[i].request for i in idx])
  alive[idx[near]] = False
  dropped["near_duplicate"] = int(near.sum())
  _log(progress, t0, f"near duplicates: {int(near.sum())} dropped")
  return alive, dropped


def _stdlib_texts() -> list[str]:
  """Every .py file of the interpreter's standard library (its site-packages excluded)."""
  root = sources.stdlib_dir()
  out = []
  for folder, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "__pycache__"))
    for f in sorted(files):
      if f.endswith(".py"):
        with open(os.path.join(folder, f), encoding="utf-8", errors="replace") as fh:
          out.append(fh.read())
  return out


def _stats(records: list[dict]) -> dict:
  by: dict[str, list[int]] = {}
  for r in records:
    by.setdefault(r["category"], []).append(est_tokens("\n".join(m["content"]
                                                                  for m in r["messages"])))
  out = {}
  for cat, toks in sorted(by.items()):
    out[cat] = dict(prompts=len(toks), median_est_tokens=int(statistics.median(toks)),
                    max_est_tokens=max(toks), long=sum(t >= LONG_TOKENS for t in toks),
                    over_700=sum(t > 700 for t in toks))
  return out


def build_corpus(out: str, *, num: int = DEFAULT_NUM, seed: int = 0,
                 exclude: Sequence[str] = (), include: Sequence[str] = (),
                 roots: Sequence[str] | None = None, eval_files: Sequence[str] = EVAL_FILES,
                 stdlib_check: bool = True, progress: bool = True) -> dict:
  """Writes the corpus to `out` and its manifest beside it; returns the manifest. Every input is
  checked before any work; errors a user can fix raise ValueError."""
  t0 = time.time()
  if num == 0 and not include:
    raise ValueError("--num 0 builds a file of --include prompts only; name some --include files "
                     f"or give --num >= {min_num()}")
  if num != 0 and num < min_num():
    raise ValueError(f"--num must be at least {min_num()} so that each of the {len(FAMILIES)} "
                     f"families gets a prompt (or 0 for --include prompts only), got {num}")
  _check_out(out)
  for path in eval_files:
    if not os.path.isfile(path):
      raise ValueError(f"evaluation prompt file {path} is missing; run from a jspec checkout "
                       "(its benchmarks/prompts folder holds them)")
  # evaluation files are named relative to the repository, --exclude files as given
  refs = {os.path.relpath(p, REPO) if p in eval_files else p: read_reference(p)
          for p in list(eval_files) + list(exclude)}
  included = [(path, r) for path in include for r in read_include(path)]
  if num:
    roots = list(roots) if roots is not None else sources.default_roots()
    lib = sources.scan(roots, seed=seed)
    _log(progress, t0, f"scanned {len(lib.dists)} packages: {len(lib.code)} functions/classes, "
                       f"{len(lib.docs)} doc passages")
  else:
    lib = sources.Library(code=[], docs=[], dists={})
  if stdlib_check:
    refs["python standard library"] = _stdlib_texts()

  want = quotas(num)
  uses = Uses()
  cands = [Candidate(r["category"], r["messages"], r["source"]) for _, r in included]
  family_of = [None] * len(cands)        # None: an included prompt
  generated = {}
  for i, (family, (_, gen)) in enumerate(FAMILIES.items() if num else ()):
    rng = np.random.default_rng([seed, i])
    made = gen(lib, uses, rng, math.ceil(want[family] * OVERSHOOT) + 5)
    made = [made[j] for j in rng.permutation(len(made))]   # the surplus cut falls at random
    generated[family] = len(made)
    cands += made
    family_of += [family] * len(made)
    _log(progress, t0, f"{family}: {len(made)} candidates")

  alive, dropped = _filter(cands, refs, progress, t0)
  records, counts, ids = [], dict.fromkeys(FAMILIES, 0), set()
  surplus = 0
  for k, c in enumerate(cands):
    if not alive[k]:
      continue
    fam = family_of[k]
    if fam is None:
      rid = included[k][1]["id"]
      if rid in ids:
        raise ValueError(f"--include file {included[k][0]}: id {rid!r} is used twice across "
                         "the included files; ids must be unique")
    elif counts[fam] >= want[fam]:
      surplus += 1
      continue
    else:
      counts[fam] += 1
      rid = f"{fam}-{counts[fam]:05d}"
    ids.add(rid)
    records.append(dict(id=rid, category=c.category, messages=c.messages, source=c.source))
  dropped["surplus_over_quota"] = surplus

  data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
  blob = gzip.compress(data, compresslevel=9, mtime=0) if out.endswith(".gz") else data
  short = {f: want[f] - counts[f] for f in FAMILIES if counts[f] < want[f]}
  used_dists = sorted({r["source"].split(" ")[0] for r in records} & set(lib.dists))
  manifest = dict(
      format=FORMAT, file=os.path.basename(out), sha256=hashlib.sha256(blob).hexdigest(),
      bytes=len(blob), seed=seed, num=num,
      command=" ".join(["jspec train prompts", out, f"--num {num}", f"--seed {seed}"]
                       + [f"--exclude {p}" for p in exclude] + [f"--include {p}" for p in include]),
      python=".".join(map(str, sys.version_info[:3])), shares={f: w for f, (w, _) in
                                                               FAMILIES.items()},
      quotas=want, shortfall=short, candidates=generated, included={p: sum(1 for q, _ in
                                                                          included if q == p)
                                                                     for p in include},
      prompts=len(records), dropped=dropped,
      token_estimate=("letter runs + digits + punctuation marks of all messages (common."
                      f"est_tokens; about 0.95x SmolLM2's count); long: >= {LONG_TOKENS}"),
      families=_stats(records),
      packages={d: dict(version=lib.dists[d].version, licence=lib.dists[d].licence)
                for d in used_dists})
  with open(out, "wb") as f:
    f.write(blob)
  with open(manifest_path(out), "w", encoding="utf-8") as f:
    f.write(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
  _log(progress, t0, f"wrote {len(records)} prompts, {len(blob)} bytes to {out}")
  return manifest
