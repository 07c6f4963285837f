"""Third-party text the prompt families quote: functions, classes and docstrings parsed with `ast`
from installed packages (never imported) and prose from their shipped docs and METADATA readmes.

Provenance comes from each distribution's dist-info (RECORD names the files, METADATA the version
and licence). The interpreter's standard library is never read, nor packages that vendor it.
"""

from __future__ import annotations

import ast
import dataclasses
import email.parser
import email.policy
import os
import re
import sysconfig
import textwrap

import numpy as np

# Distributions never used: installers that vendor stdlib code (pip, setuptools with
# _distutils / pkg_resources), stdlib backports or near-copies (typing_extensions, zipp,
# simplejson, uvloop's asyncio, regex's copy of the re docs), a vendored stdlib-copying debugger
# (debugpy/pydevd), this repo, and transformers (its docstrings quote public benchmark data sets).
SKIP_DISTS = frozenset({"pip", "setuptools", "jspec", "debugpy", "typing_extensions", "zipp",
                        "simplejson", "uvloop", "regex", "transformers"})
# Folders that hold test suites, vendored copies of other code (stdlib included) or polyfills.
SKIP_DIRS = frozenset({"test", "tests", "testing", "_testing", "testsuite", "test_utils",
                       "benchmarks", "_vendor", "vendor", "_vendored", "vendored", "third_party",
                       "external", "extern", "externals", "polyfills", "backports",
                       "_distutils", "_distutils_hack", "pkg_resources", "__pycache__"})
SKIP_TOPLEVEL = frozenset({"jspec", "models", "pallas_kernels", "pip", "setuptools",
                           "pkg_resources", "_distutils_hack"})
DOC_SUFFIXES = (".md", ".rst", ".txt")
MAX_FILE_BYTES = 300_000     # larger .py files are generated tables or bundled data
# Passages naming public benchmarks are skipped so that none of their text can leak in.
BENCHMARK_NAMES = re.compile(
    r"gsm8k|gsm-8k|humaneval|human_eval|mbpp|mt[-_ ]bench|spec[-_ ]bench|cnn[_/ ]?daily|xsum|"
    r"\bwmt\d*\b|natural[_ ]questions|\bsquad\b|hellaswag|\bmmlu\b|truthfulqa|alpacaeval",
    re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Dist:
  name: str
  version: str
  licence: str


@dataclasses.dataclass(frozen=True)
class CodeUnit:
  """A function, method or class from a package file."""
  key: str            # "numpy/lib/_npyio_impl.py::loadtxt"
  dist: Dist
  path: str           # relative to its site-packages root
  qualname: str       # "loadtxt", "Class.method" or "Class"
  kind: str           # "function" | "method" | "class"
  signature: str      # "loadtxt(fname, dtype=float, ...)" ("" for a class)
  doc: str            # cleaned docstring ("" if none)
  code: str           # source, decorators included, dedented
  params: tuple[tuple[str, str | None], ...]   # (name, default source or None), self/cls dropped

  @property
  def module(self) -> str:
    return module_name(self.path)

  def cite(self, what: str) -> str:
    return (f"{self.dist.name} {self.dist.version} {self.path}: {self.module}.{self.qualname} "
            f"({what}) ({self.dist.licence})")


@dataclasses.dataclass(frozen=True)
class DocUnit:
  """A passage of prose: a docstring, a chunk of a shipped doc file or of a METADATA readme."""
  key: str
  dist: Dist
  path: str
  title: str          # what the passage is, e.g. "numpy.linalg module docstring"
  text: str

  def cite(self, what: str = "") -> str:
    return (f"{self.dist.name} {self.dist.version} {self.path}: {self.title}"
            f"{f' ({what})' if what else ''} ({self.dist.licence})")


@dataclasses.dataclass
class Library:
  code: list[CodeUnit]
  docs: list[DocUnit]
  dists: dict[str, Dist]          # the distributions that contributed, by name


def default_roots() -> list[str]:
  paths = sysconfig.get_paths()
  return sorted({paths["purelib"], paths["platlib"]})


def stdlib_dir() -> str:
  return os.path.realpath(sysconfig.get_paths()["stdlib"])


def module_name(path: str) -> str:
  m = path[:-3].replace("/", ".") if path.endswith(".py") else path.replace("/", ".")
  return m[:-len(".__init__")] if m.endswith(".__init__") else m


def _inside(path: str, folder: str) -> bool:
  return os.path.commonpath([path, folder]) == folder


def _is_stdlib(path: str, stdlib: str) -> bool:
  """Under the interpreter's stdlib folder but not in one of its site-packages."""
  real = os.path.realpath(path)
  return _inside(real, stdlib) and \
      "site-packages" not in os.path.relpath(real, stdlib).split(os.sep)


def licence(meta) -> str:
  expr = (meta.get("License-Expression") or "").strip()
  if expr:
    return expr
  text = " ".join((meta.get("License") or "").split())
  if text and len(text) <= 40 and not text.lower().startswith(("copyright", "===", "unknown")):
    return text
  for c in meta.get_all("Classifier") or []:
    if c.startswith("License ::"):
      return c.split("::")[-1].strip()
  return "licence not stated"


def _read_dists(root: str) -> list[tuple[Dist, str, list[str], str]]:
  """(dist, its dist-info folder, files listed in RECORD, METADATA body) for every dist-info in
  root, by folder name."""
  out = []
  for entry in sorted(os.listdir(root)):
    if not entry.endswith(".dist-info"):
      continue
    folder = os.path.join(root, entry)
    try:
      with open(os.path.join(folder, "METADATA"), encoding="utf-8") as f:
        meta = email.parser.Parser(policy=email.policy.compat32).parsestr(f.read())
      with open(os.path.join(folder, "RECORD"), encoding="utf-8") as f:
        files = sorted({line.split(",")[0] for line in f if line.strip()})
    except (OSError, UnicodeDecodeError):
      continue
    name = (meta.get("Name") or "").strip()
    if not name:
      continue
    body = meta.get_payload() if isinstance(meta.get_payload(), str) else ""
    body = body or (meta.get("Description") or "")
    dist = Dist(name, (meta.get("Version") or "?").strip(), licence(meta))
    out.append((dist, entry, files, body))
  return out


def _wanted(rel: str) -> bool:
  parts = rel.split("/")
  if rel.startswith("..") or parts[0] in SKIP_TOPLEVEL or parts[0].endswith(".dist-info"):
    return False
  if any(p in SKIP_DIRS for p in parts[:-1]):
    return False
  name = parts[-1]
  if name.endswith(".py"):
    return "test" not in name.lower()      # test_x.py, x_test.py, testing_util.py, conftest.py
  if name.endswith(".txt") and "readme" not in name.lower():
    return False       # grammars, build files, word lists
  return name.endswith(DOC_SUFFIXES) and not re.search(
      r"licen[cs]e|copying|authors|notice|changelog|changes|history|requirements|"
      r"entry_points|top_level|news", name, re.IGNORECASE)


def _signature(node) -> str:
  sig = f"{node.name}({ast.unparse(node.args)})"
  return sig + (f" -> {ast.unparse(node.returns)}" if node.returns is not None else "")


def _params(node) -> tuple[tuple[str, str | None], ...]:
  a = node.args
  positional = a.posonlyargs + a.args
  defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
  out = [(p.arg, d) for p, d in zip(positional, defaults)]
  out += [(p.arg, None if d is None else ast.unparse(d))
          for p, d in zip(a.kwonlyargs, a.kw_defaults)]
  return tuple((n, d) for n, d in out if n not in ("self", "cls"))


def _segment(lines: list[str], node) -> str:
  start = min([node.lineno] + [d.lineno for d in node.decorator_list])
  return textwrap.dedent("\n".join(lines[start - 1:node.end_lineno])).rstrip()


def _units(dist: Dist, rel: str, src: str) -> tuple[list[CodeUnit], list[DocUnit]]:
  try:
    tree = ast.parse(src)
  except (SyntaxError, ValueError):
    return [], []
  lines = src.splitlines()
  code, docs = [], []
  mod = module_name(rel)
  doc = ast.get_docstring(tree)
  if doc:
    docs.append(DocUnit(f"{rel}::", dist, rel, f"{mod} module docstring", doc))

  def add(node, qual: str, kind: str):
    doc = ast.get_docstring(node) or ""
    fn = not isinstance(node, ast.ClassDef)
    code.append(CodeUnit(f"{rel}::{qual}", dist, rel, qual, kind,
                         _signature(node) if fn else "", doc, _segment(lines, node),
                         _params(node) if fn else ()))
    if doc:
      head = f"{_signature(node)}\n\n" if fn else f"class {qual}\n\n"
      docs.append(DocUnit(f"{rel}::{qual}#doc", dist, rel, f"{mod}.{qual} docstring", head + doc))

  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      add(node, node.name, "function")
    elif isinstance(node, ast.ClassDef):
      add(node, node.name, "class")
      for sub in node.body:
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
          add(sub, f"{node.name}.{sub.name}", "method")
  return code, docs


def _doc_chunks(dist: Dist, rel: str, title: str, text: str) -> list[DocUnit]:
  """A readme or doc file -> paragraph-aligned chunks of 600-9000 characters (badges, images and
  raw HTML lines dropped)."""
  keep = [ln for ln in text.splitlines()
          if not re.search(r"!\[|<img|<a |<p |</?div|<picture|<source|^\s*\.\. (image|figure|raw)",
                           ln)]
  paras = [p.strip() for p in re.split(r"\n\s*\n", "\n".join(keep)) if p.strip()]
  out, cur = [], ""
  for p in paras:
    if cur and len(cur) + len(p) > 9000:
      out.append(cur)
      cur = ""
    cur = f"{cur}\n\n{p}" if cur else p
    if len(cur) >= 4500 and re.match(r"#|\S+\n[=\-~^]{3,}", p) is None:
      out.append(cur)
      cur = ""
  out.append(cur)
  return [DocUnit(f"{rel}#{i}", dist, rel, title, c) for i, c in enumerate(out) if len(c) >= 600]


def scan(roots: list[str], *, seed: int, budget: int = 600_000) -> Library:
  """Reads up to `budget` bytes of .py files per distribution (a seeded choice of files, so big
  packages do not crowd out small ones), all their doc files and METADATA readmes. Raises
  ValueError if a root is missing or is the standard library."""
  stdlib = stdlib_dir()
  code: list[CodeUnit] = []
  docs: list[DocUnit] = []
  used: dict[str, Dist] = {}
  for root in roots:
    if not os.path.isdir(root):
      raise ValueError(f"package folder {root} does not exist")
    if _is_stdlib(root, stdlib) or _inside(stdlib, os.path.realpath(root)):
      raise ValueError(f"{root} holds the Python standard library, which must not be used; "
                       "give a site-packages folder")
    for dist, info, files, readme in _read_dists(root):
      if dist.name.lower().replace("-", "_") in SKIP_DISTS:
        continue
      files = [f for f in files if _wanted(f) and os.path.isfile(os.path.join(root, f))
               and not _is_stdlib(os.path.join(root, f), stdlib)]
      py = [f for f in files if f.endswith(".py")]
      rng = np.random.default_rng([seed, *dist.name.encode()])
      taken = 0
      units_before = len(code) + len(docs)
      for i in rng.permutation(len(py)):
        if taken >= budget:
          break
        path = os.path.join(root, py[i])
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
          continue
        with open(path, encoding="utf-8", errors="replace") as f:
          src = f.read()
        if re.search(r"generated by|do not edit", src[:1000], re.IGNORECASE):
          continue
        taken += size
        c, d = _units(dist, py[i], src)
        code += c
        docs += d
      for rel in (f for f in files if f.endswith(DOC_SUFFIXES)):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
          docs += _doc_chunks(dist, rel, f"{dist.name} documentation file {rel}", f.read())
      docs += _doc_chunks(dist, f"{info}/METADATA",
                          f"{dist.name} project description (METADATA)", readme)
      if len(code) + len(docs) > units_before:
        used[dist.name] = dist
  docs = [d for d in docs if not BENCHMARK_NAMES.search(d.text)]
  code = [c for c in code if not BENCHMARK_NAMES.search(c.code)]
  return Library(code, docs, used)
