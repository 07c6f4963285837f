"""Passages quoted by the document families, cut to length bounds: single docstrings and readme
chunks, and "API pages" (a file's consecutive signatures + docstrings); plus the docstring
sections (parameters, returns, raises) the question and extraction templates ask about."""

from __future__ import annotations

import dataclasses
import re
import textwrap

from jspec.train.prompts.sources import CodeUnit, Library

# Docstring sections that hold examples or cross references: dropped when a docstring is cut.
_TAIL_SECTIONS = re.compile(r"\n(Examples?|See Also|References|Notes)\n-{3,}\n", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Passage:
  key: str
  text: str
  source: str                    # citation (package, version, file, what, licence)
  title: str                     # e.g. "the docstring of `numpy.linalg.norm`"
  units: tuple[CodeUnit, ...]    # the documented functions/classes (empty for prose)


def trim_doc(doc: str, limit: int) -> str:
  """`doc` without its examples/references tail if that makes it fit, cut at a paragraph boundary
  to at most `limit` characters ("" if even the first paragraph is longer)."""
  if len(doc) > limit:
    m = _TAIL_SECTIONS.search(doc)
    if m:
      doc = doc[:m.start()].rstrip()
  if len(doc) <= limit:
    return doc
  out = ""
  for para in doc.split("\n\n"):
    nxt = f"{out}\n\n{para}" if out else para
    if len(nxt) > limit:
      break
    out = nxt
  return out


def _unit_doc(u: CodeUnit, limit: int) -> str:
  doc = trim_doc(u.doc, limit)
  head = f"def {u.signature}" if u.signature else f"class {u.qualname}"
  return f"{head}\n{textwrap.indent(doc, '    ')}" if doc else ""


def doc_passages(lib: Library, lo: int, hi: int) -> list[Passage]:
  """Docstrings and doc/readme chunks of lo..hi characters (longer docstrings are trimmed)."""
  units = {u.key: u for u in lib.code}
  out = []
  for d in lib.docs:
    text = trim_doc(d.text, hi) if "::" in d.key else d.text
    if not lo <= len(text) <= hi:
      continue
    unit = units.get(d.key[:-len("#doc")]) if d.key.endswith("#doc") else None
    name = d.title.removesuffix(" docstring")
    title = (f"the docstring of `{name}`" if d.key.endswith("#doc") else
             f"the module docstring of `{name.removesuffix(' module')}`" if "::" in d.key else
             f"part of the {d.dist.name} documentation")
    # a function's docstring shares its key (and so its quota) with the function itself
    out.append(Passage(d.key.removesuffix("#doc"), text, d.cite(), title,
                       (unit,) if unit else ()))
  return out


def api_pages(lib: Library, lo: int, hi: int, per_doc: int = 1500) -> list[Passage]:
  """Runs of consecutive documented functions/classes of one file whose signatures + docstrings
  (each cut to per_doc characters) add up to lo..hi characters."""
  by_file: dict[str, list[CodeUnit]] = {}
  for u in lib.code:
    if len(u.doc) >= 80 and not u.qualname.startswith("_"):
      by_file.setdefault(u.path, []).append(u)
  out = []
  for path, units in by_file.items():
    run: list[tuple[CodeUnit, str]] = []
    size = 0
    for u in units:
      block = _unit_doc(u, per_doc)
      if not block:
        continue
      run.append((u, block))
      size += len(block) + 2
      if size >= lo:
        if size <= hi and len(run) >= 2:
          first = run[0][0]
          text = "\n\n".join(b for _, b in run)
          names = ", ".join(f"{x.qualname}" for x, _ in run)
          out.append(Passage(f"{path}::{first.qualname}+{len(run)}", text,
                             first.cite(f"API documentation of {names}"),
                             f"the API documentation of `{first.module}`",
                             tuple(x for x, _ in run)))
        run, size = [], 0
  return out


def _section(doc: str, names: str) -> str:
  """The body of a numpydoc ("Name\\n----") or Google ("Name:") section, or ""."""
  m = re.search(rf"^\s*(?:{names})\s*\n\s*-{{3,}}\s*\n(.*?)(?=\n\s*\n\s*\w[\w ]*\n\s*-{{3,}}|\Z)",
                doc, re.MULTILINE | re.DOTALL)
  if m:
    return m.group(1)
  m = re.search(rf"^(\s*)(?:{names}):\s*\n(.*?)(?=\n\1\S|\Z)", doc, re.MULTILINE | re.DOTALL)
  return m.group(2) if m else ""


def doc_params(doc: str) -> list[tuple[str, str]]:
  """(name, description) of the parameters a docstring documents, in order: numpydoc
  ("x : int" + indented lines), Google ("x (int): text") or Sphinx (":param x: text")."""
  out = []
  lines = textwrap.dedent(_section(doc, "Parameters|Args|Arguments|Other Parameters")).splitlines()
  for i, line in enumerate(lines):
    m = re.match(r"^(\*{0,2}[A-Za-z_]\w*)(\s*\([^)]*\))?(\s*):(.*)$", line)
    if not m:
      continue
    more = []
    for nxt in lines[i + 1:]:
      if nxt and not nxt[0].isspace():
        break
      more.append(nxt.strip())
    numpydoc = m.group(3) != "" and not m.group(2)
    desc = " ".join(more if numpydoc else [m.group(4).strip()] + more)
    out.append((m.group(1), " ".join(desc.split())))
  for m in re.finditer(r"^\s*:param\s+(?:[\w\[\], ]+\s+)?(\w+):\s*(.*)$", doc, re.MULTILINE):
    out.append((m.group(1), m.group(2).strip()))
  return [(n, d[:300]) for n, d in out if d][:30]


def doc_returns(doc: str) -> str:
  body = _section(doc, "Returns|Return|Yields")
  if body:
    return " ".join(body.split())[:400]
  m = re.search(r"^\s*:returns?:\s*(.*)$", doc, re.MULTILINE)
  return m.group(1).strip() if m else ""


def doc_raises(doc: str) -> list[str]:
  body = _section(doc, "Raises")
  names = re.findall(r"^\s*(\w+(?:Error|Exception|Warning|Exit|Interrupt))\b", body, re.MULTILINE)
  names += re.findall(r":raises?\s+(\w+):", doc)
  return list(dict.fromkeys(names))


_SPHINX_ROLE = re.compile(r":(?:py:)?[a-z]+:`~?([^`]+)`")


def prose_paragraphs(lib: Library, lo: int = 200, hi: int = 1300) -> list[Passage]:
  """Paragraphs of plain prose (no code, lists, tables or markup blocks) from docstrings and doc
  files, Sphinx roles reduced to their target (":func:`x`" -> "`x`")."""
  out = []
  for d in lib.docs:
    for i, para in enumerate(re.split(r"\n\s*\n", d.text)):
      lines = para.strip("\n").splitlines()
      if any(ln[:1].isspace() for ln in lines[1:]) or any(
          re.match(r"\s*([-*+]|\d+[.)]|\w+\s*(\([^)]*\))?\s*:)\s", ln) for ln in lines):
        continue       # an indented block, a list or an "Args:"-style entry, not prose
      para = _SPHINX_ROLE.sub(r"`\1`", " ".join(para.split()))
      words = para.split()
      if not (lo <= len(para) <= hi and len(words) >= 30 and para[0].isupper()
              and para[-1] in ".!?" and para.count(". ") >= 1):
        continue
      if re.search(r">>>|```|::|\||==|\{|\}|\\|^\W|\[\d+\]|https?://|<\w+|\w\(.*\)\s*$|@", para):
        continue
      alpha = sum(w.strip(".,;:()`'\"").isalpha() for w in words) / len(words)
      if alpha >= 0.85:
        out.append(Passage(f"{d.key}#p{i}", para, d.cite("paragraph"), d.title, ()))
  return out


def sentences(text: str) -> list[str]:
  return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`])", text) if s]
