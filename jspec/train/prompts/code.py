"""The code families: `coding` (write a function from a third-party signature + docstring),
`code_explain` (explain given source) and `code_edit` (rewrite given source: copy-heavy replies)."""

from __future__ import annotations

import ast
import re

import numpy as np

from jspec.train.prompts.common import (CC0, LONG_PASSAGE, SHORT_PASSAGE, Candidate, Uses, chance,
                                        est_tokens, fence, pick, split_long, user)
from jspec.train.prompts.passages import trim_doc
from jspec.train.prompts.sources import CodeUnit, Library

LONG_SHARE = {"code_explain": 0.2}       # of the family's prompts (common.LONG_PASSAGE of code)
OTHER_LANGUAGES = ["JavaScript", "TypeScript", "C", "C++", "Rust", "Go", "Java", "C#", "Kotlin",
                   "Swift", "Julia", "Ruby"]

CODING_ASKS = [
    "Write a Python function that matches this specification.",
    "Implement this function in Python.",
    "Can you write the body of this function?",
    "I need an implementation of the following.",
    "Please implement `{name}` according to its docstring.",
    "Fill in the implementation.",
    "Code this up for me in Python.",
    "Write a self-contained Python implementation of `{name}`.",
    "I'm reimplementing part of a library from its documentation. Write this one from scratch.",
    "How would you implement `{name}`? Show the code.",
    "Write `{name}` so that it behaves as documented.",
    "Give me a clean, readable implementation of this.",
    "Implement the function described below. Don't look anything up; work from the spec.",
    "Could you write a version of `{name}` that follows this description?",
    "Write a Python implementation for this API.",
    "Turn this docstring into working code.",
]
CODING_OTHER_ASKS = [
    "Write an equivalent of this Python API in {lang}.",
    "Port this specification to {lang}. Adapt the types to what is idiomatic there.",
    "Implement the following in idiomatic {lang} (the spec is written in Python notation).",
    "How would this function look in {lang}? Write a full implementation.",
]
CODING_EXTRAS = [
    "Include type hints.", "Add a few pytest unit tests.", "Explain the algorithm briefly after "
    "the code.", "Raise clear exceptions for invalid input.", "Avoid third-party dependencies.",
    "Keep it under 40 lines.", "Comment the non-obvious parts.", "State the time complexity.",
    "Show an example call and its output.", "Make it efficient for large inputs.",
    "Don't use {dist}.", "Handle the edge cases the description mentions.",
]

EXPLAIN_ASKS = [
    "Explain what this {kind} does.",
    "Walk me through this code step by step.",
    "What does this do, and when would I use it?",
    "Explain this {kind} to a junior developer.",
    "Give a line-by-line explanation.",
    "What are the inputs and outputs of this {kind}, and does it have side effects?",
    "Explain how this works. Which edge cases does it handle?",
    "I found this in {dist}'s source code. What is it for?",
    "Summarize the logic of this code in plain English.",
    "What is the time and space complexity of this?",
    "Are there any bugs or potential issues in this code?",
    "Describe the control flow of this {kind}.",
    "Explain this code, then suggest one improvement.",
    "Write an explanation of this code suitable for a code review, without rewriting it.",
    "What is the purpose of each parameter here?",
    "Can you help me understand what's going on in this snippet?",
    "Break down what happens when this {kind} is called.",
    "ELI5: what does this code do?",
]
EXPLAIN_LONG_ASKS = [
    "Explain what this {kind} is responsible for and how its parts work together.",
    "Give me an overview of this code: its purpose, its main steps and anything surprising.",
    "I have to maintain this {kind}. Walk me through it section by section.",
    "Read this code and explain it as if writing the design notes for it.",
    "What are the responsibilities of this code, and how could it be tested?",
]
EDIT_FRAMES = [
    "{ask}\n\n{code}",
    "{code}\n\n{ask}",
    "Here's some code from {dist}:\n\n{code}\n\n{ask} Return the full updated code.",
    "Please edit the code below. {ask} Only change what's needed.\n\n{code}",
    "{ask} Show the complete result.\n\n{code}",
    "I'm cleaning up this {kind}.\n\n{code}\n\n{ask}",
    "Refactor request: {ask}\n\n{code}\n\nPlease keep the behaviour identical otherwise.",
]


def _cite(u: CodeUnit, what: str) -> str:
  return f"{u.cite(what)}; request {CC0}"


def _lines(u: CodeUnit) -> int:
  return u.code.count("\n") + 1


def _readable(u: CodeUnit) -> bool:
  """No line over 160 characters: skips embedded data blobs and generated tables."""
  return max(map(len, u.code.splitlines())) <= 160


def _body_size(u: CodeUnit) -> int:
  """Source lines that are not the signature or the docstring."""
  return _lines(u) - u.doc.count("\n") - 2


def _spec_units(lib: Library) -> list[CodeUnit]:
  """Documented functions and methods with a real body whose docstring is a usable spec."""
  return [u for u in lib.code
          if u.kind != "class" and not u.qualname.split(".")[-1].startswith("__")
          and len(u.doc) >= 80 and _body_size(u) >= 3 and len(u.signature) <= 300
          and trim_doc(u.doc, 1400)
          and not re.match(r"(deprecated|alias|see |same as|backward)", u.doc, re.IGNORECASE)]


def _spec(rng: np.random.Generator, u: CodeUnit, doc: str) -> str:
  name = u.qualname.split(".")[-1]
  ind = "\n".join(f"    {ln}" if ln else "" for ln in doc.splitlines())
  where = (f" It is a method of the class `{u.qualname.split('.')[0]}`." if u.kind == "method"
           else "")
  return pick(rng, [
      lambda: f"`{u.signature}`{where}\n\n{doc}",
      lambda: fence(f'def {u.signature}:\n    """{ind.strip()}\n    """\n    ...'),
      lambda: f"Name: {name}\nSignature: {u.signature}\nDescription:\n{doc}",
      lambda: f"Function: `{u.signature}`\n\n{doc}{where}",
      lambda: f"Spec for `{name}` (from the `{u.module}` module of {u.dist.name}):\n\n"
              f"{u.signature}\n\n{doc}",
  ])()


def coding(lib: Library, uses: Uses, rng: np.random.Generator, n: int) -> list[Candidate]:
  out = []
  for u in uses.take(rng, _spec_units(lib), n, key=lambda u: u.key):
    name = u.qualname.split(".")[-1]
    doc = trim_doc(u.doc, 1400)
    spec = _spec(rng, u, doc)
    if chance(rng, 0.15):
      lang = pick(rng, OTHER_LANGUAGES)
      ask = pick(rng, CODING_OTHER_ASKS).format(lang=lang)
    else:
      ask = pick(rng, CODING_ASKS).format(name=name)
    extras = [pick(rng, CODING_EXTRAS).format(dist=u.dist.name)
              for _ in range(int(rng.choice(3, p=[0.5, 0.35, 0.15])))]
    request = " ".join(dict.fromkeys([ask] + extras))
    text = f"{request}\n\n{spec}" if chance(rng, 0.6) else f"{spec}\n\n{request}"
    out.append(Candidate("coding", user(text), _cite(u, "signature and docstring"), u.key,
                         request))
  return out


def code_explain(lib: Library, uses: Uses, rng: np.random.Generator, n: int) -> list[Candidate]:
  n_short, n_long = split_long(n, LONG_SHARE["code_explain"])
  short = [u for u in lib.code if 200 <= len(u.code) <= 3000 and 5 <= _lines(u) <= 80
           and _readable(u) and est_tokens(u.code) <= SHORT_PASSAGE]
  long = [u for u in lib.code if 3000 <= len(u.code) <= 12000 and _readable(u)
          and LONG_PASSAGE[0] <= est_tokens(u.code) <= LONG_PASSAGE[1]]
  out = []
  for units, asks in ((uses.take(rng, short, n_short, key=lambda u: u.key), EXPLAIN_ASKS),
                      (uses.take(rng, long, n_long, key=lambda u: u.key), EXPLAIN_LONG_ASKS)):
    for u in units:
      kind = "function" if u.kind != "class" else "class"
      ask = pick(rng, asks).format(kind=kind, dist=u.dist.name)
      intro = pick(rng, ["", "", f"This is `{u.qualname}` from `{u.module}`.",
                         f"From the {u.dist.name} package:"])
      code = fence(u.code)
      text = pick(rng, [f"{ask}\n\n{code}", f"{code}\n\n{ask}", f"{intro}\n\n{code}\n\n{ask}",
                        f"{ask}\n\n{intro}\n\n{code}"]).strip()
      out.append(Candidate("code_explain", user(text), _cite(u, "source"), u.key,
                           text.replace(code, "")))
  return out


def edit_asks(u: CodeUnit) -> list[str]:
  """Edit instructions that make sense for this code (checked on its AST)."""
  tree = ast.parse(u.code)
  node = tree.body[0]
  asks = ["Add comments explaining each step.", "Reformat it to follow PEP 8 with a maximum "
          "line length of 79.", "Add input validation that raises a ValueError with a helpful "
          "message.", "Add logging with the `logging` module instead of silent failures.",
          "Split it into smaller helper functions where that helps readability."]
  if u.kind == "class":
    asks += ["Convert this class into a dataclass if possible, or explain why not and improve "
             "it otherwise.", "Add type hints to every method.",
             "Add a `__repr__` method that shows the important attributes."]
    return asks
  params = [p for p, _ in u.params if not p.startswith("*")]
  has_hints = node.returns is not None or any(a.annotation is not None for a in ast.walk(node.args)
                                               if isinstance(a, ast.arg))
  asks += ["Convert this function into a small class with a `__call__` method.",
           "Add an optional `verbose=False` parameter that prints progress when it is true.",
           "Make it an async function and adapt the body where needed.",
           "Wrap the body in error handling that re-raises with more context.",
           f"Rename the function to `{u.qualname.split('.')[-1].strip('_')}_v2` and add a "
           f"deprecation shim under the old name."]
  if not has_hints:
    asks.append("Add type hints to all parameters and the return value.")
  asks.append("Rewrite the docstring in Google style." if u.doc else
              "Add a docstring that describes the parameters and the return value.")
  if u.doc:
    asks.append("Remove the docstring and all comments, and nothing else.")
  if params:
    p = params[-1]
    camel = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), p)
    asks.append(f"Rename the parameter `{p}` to `{camel if camel != p else p + '_value'}` "
                f"everywhere it is used.")
  if len(params) >= 2:
    asks.append(f"Make `{params[-1]}` a keyword-only argument.")
  names = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)
                  and isinstance(n.ctx, ast.Store) and len(n.id) <= 2})
  if names:
    asks.append(f"Give the variable `{names[0]}` a more descriptive name.")
  if any(isinstance(n, (ast.For, ast.While)) for n in ast.walk(node)):
    asks.append("Rewrite the loops as comprehensions or builtin calls where it makes the code "
                "clearer.")
  if re.search(r"\.format\(|%\s*\(|\"\s*%\s*\w", u.code):
    asks.append("Replace the old-style string formatting with f-strings.")
  if any(isinstance(n, ast.If) and any(isinstance(c, ast.If) for c in n.body)
         for n in ast.walk(node)):
    asks.append("Reduce the nesting with early returns.")
  if any(isinstance(n, ast.Constant) and isinstance(n.value, (int, float))
         and not isinstance(n.value, bool) and n.value not in (0, 1, -1, 2)
         for n in ast.walk(node)):
    asks.append("Extract the magic numbers into named module-level constants.")
  return asks


def code_edit(lib: Library, uses: Uses, rng: np.random.Generator, n: int) -> list[Candidate]:
  units = [u for u in lib.code if 150 <= len(u.code) <= 3000 and 4 <= _lines(u) <= 70
           and _readable(u) and est_tokens(u.code) <= SHORT_PASSAGE]
  out = []
  for u in uses.take(rng, units, n, key=lambda u: u.key):
    try:
      asks = edit_asks(u)
    except SyntaxError:    # a method indented with tabs and spaces mixed, for example
      continue
    picked = [asks[i] for i in rng.choice(len(asks), size=1 + int(chance(rng, 0.25)),
                                          replace=False)]
    if chance(rng, 0.08):
      picked = [f"Port this code to {pick(rng, OTHER_LANGUAGES)}, keeping its structure."]
    ask = " Also, ".join(a if i == 0 else a[0].lower() + a[1:] for i, a in enumerate(picked))
    code = fence(u.code)
    text = pick(rng, EDIT_FRAMES).format(ask=ask, code=code, dist=u.dist.name,
                                         kind="class" if u.kind == "class" else "function")
    out.append(Candidate("code_edit", user(text), _cite(u, "source"), u.key,
                         text.replace(code, "")))
  return out
