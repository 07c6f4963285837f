"""Builds the benchmark prompt suite (suite.jsonl) and the drafter-training corpus (train.jsonl).

    python benchmarks/prompts/build.py [--gguf PATH] [--check]

Deterministic: the text comes from this interpreter's CPython standard library (read as files and
parsed with `ast`, never imported), from the Python Language Reference text that CPython ships in
Lib/pydoc_data/topics.py, and from prompts written by hand for jspec (handwritten.py, CC0). Token
counts use the SmolLM2 tokenizer rebuilt from the GGUF's metadata, on the chat-templated prompt.

Disjointness: every prompt records its source units (a stdlib file such as "Lib/textwrap.py", a
reference section such as 'topics:The "while" statement', or a hand-written item). A unit used by
any suite prompt is never used by train; the script asserts this on the records it writes, and
asserts that no user message occurs in both files. See README.md.

--check rebuilds in memory and fails if suite.jsonl, train.jsonl or README.md's stats differ.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import statistics
import sys
import sysconfig
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

import handwritten as hw  # noqa: E402

CATEGORIES = ["coding", "code_editing", "summarization", "rag_qa", "math", "writing",
              "multi_turn", "long_input"]
TRAIN_CATEGORIES = CATEGORIES + ["general"]
PER_CATEGORY = 16
LONG_MIN, LONG_MAX = 2000, 3000     # long_input prompt length, tokens (chat-templated)
SHORT_MAX = 700                     # every other prompt
TRAIN_TARGETS = {"coding": 80, "code_editing": 90, "summarization": 60, "rag_qa": 70,
                 "math": 30, "writing": 30, "multi_turn": 40, "long_input": 20, "general": 40}

PY = "cpython %d.%d.%d" % sys.version_info[:3]
PSF = "(PSF-2.0)"
CC0 = "written for jspec (CC0)"

# Directories of the stdlib that are not prose/code a user would paste (or are huge test suites).
SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "__pycache__", "lib2to3", "tkinter",
             "turtledemo", "ensurepip", "distutils", "lib-dynload", "encodings", "pydoc_data",
             "unittest", "ctypes", "msilib", "venv"}


# ------------------------------------------------------------------------------------------------
# Stdlib access

class Stdlib:

  def __init__(self, root: str):
    self.root = root
    self._cache: dict[str, tuple[str, ast.Module]] = {}

  def files(self) -> list[str]:
    out = []
    for dirpath, dirs, fs in os.walk(self.root):
      dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("config-"))
      for f in sorted(fs):
        if f.endswith(".py"):
          out.append(os.path.relpath(os.path.join(dirpath, f), self.root).replace(os.sep, "/"))
    return sorted(out)

  def parse(self, rel: str) -> tuple[str, ast.Module]:
    if rel not in self._cache:
      with open(os.path.join(self.root, rel), encoding="utf-8") as f:
        src = f.read()
      self._cache[rel] = (src, ast.parse(src))
    return self._cache[rel]

  def node(self, rel: str, qualname: str):
    _, tree = self.parse(rel)
    body, node = tree.body, None
    for part in qualname.split("."):
      node = next(n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                  and n.name == part)
      body = node.body
    return node

  def segment(self, rel: str, node) -> str:
    """The node's source lines (decorators included), dedented."""
    src, _ = self.parse(rel)
    lines = src.splitlines()
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return textwrap.dedent("\n".join(lines[start - 1:node.end_lineno])).rstrip()

  def code(self, rel: str, qualname: str) -> str:
    return self.segment(rel, self.node(rel, qualname))


def modname(rel: str) -> str:
  m = rel[:-3].replace("/", ".")
  return m[:-len(".__init__")] if m.endswith(".__init__") else m


def lib_source(rel: str, what: str, extra: str = "") -> str:
  s = f"{PY} Lib/{rel} {PSF}: {what}"
  return s + (f"; {extra}" if extra else "")


def topic_source(heading: str, extra: str = "") -> str:
  s = f"{PY} Lib/pydoc_data/topics.py {PSF}, Python Language Reference section [{heading}]"
  return s + (f"; {extra}" if extra else "")


def source_units(source: str) -> set[str]:
  """The disjointness units a source string names (derived from the written text itself)."""
  units = set()
  for m in re.finditer(r"Lib/([\w/.]+\.py)", source):
    if m.group(1) != "pydoc_data/topics.py":
      units.add("Lib/" + m.group(1))
  for m in re.finditer(r"Language Reference section \[(.+?)\]", source):
    units.add("topics:" + m.group(1))
  return units


def stable_order(keys, salt: str):
  return sorted(keys, key=lambda k: hashlib.sha256(f"{salt}|{k}".encode()).hexdigest())


def pick(seq, key: str):
  """Deterministic choice from seq keyed by a string."""
  return seq[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(seq)]


def fence(code: str, lang: str = "python") -> str:
  return f"```{lang}\n{code}\n```"


# ------------------------------------------------------------------------------------------------
# Python Language Reference sections (Lib/pydoc_data/topics.py)

def reference_sections(lib: Stdlib) -> dict[str, str]:
  """heading -> body, first occurrence over topics in sorted order (topics repeat sections)."""
  src, tree = lib.parse("pydoc_data/topics.py")
  topics = None
  for node in tree.body:
    if isinstance(node, ast.Assign) and node.targets[0].id == "topics":
      topics = ast.literal_eval(node.value)
  out: dict[str, str] = {}
  for key in sorted(topics):
    lines = topics[key].split("\n")
    heads = [i for i in range(len(lines) - 1)
             if lines[i].strip() and re.fullmatch(r"[=*\-~^]{3,}", lines[i + 1])
             and len(lines[i + 1]) >= len(lines[i].rstrip()) - 1]
    for a, b in zip(heads, heads[1:] + [len(lines)]):
      heading = lines[a].strip()
      body = "\n".join(lines[a + 2:b]).strip()
      if heading not in out and len(body) >= 250:
        out[heading] = body
  return out


def chunks(body: str, limit: int = 2100) -> list[str]:
  """Split a section body at paragraph boundaries into pieces of at most `limit` characters."""
  paras = [p for p in body.split("\n\n") if p.strip()]
  out, cur = [], ""
  for p in paras:
    if cur and len(cur) + 2 + len(p) > limit:
      out.append(cur)
      cur = p
    else:
      cur = f"{cur}\n\n{p}" if cur else p
  if cur:
    if out and len(cur) < 300:
      out[-1] = out[-1] + "\n\n" + cur
    else:
      out.append(cur)
  return [c for c in out if 300 <= len(c) <= limit + 300]


def passage(heading: str, body: str) -> str:
  return f"{heading}\n\n{body}"


# ------------------------------------------------------------------------------------------------
# Prompt framings shared by suite and train

def coding_prompt(style: int, mod: str, name: str, sig: str, doc: str) -> str:
  doc_ind = textwrap.indent(doc, "    ")
  styles = [
      lambda: f"Write a Python function `{sig}`.\n\n{doc}",
      lambda: "Implement the following function in Python:\n\n"
              + fence(f'def {sig}:\n    """{doc_ind.strip()}\n    """\n    ...'),
      lambda: f"I need a Python function called `{name}` with the signature `{sig}`. Here's what "
              f"it should do:\n\n{doc}",
      lambda: f"Can you write `{sig}` in Python? The spec:\n\n{doc}\n\nPlease include a short "
              f"example of using it.",
      lambda: f"Write a Python implementation of `{name}` from scratch, without importing "
              f"`{mod}`. Requirements:\n\n{doc}",
      lambda: f"Please code this up in Python, with comments explaining the tricky parts.\n\n"
              f"Function: {sig}\nDescription: {doc}",
      lambda: f"{doc}\n\nWrite a function `{sig}` in Python that does this, and explain your "
              f"approach in two or three sentences.",
      lambda: "Here's a docstring without an implementation. Write the body.\n\n"
              + fence(f'def {sig}:\n    """{doc_ind.strip()}\n    """'),
  ]
  return styles[style % len(styles)]()


def edit_prompt(style: int, code: str, instruction: str, where: str) -> str:
  styles = [
      lambda: f"{instruction}\n\n{fence(code)}",
      lambda: f"{fence(code)}\n\n{instruction}",
      lambda: f"Here's a function from {where}.\n\n{fence(code)}\n\n{instruction} Return the "
              f"complete updated code.",
      lambda: f"{instruction} Show the full rewritten code.\n\n{fence(code)}",
  ]
  return styles[style % len(styles)]()


def summary_prompt(style: int, text: str) -> str:
  styles = [
      lambda: f"Summarize the following documentation in three bullet points.\n\n{text}",
      lambda: f"Give me a short summary (two or three sentences) of this passage for someone "
              f"new to Python:\n\n{text}",
      lambda: f"{text}\n\nTL;DR?",
      lambda: f"Read this excerpt from the Python docs and summarize the key rules it "
              f"describes.\n\n\"\"\"\n{text}\n\"\"\"",
      lambda: f"Explain the main points of this text in plain language:\n\n{text}",
      lambda: f"Write a concise summary of the text below in no more than 60 words.\n\n---\n"
              f"{text}\n---",
      lambda: f"{text}\n\nCan you summarize this for me? Keep it brief.",
      lambda: f"I don't have time to read all of this. What are the two or three most important "
              f"things it says?\n\n{text}",
  ]
  return styles[style % len(styles)]()


RAG_SYSTEM = ("Answer the question using only the information in the provided context. If the "
              "context does not contain the answer, say so.")


def rag_messages(style: int, context: str, question: str) -> list[dict]:
  styles = [
      lambda: [("user", f"Context:\n{context}\n\nQuestion: {question}")],
      lambda: [("user", f"Use the documentation below to answer my question.\n\n---\n{context}\n"
                        f"---\n\n{question}")],
      lambda: [("user", f"{question}\n\nAnswer based on this excerpt:\n\n{context}")],
      lambda: [("system", RAG_SYSTEM),
               ("user", f"Context:\n\"\"\"\n{context}\n\"\"\"\n\nQuestion: {question}")],
  ]
  return msgs(styles[style % len(styles)]())


def msgs(pairs) -> list[dict]:
  return [{"role": r, "content": c} for r, c in pairs]


def rec(category: str, messages: list[dict], source: str) -> dict:
  return {"category": category, "messages": messages, "source": source}


# ------------------------------------------------------------------------------------------------
# Suite: hand-picked sources, hand-written instructions and questions

SUITE_CODING = [  # (file, function) whose signature + docstring is the spec
    ("textwrap.py", "dedent"), ("difflib.py", "get_close_matches"), ("heapq.py", "nlargest"),
    ("bisect.py", "bisect_left"), ("genericpath.py", "commonprefix"),
    ("statistics.py", "median"), ("string.py", "capwords"), ("html/__init__.py", "escape"),
    ("calendar.py", "leapdays"), ("secrets.py", "token_hex"), ("ntpath.py", "splitdrive"),
    ("fnmatch.py", "fnmatch"), ("posixpath.py", "commonpath"), ("operator.py", "length_hint"),
    ("urllib/parse.py", "urldefrag"), ("inspect.py", "cleandoc"),
]

SUITE_EDITING = [  # (file, qualname, instruction written for jspec)
    ("colorsys.py", "rgb_to_hls",
     "Add type hints and a docstring that explains the input and output ranges (all values are "
     "floats between 0 and 1). Keep the logic exactly the same."),
    ("getpass.py", "getuser",
     "Change this so it returns None instead of raising when no username can be found. The pwd "
     "lookup can raise ImportError or KeyError on some systems."),
    ("os.py", "makedirs",
     "Add a `verbose=False` keyword argument. When it is true, print each directory as it gets "
     "created. Make sure the recursive call passes it along."),
    ("filecmp.py", "cmp",
     "Rename `s1` and `s2` to `sig1` and `sig2`, and move the cache size limit (100) into a "
     "module-level constant called `_MAX_CACHE_SIZE`."),
    ("tarfile.py", "nti",
     "Rewrite the loop that decodes the base-256 encoding so it uses `int.from_bytes` instead. The "
     "behaviour must stay the same."),
    ("zipfile.py", "is_zipfile",
     "Add type hints (it accepts a path or a binary file object) and log the OSError at debug "
     "level with the `logging` module instead of silently ignoring it."),
    ("ftplib.py", "parse227",
     "Remove the lazily compiled global regex: compile it once at module level instead and "
     "simplify the function accordingly."),
    ("dis.py", "pretty_flags",
     "Rewrite this without the for/else construct so it is easier for beginners to read. The "
     "output must stay identical."),
    ("webbrowser.py", "register",
     "Add a docstring that describes every parameter, and raise a ValueError if `name` is an "
     "empty string."),
    ("shutil.py", "copyfileobj",
     "Make this function return the total number of bytes copied."),
    ("random.py", "Random.shuffle",
     "Turn this method into a standalone function `shuffle(x, rng=None)` that uses "
     "`random.randrange` when no rng object is given."),
    ("tempfile.py", "_candidate_tempdir_list",
     "Refactor this: move the OS-specific default directories into a separate helper function "
     "`_platform_tempdirs()` and call it from here."),
    ("shlex.py", "quote",
     "Add doctest examples to the docstring covering the empty string, a safe word, and a string "
     "that contains a single quote."),
    ("logging/__init__.py", "getLevelName",
     "Replace the %-formatting with an f-string and add type hints. `level` can be an int or a "
     "str."),
    ("http/server.py", "SimpleHTTPRequestHandler.translate_path",
     "Rewrite this method to use `pathlib.PurePosixPath` for splitting and filtering the path "
     "components. Keep the same handling of query strings, fragments and the trailing slash."),
    ("urllib/request.py", "parse_keqv_list",
     "Fix the bug where an empty value such as 'a=' crashes with an IndexError, and strip "
     "whitespace around the keys."),
]

SUITE_SUMMARY_SECTIONS = [
    'The "global" statement', 'The "for" statement', "Integer literals", "Boolean operations",
    '"finally" clause', "With Statement Context Managers", "Tuples", "Immutable sequences",
]
SUITE_SUMMARY_MODULES = ["copy.py", "sched.py", "timeit.py", "shelve.py", "pyclbr.py", "cmd.py",
                         "uuid.py", "plistlib.py"]

SUITE_RAG = [  # (reference section, question written for jspec)
    ('The "assert" statement',
     "What does Python do with assert statements when optimization is requested with -O?"),
    ("Truth Value Testing", "Which built-in values are considered false?"),
    ('The "while" statement',
     "When does the else block of a while loop run, and what makes Python skip it?"),
    ('The "break" statement',
     "If I break out of a loop from inside a try block that has a finally clause, does the "
     "finally clause still run?"),
    ('The "del" statement', "What happens if I try to del a name that isn't bound?"),
    ('The "nonlocal" statement',
     "How is nonlocal different from global when the variable doesn't exist yet?"),
    ('The "return" statement',
     "What happens when a generator function reaches a return statement with a value?"),
    ("Lambdas", "Can a lambda contain statements or annotations? What is a lambda equivalent to?"),
    ("Shifting operations",
     "How is a right shift by n bits defined? Using that definition, what is 20 >> 2?"),
    ("The power operator", "Why does -1**2 give -1, and what type does 10**-2 return?"),
    ("Floating point literals", "Is 077e010 a valid float literal, and what number is it?"),
    ('The "yield" statement', "What makes a function a generator function, according to this?"),
    ("Imaginary literals",
     "How do I write a complex number with a nonzero real part using literals?"),
    ("Dictionary displays",
     "If the same key appears twice in a dict display, which value ends up in the dictionary?"),
    ("Unary arithmetic and bitwise operations",
     "What is ~x equal to for an integer x, and what happens if I apply ~ to a float?"),
    ("Soft Keywords",
     "Which identifiers are soft keywords, and why can I still use them as variable names?"),
]

SUITE_LONG = [  # (file, request written for jspec)
    ("graphlib.py", "Explain how TopologicalSorter detects cycles, and what get_ready() and done() "
                    "are for when processing nodes in parallel."),
    ("zipapp.py", "Explain how create_archive() builds an executable zip archive, including the "
                  "shebang line and the generated __main__.py."),
    ("quopri.py", "Walk me through how encode() decides which characters need to be quoted. Then "
                  "show a short example of using it."),
    ("hmac.py", "Explain how the HMAC class computes a digest, including the inner and outer "
                "padding, and when it uses the OpenSSL fast path instead."),
    ("glob.py", "What is the difference between glob() and iglob(), and how is the '**' pattern "
                "handled when recursive=True?"),
    ("queue.py", "Explain how Queue.put() works when block=True and a timeout is given, including "
                 "which condition variables are involved."),
    ("numbers.py", "Summarize the numeric tower defined here and list the abstract methods that a "
                   "concrete subclass of Real has to implement."),
    ("filecmp.py", "Write a short tutorial, based on this code, showing how to use dircmp to "
                   "compare two directories and report the differences."),
    ("bz2.py", "Explain the difference between BZ2File, open(), and compress()/decompress() in "
               "this module, and when I would use each."),
    ("code.py", "How does InteractiveConsole decide whether it needs more input before running "
                "what was typed? Explain push() and runsource()."),
    ("symtable.py", "What does this module do? Give an example of using symtable() to list the "
                    "local variables of a function."),
    ("types.py", "How does new_class() differ from a normal class statement? Explain what "
                 "resolve_bases() and prepare_class() do."),
    ("string.py", "Explain how Template.substitute() and safe_substitute() differ, and how the "
                  "regular expression for placeholders is built."),
    ("stat.py", "Explain how filemode() builds its output string, using the mode of a regular "
                "file with permissions 644 as an example."),
    ("mailcap.py", "Find any potential security issues in this module and explain how the code "
                   "tries to guard against them."),
    ("pipes.py", "What is a Template in this module, and how does it turn a list of steps into a "
                 "shell command? Give a short usage example."),
]

# Conversation code placeholders: {code:FILE:QUALNAME}
CODE_REF = re.compile(r"\{code:([\w/.]+\.py):([\w.]+)\}")


def fill_code(text: str, lib: Stdlib, used: list[str]) -> str:
  def sub(m):
    used.append(f"Lib/{m.group(1)}: {modname(m.group(1))}.{m.group(2)}")
    return lib.code(m.group(1), m.group(2))
  return CODE_REF.sub(sub, text)


def conversation(turns, lib: Stdlib) -> tuple[list[dict], str]:
  used: list[str] = []
  messages = msgs([(r, fill_code(t, lib, used)) for r, t in turns])
  if used:
    source = f"{PY} " + ", ".join(f"{u} (source)" for u in used) + f" {PSF}; conversation {CC0}"
  else:
    source = f"conversation {CC0}"
  return messages, source


def long_prompt(style: int, rel: str, code: str, request: str, truncated: bool) -> str:
  what = (f"the beginning of `Lib/{rel}` (truncated)" if truncated
          else f"the module `Lib/{rel}`")
  styles = [
      lambda: f"Here is {what} from the CPython standard library:\n\n{fence(code)}\n\n{request}",
      lambda: f"{request}\n\n{fence(code)}",
      lambda: f"I'm reading {what} from CPython and have a question.\n\n{fence(code)}\n\n"
              f"{request}",
  ]
  return styles[style % len(styles)]()


def fit_long(lib: Stdlib, rel: str, request: str, style: int, count) -> tuple[list[dict], bool]:
  """Messages with the longest prefix of the module (cut between top-level blocks or defs) whose
  chat-templated length is within [LONG_MIN, LONG_MAX]; None if the module is too short."""
  src, tree = lib.parse(rel)
  lines = src.rstrip().splitlines()
  full = "\n".join(lines)
  m = msgs([("user", long_prompt(style, rel, full, request, False))])
  n = count(m)
  if LONG_MIN <= n <= LONG_MAX:
    return m, False
  if n < LONG_MIN:
    return None, False
  cuts = sorted({node.end_lineno for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                 or node in tree.body})
  best = None
  lo, hi = 0, len(cuts) - 1
  while lo <= hi:   # largest cut that fits; length is monotone in the cut
    mid = (lo + hi) // 2
    code = "\n".join(lines[:cuts[mid]]).rstrip()
    m = msgs([("user", long_prompt(style, rel, code, request, True))])
    n = count(m)
    if n <= LONG_MAX:
      best, lo = (m, n), mid + 1
    else:
      hi = mid - 1
  if best is None or best[1] < LONG_MIN:
    return None, True
  return best[0], True


def build_suite(lib: Stdlib, sections: dict[str, str], count) -> list[dict]:
  out: list[dict] = []
  for i, (rel, fn) in enumerate(SUITE_CODING):
    node = lib.node(rel, fn)
    sig = f"{fn}({ast.unparse(node.args)})"
    doc = spec_doc(fn, ast.get_docstring(node))
    out.append(rec("coding", msgs([("user", coding_prompt(i, modname(rel), fn, sig, doc))]),
                   lib_source(rel, f"{modname(rel)}.{fn} (signature and docstring)",
                              f"request {CC0}")))
  for i, (rel, qual, instr) in enumerate(SUITE_EDITING):
    code = lib.code(rel, qual)
    out.append(rec("code_editing",
                   msgs([("user", edit_prompt(i, code, instr, f"Python's `{modname(rel)}` "
                                                              f"module"))]),
                   lib_source(rel, f"{modname(rel)}.{qual} (source)", f"instruction {CC0}")))
  for i, heading in enumerate(SUITE_SUMMARY_SECTIONS):
    text = passage(heading, sections[heading])
    out.append(rec("summarization", msgs([("user", summary_prompt(i, text))]),
                   topic_source(heading, f"request {CC0}")))
  for i, rel in enumerate(SUITE_SUMMARY_MODULES):
    doc = module_doc_excerpt(lib, rel)
    out.append(rec("summarization",
                   msgs([("user", summary_prompt(i + 3, f"From the documentation of Python's "
                                                        f"`{modname(rel)}` module:\n\n{doc}"))]),
                   lib_source(rel, f"{modname(rel)} module docstring", f"request {CC0}")))
  for i, (heading, q) in enumerate(SUITE_RAG):
    out.append(rec("rag_qa", rag_messages(i, passage(heading, sections[heading]), q),
                   topic_source(heading, f"question {CC0}")))
  for i, text in enumerate(hw.SUITE_MATH):
    out.append(rec("math", msgs([("user", text)]), f"word problem {CC0}"))
  for i, text in enumerate(hw.SUITE_WRITING):
    out.append(rec("writing", msgs([("user", text)]), f"prompt {CC0}"))
  for turns in hw.SUITE_MULTI_TURN:
    m, source = conversation(turns, lib)
    out.append(rec("multi_turn", m, source))
  for i, (rel, request) in enumerate(SUITE_LONG):
    m, truncated = fit_long(lib, rel, request, i, count)
    assert m is not None, f"suite long_input {rel} does not fit [{LONG_MIN}, {LONG_MAX}] tokens"
    part = "leading part of the module source" if truncated else "module source"
    out.append(rec("long_input", m, lib_source(rel, part, f"request {CC0}")))
  return number(out, 2)


def spec_doc(fn: str, doc: str) -> str:
  """Docstring as a spec: drops an old-style "f(a [,b]) -> x" signature line."""
  if doc.lstrip().startswith(fn + "("):
    return doc.split("\n", 1)[1].strip() if "\n" in doc else ""
  return doc


def module_doc(lib: Stdlib, rel: str) -> str:
  try:
    return ast.get_docstring(lib.parse(rel)[1]) or ""
  except (SyntaxError, UnicodeDecodeError):
    return ""


def module_doc_excerpt(lib: Stdlib, rel: str, limit: int = 1500) -> str:
  doc = module_doc(lib, rel)
  paras = [p.strip("\n") for p in doc.split("\n\n") if p.strip()]
  out = ""
  for p in paras:
    if out and len(out) + 2 + len(p) > limit:
      break
    out = f"{out}\n\n{p}" if out else p
  return out[:limit * 2]


def number(records: list[dict], width: int) -> list[dict]:
  counts: dict[str, int] = {}
  out = []
  for r in records:
    counts[r["category"]] = counts.get(r["category"], 0) + 1
    out.append({"id": f"{r['category']}-{counts[r['category']]:0{width}d}", **r})
  return out


# ------------------------------------------------------------------------------------------------
# Train: the rest of the stdlib and the reference, minus every unit the suite uses

VERBS = {"Return": "returns", "Returns": "returns", "Get": "gets", "Convert": "converts",
         "Create": "creates", "Compute": "computes", "Check": "checks", "Test": "tests",
         "Parse": "parses", "Read": "reads", "Write": "writes", "Find": "finds",
         "Remove": "removes", "Make": "makes", "Build": "builds", "Split": "splits",
         "Encode": "encodes", "Decode": "decodes", "Format": "formats", "Generate": "generates",
         "Copy": "copies", "Add": "adds", "Set": "sets", "Open": "opens",
         "Determine": "determines", "Print": "prints", "Translate": "translates",
         "Replace": "replaces", "Compare": "compares", "Extract": "extracts",
         "Construct": "constructs", "Produce": "produces", "Search": "searches",
         "Decorator": None, "Load": "loads", "Normalize": "normalizes", "Quote": "quotes",
         "Unquote": "unquotes", "Join": "joins", "Install": "installs", "Run": "runs",
         "Call": "calls", "Apply": "applies", "Wrap": "wraps", "Collect": "collects",
         "Calculate": "calculates", "Look": "looks", "Try": "tries", "Guess": "guesses",
         "Emit": "emits", "Update": "updates", "Validate": "validates", "Lookup": "looks up",
         "Register": "registers", "Strip": "strips", "Escape": "escapes", "Send": "sends",
         "Delete": "deletes", "Fetch": "fetches", "Clean": "cleans", "Display": "displays"}

EDIT_INSTRUCTIONS = [
    ("any", "Add type hints to this function without changing its behaviour."),
    ("nodoc", "Add a Google-style docstring describing the arguments and the return value."),
    ("doc", "Rewrite the docstring in NumPy style, with Parameters and Returns sections."),
    ("any", "Rename the local variables to more descriptive names."),
    ("percent", "Convert the %-style string formatting in this code to f-strings."),
    ("any", "Add comments that explain each step, without changing the code itself."),
    ("any", "Add logging: emit a debug message with the arguments when the function is called."),
    ("any", "Remove the docstring and comments and make it as compact as possible while keeping "
            "the same behaviour."),
    ("method", "Convert this method into a standalone function that takes the object as its "
               "first argument, named `obj`."),
    ("any", "Add input validation that raises a TypeError with a helpful message when an "
            "argument has the wrong type."),
    ("append", "Rewrite the loop that builds the list as a list comprehension, if possible."),
    ("any", "Wrap the body in a try/except that re-raises any exception with extra context about "
            "the inputs."),
    ("any", "Make this code easier to read for a beginner: split long expressions, use clearer "
            "names, and keep the behaviour identical."),
    ("any", "Add an `assert` at the start for each assumption the code makes about its "
            "arguments."),
]

SUMMARY_EXTRA = [  # module-docstring framings for train summarization
    "From the documentation of Python's `{m}` module:",
    "This is the docstring at the top of `{m}` in CPython:",
    "Docs for the `{m}` module:",
]

RAG_TOPIC_QUESTIONS = [
    "According to the passage, what is {h} used for?",
    "What is one rule or restriction that the passage states about {h}?",
    "Based only on this text, explain {h} to a beginner in two sentences.",
    "Give a short code example that illustrates what the passage says about {h}.",
    "What does the passage say happens at run time with {h}?",
    "Is there anything in this passage that surprised you about {h}? Quote the relevant sentence.",
]
RAG_TOPIC_VERSION_Q = "What changed between Python versions, according to the passage?"

RAG_DOC_QUESTIONS = [
    "What does `{f}` return?",
    "What arguments does `{f}` take, according to the documentation?",
    "In one sentence, what is `{f}` for?",
    "Based on the documentation, write an example call to `{f}` and describe the result.",
    "Does the documentation mention any special cases or errors for `{f}`? List them.",
]

GENERAL_TOPIC_QUESTIONS = [
    "Explain {h} in Python, with a short example.",
    "Give me a beginner-friendly overview of {h} in Python. Keep it simple.",
    "Can you teach me about {h} in Python? I'm a beginner.",
    "What should every Python programmer know about {h}?",
]
GENERAL_MODULE_QUESTIONS = [
    "What is Python's `{m}` module used for? Show a small example.",
    "When would I use the `{m}` module in Python?",
    "Give me a quick introduction to the `{m}` module.",
]

MT_OPENERS = ["What does this function do?", "Can you explain this snippet from the standard "
              "library?", "I found this in some code. What's it for?",
              "Could you tell me what this code does?"]
MT_FOLLOWUPS = ["Can you add type hints to it?", "How would I call it? Show a small example.",
                "Could you write two pytest tests for it?",
                "Is there any input that would make it fail?",
                "Can you rewrite it with clearer variable names?",
                "Can you explain it line by line?",
                "How could I make it faster, if at all?",
                "Can you write a docstring for it in Google style?"]

LONG_REQUESTS = [
    "Summarize what this module does and list its main public functions or classes.",
    "Find one possible bug or unhandled edge case in this code and explain it.",
    "Write a short usage example for the most important function or class in this code.",
    "Explain the overall structure of this file to a new contributor.",
    "Which parts of this code depend on the operating system or the environment, if any?",
    "Pick one public function here that has no docstring, or a thin one, and write a better "
    "docstring for it.",
    "What would you change to make this code easier to test? Be specific.",
]


def first_sentence(doc: str) -> str | None:
  text = " ".join(doc.split("\n\n")[0].split())
  m = re.match(r"(.+?[.!?])(\s|$)", text)
  s = m.group(1) if m else text + "."
  return s if 20 <= len(s) <= 220 else None


def train_candidates(lib: Stdlib, banned: set[str]):
  """Functions of stdlib files not used by the suite: (rel, qualname, node, is_method)."""
  out = []
  for rel in lib.files():
    if f"Lib/{rel}" in banned:
      continue
    try:
      _, tree = lib.parse(rel)
    except (SyntaxError, UnicodeDecodeError):
      continue
    for top in tree.body:
      if isinstance(top, ast.FunctionDef):
        out.append((rel, top.name, top, False))
      elif isinstance(top, ast.ClassDef) and not top.name.startswith("_"):
        for m in top.body:
          if isinstance(m, ast.FunctionDef) and not m.name.startswith("__"):
            out.append((rel, f"{top.name}.{m.name}", m, True))
  return out


def build_train(lib: Stdlib, sections: dict[str, str], count, banned: set[str],
                suite_users: set[str]) -> list[dict]:
  out: list[dict] = []
  cands = train_candidates(lib, banned)
  used_funcs: set[tuple[str, str]] = set()

  def ok(messages, limit=SHORT_MAX):
    u = "\n".join(m["content"] for m in messages if m["role"] == "user")
    return u not in suite_users and count(messages) <= limit

  def take(pool, n, per_module, make, salt):
    got, per = 0, {}
    for key in stable_order(range(len(pool)), salt):
      if got >= n:
        break
      rel = pool[key][0]
      if per.get(rel, 0) >= per_module:
        continue
      r = make(key, pool[key])
      if r is None:
        continue
      out.append(r)
      per[rel] = per.get(rel, 0) + 1
      got += 1
    assert got == n, f"train {salt}: only {got} of {n}"

  # coding: public top-level functions with a real docstring
  coding_pool = [c for c in cands if not c[3] and not c[1].startswith("_")
                 and 80 <= len(ast.get_docstring(c[2]) or "") <= 1200
                 and len(lib.segment(c[0], c[2])) <= 4000]

  def make_coding(i, c):
    rel, fn, node, _ = c
    sig = f"{fn}({ast.unparse(node.args)})"
    doc = spec_doc(fn, ast.get_docstring(node))
    if len(doc) < 60:
      return None
    m = msgs([("user", coding_prompt(i, modname(rel), fn, sig, doc))])
    if not ok(m):
      return None
    used_funcs.add((rel, fn))
    return rec("coding", m, lib_source(rel, f"{modname(rel)}.{fn} (signature and docstring)",
                                       f"request {CC0}"))
  take(coding_pool, TRAIN_TARGETS["coding"], 1, make_coding, "coding")

  # code_editing: functions and methods of 6..40 lines
  edit_pool = [c for c in cands if 6 <= c[2].end_lineno - c[2].lineno + 1 <= 40
               and (c[0], c[1]) not in used_funcs]

  def make_edit(i, c):
    rel, qual, node, is_method = c
    code = lib.segment(rel, node)
    has_doc = ast.get_docstring(node) is not None
    feats = {"any": True, "nodoc": not has_doc, "doc": has_doc, "method": is_method,
             "percent": bool(re.search(r"['\"]\s*%\s*[\w(]", code)),
             "append": ".append(" in code and "for " in code}
    choices = [t for f, t in EDIT_INSTRUCTIONS if feats[f]]
    instr = pick(choices, f"edit|{rel}|{qual}")
    m = msgs([("user", edit_prompt(i, code, instr, f"Python's `{modname(rel)}` module"))])
    if not ok(m):
      return None
    used_funcs.add((rel, qual))
    return rec("code_editing", m, lib_source(rel, f"{modname(rel)}.{qual} (source)",
                                             f"instruction {CC0}"))
  take(edit_pool, TRAIN_TARGETS["code_editing"], 1, make_edit, "code_editing")

  # reference sections not used by the suite, cut into passages
  ref = [(h, c) for h in sorted(sections) if f"topics:{h}" not in banned
         for c in chunks(sections[h])]
  ref_order = stable_order(range(len(ref)), "ref")
  half = len(ref_order) // 2
  ref_sum = [ref[k] for k in ref_order[:half]]
  ref_rag = [ref[k] for k in ref_order[half:]]

  # summarization: reference passages + module docstrings
  n_sum_ref = TRAIN_TARGETS["summarization"] * 2 // 3
  for i, (h, body) in enumerate(ref_sum[:n_sum_ref]):
    m = msgs([("user", summary_prompt(i, passage(h, body)))])
    if ok(m):
      out.append(rec("summarization", m, topic_source(h, f"request {CC0}")))
  doc_mods = [rel for rel in lib.files() if f"Lib/{rel}" not in banned
              and len(module_doc(lib, rel)) >= 500]
  need = TRAIN_TARGETS["summarization"] - sum(r["category"] == "summarization" for r in out)
  for i, rel in enumerate(stable_order(doc_mods, "sumdoc")):
    if need == 0:
      break
    head = pick(SUMMARY_EXTRA, rel).format(m=modname(rel))
    m = msgs([("user", summary_prompt(i, f"{head}\n\n{module_doc_excerpt(lib, rel)}"))])
    if ok(m):
      out.append(rec("summarization", m, lib_source(rel, f"{modname(rel)} module docstring",
                                                    f"request {CC0}")))
      need -= 1
  assert need == 0

  # rag_qa: reference passages + function docstrings (functions not used above)
  n_rag_ref = TRAIN_TARGETS["rag_qa"] // 2
  got = 0
  for i, (h, body) in enumerate(ref_rag):
    if got == n_rag_ref:
      break
    hname = "the " + h[4:] if h.startswith("The ") else h
    qs = RAG_TOPIC_QUESTIONS + ([RAG_TOPIC_VERSION_Q] if "version" in body else [])
    q = pick(qs, f"rag|{h}|{i}").format(h=hname)
    m = rag_messages(i, passage(h, body), q)
    if ok(m):
      out.append(rec("rag_qa", m, topic_source(h, f"question {CC0}")))
      got += 1
  assert got == n_rag_ref
  rag_pool = [c for c in cands if 200 <= len(ast.get_docstring(c[2]) or "") <= 1800
              and (c[0], c[1]) not in used_funcs and not c[1].split(".")[-1].startswith("_")]

  def make_rag(i, c):
    rel, qual, node, _ = c
    full = f"{modname(rel)}.{qual}"
    ctx = f"{full}({ast.unparse(node.args)})\n\n{ast.get_docstring(node)}"
    q = pick(RAG_DOC_QUESTIONS, f"ragdoc|{full}").format(f=qual.split(".")[-1])
    m = rag_messages(i + 1, ctx, q)
    if not ok(m):
      return None
    used_funcs.add((rel, qual))
    return rec("rag_qa", m, lib_source(rel, f"{full} (signature and docstring)",
                                       f"question {CC0}"))
  take(rag_pool, TRAIN_TARGETS["rag_qa"] - n_rag_ref, 1, make_rag, "rag_qa")

  # math, writing: hand-written
  for text in hw.TRAIN_MATH:
    out.append(rec("math", msgs([("user", text)]), f"word problem {CC0}"))
  for text in hw.TRAIN_WRITING:
    out.append(rec("writing", msgs([("user", text)]), f"prompt {CC0}"))

  # multi_turn: hand-written conversations + "explain this stdlib function" follow-ups
  for turns in hw.TRAIN_MULTI_TURN:
    m, source = conversation(turns, lib)
    out.append(rec("multi_turn", m, source))
  mt_pool = [c for c in cands if (c[0], c[1]) not in used_funcs
             and 4 <= c[2].end_lineno - c[2].lineno + 1 <= 30
             and ast.get_docstring(c[2])]

  def make_mt(i, c):
    rel, qual, node, _ = c
    s = first_sentence(ast.get_docstring(node))
    if not s:
      return None
    verb, _, rest = s.partition(" ")
    if VERBS.get(verb) is None or not rest:
      return None
    name = qual.split(".")[-1]
    answer = (f"`{name}` {VERBS[verb]} {rest} It comes from the `{modname(rel)}` module of the "
              f"standard library.")
    code = lib.segment(rel, node)
    opener = pick(MT_OPENERS, f"mt|{rel}|{qual}")
    follow = pick(MT_FOLLOWUPS, f"mtf|{rel}|{qual}")
    m = msgs([("user", f"{opener}\n\n{fence(code)}"), ("assistant", answer), ("user", follow)])
    if not ok(m):
      return None
    used_funcs.add((rel, qual))
    return rec("multi_turn", m, lib_source(rel, f"{modname(rel)}.{qual} (source and docstring)",
                                           f"conversation {CC0}"))
  take(mt_pool, TRAIN_TARGETS["multi_turn"] - len(hw.TRAIN_MULTI_TURN), 1, make_mt,
       "multi_turn")

  # long_input: whole (or leading part of) modules the suite does not use
  long_mods = [rel for rel in lib.files() if f"Lib/{rel}" not in banned
               and 6000 <= os.path.getsize(os.path.join(lib.root, rel))]
  got = 0
  for i, rel in enumerate(stable_order(long_mods, "long")):
    if got == TRAIN_TARGETS["long_input"]:
      break
    request = pick(LONG_REQUESTS, f"long|{rel}")
    m, truncated = fit_long(lib, rel, request, i, count)
    if m is None or not ok(m, LONG_MAX):
      continue
    part = "leading part of the module source" if truncated else "module source"
    out.append(rec("long_input", m, lib_source(rel, part, f"request {CC0}")))
    got += 1
  assert got == TRAIN_TARGETS["long_input"]

  # general: questions without context, about reference topics and modules
  gen_topics = [h for h in sorted(sections) if f"topics:{h}" not in banned
                and (h.startswith("The ") or h.endswith(("literals", "operations", "displays",
                                                         "comparisons", "statements")))]
  n_gen_topics = min(len(gen_topics), TRAIN_TARGETS["general"] // 2)
  for h in stable_order(gen_topics, "gen")[:n_gen_topics]:
    hname = "the " + h[4:] if h.startswith("The ") else h.lower()
    q = pick(GENERAL_TOPIC_QUESTIONS, f"gen|{h}").format(h=hname.replace('"', "`"))
    out.append(rec("general", msgs([("user", q)]), topic_source(h, f"question {CC0}")))
  gen_mods = [rel for rel in lib.files() if f"Lib/{rel}" not in banned
              and not os.path.basename(rel).startswith("_") and "/" not in rel]
  for rel in stable_order(gen_mods, "genmod")[:TRAIN_TARGETS["general"] - n_gen_topics]:
    q = pick(GENERAL_MODULE_QUESTIONS, f"genmod|{rel}").format(m=modname(rel))
    out.append(rec("general", msgs([("user", q)]),
                   lib_source(rel, "module name only", f"question {CC0}")))

  order = {c: i for i, c in enumerate(TRAIN_CATEGORIES)}
  out.sort(key=lambda r: order[r["category"]])   # stable: keeps construction order within
  return number(out, 3)


# ------------------------------------------------------------------------------------------------
# Checks, stats, output

def user_text(r: dict) -> str:
  return "\n".join(m["content"] for m in r["messages"] if m["role"] == "user")


def validate(suite: list[dict], train: list[dict], count) -> dict:
  for recs, cats in ((suite, CATEGORIES), (train, TRAIN_CATEGORIES)):
    ids = [r["id"] for r in recs]
    assert len(ids) == len(set(ids)), "duplicate ids"
    for r in recs:
      assert r["category"] in cats, r["id"]
      assert r["messages"] and r["messages"][-1]["role"] == "user", r["id"]
      assert all(m["role"] in ("system", "user", "assistant") and m["content"].strip()
                 for m in r["messages"]), r["id"]
      n = count(r["messages"])
      if r["category"] == "long_input":
        assert LONG_MIN <= n <= LONG_MAX, (r["id"], n)
      else:
        assert n <= SHORT_MAX, (r["id"], n)
      if r["category"] == "multi_turn":   # 2-3 earlier exchanges in the suite, 1-3 in train
        n_turns = len([m for m in r["messages"] if m["role"] != "system"])
        assert n_turns in ((5, 7) if recs is suite else (3, 5, 7)), (r["id"], n_turns)
    users = [user_text(r) for r in recs]
    assert len(users) == len(set(users)), "duplicate user messages within a file"
  for c in CATEGORIES:
    assert sum(r["category"] == c for r in suite) == PER_CATEGORY, c
  assert len(train) >= 400
  # Disjointness, derived from the written source strings.
  for r in suite + train:
    units = source_units(r["source"])
    if "Lib/" in r["source"]:
      assert units, f"{r['id']}: stdlib source without a unit: {r['source']}"
    if "topics.py" in r["source"]:
      assert any(u.startswith("topics:") for u in units), r["id"]
  suite_units = set().union(*(source_units(r["source"]) for r in suite))
  for r in train:
    clash = source_units(r["source"]) & suite_units
    assert not clash, f"train {r['id']} uses suite source {clash}"
  # Near-duplicate guard: long text lines (>= 50 chars) of suite user messages, other than the
  # request framings (lines found in 3+ train prompts), may occur in at most 2 lines of any one
  # train prompt (the same stdlib idiom or a similar sentence in a different section is fine).
  def long_lines(r):
    return {" ".join(l.split()) for m in r["messages"] if m["role"] == "user"
            for l in m["content"].splitlines() if len(" ".join(l.split())) >= 50}
  freq: dict[str, int] = {}
  for r in train:
    for l in long_lines(r):
      freq[l] = freq.get(l, 0) + 1
  suite_lines = set().union(*(long_lines(r) for r in suite))
  for r in train:
    shared = {l for l in long_lines(r) & suite_lines if freq[l] < 3}
    assert len(shared) <= 2, (r["id"], sorted(shared)[:3])
  norm = lambda s: " ".join(s.lower().split())
  suite_users = {norm(user_text(r)) for r in suite}
  suite_msgs = {norm(m["content"]) for r in suite for m in r["messages"] if m["role"] == "user"}
  for r in train:
    assert norm(user_text(r)) not in suite_users, r["id"]
    for m in r["messages"]:
      assert m["role"] != "user" or norm(m["content"]) not in suite_msgs, r["id"]
  return {"suite_units": len(suite_units)}


def dump(records: list[dict]) -> str:
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def stats_table(suite, train, count) -> str:
  def rows(recs, cats):
    lines = ["| category | prompts | min | median | max |", "|---|---:|---:|---:|---:|"]
    for c in cats:
      ns = [count(r["messages"]) for r in recs if r["category"] == c]
      lines.append(f"| {c} | {len(ns)} | {min(ns)} | {int(statistics.median(ns))} | {max(ns)} |")
    ns = [count(r["messages"]) for r in recs]
    lines.append(f"| **all** | {len(ns)} | {min(ns)} | {int(statistics.median(ns))} | "
                 f"{max(ns)} |")
    return "\n".join(lines)
  return (f"Measured by build.py ({PY} stdlib; SmolLM2 tokenizer, chat template applied with "
          f"the generation prompt, so the counts include the default system prompt where a "
          f"prompt has none).\n\n"
          f"suite.jsonl ({len(dump(suite).encode())} bytes)\n\n{rows(suite, CATEGORIES)}"
          f"\n\ntrain.jsonl ({len(dump(train).encode())} bytes)\n\n"
          f"{rows(train, TRAIN_CATEGORIES)}\n")


STATS_BEGIN, STATS_END = "<!-- stats:begin (written by build.py) -->", "<!-- stats:end -->"


def with_stats(readme: str, table: str) -> str:
  a, b = readme.index(STATS_BEGIN) + len(STATS_BEGIN), readme.index(STATS_END)
  return readme[:a] + "\n" + table + readme[b:]


def default_gguf() -> str:
  from models.fetch import cache_dir
  path = os.path.join(cache_dir(), "SmolLM2-135M-Instruct.Q4_1.gguf")
  if os.path.isfile(path):
    return path
  from models.registry import resolve
  return resolve("smollm2-135m-instruct")


def make_counter(gguf: str):
  from models.gguf_loader import metadata, open_gguf
  from models.tokenizer import Tokenizer
  tok = Tokenizer.from_gguf_metadata(metadata(open_gguf(gguf)))
  memo: dict[str, int] = {}

  def count(messages) -> int:
    key = json.dumps(messages, ensure_ascii=False)
    if key not in memo:
      memo[key] = len(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True)))
    return memo[key]
  return count


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--gguf", help="SmolLM2 GGUF for token counting (default: the jspec cache, "
                                 "fetched via models.registry if missing)")
  ap.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"],
                  help="CPython 3.11 Lib directory (default: this interpreter's)")
  ap.add_argument("--check", action="store_true",
                  help="verify the files on disk are what this script builds; write nothing")
  args = ap.parse_args(argv)
  assert sys.version_info[:2] == (3, 11), "built from CPython 3.11's stdlib; run with Python 3.11"

  count = make_counter(args.gguf or default_gguf())
  lib = Stdlib(args.stdlib)
  sections = reference_sections(lib)
  suite = build_suite(lib, sections, count)
  banned = set().union(*(source_units(r["source"]) for r in suite))
  train = build_train(lib, sections, count, banned, {user_text(r) for r in suite})
  validate(suite, train, count)

  files = {"suite.jsonl": dump(suite), "train.jsonl": dump(train)}
  with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  files["README.md"] = with_stats(readme, stats_table(suite, train, count))
  stale = []
  for name, text in files.items():
    path = os.path.join(HERE, name)
    old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
    if old != text:
      stale.append(name)
      if not args.check:
        with open(path, "w", encoding="utf-8", newline="\n") as f:
          f.write(text)
  print(f"suite: {len(suite)} prompts, train: {len(train)} prompts; "
        f"{'differs' if args.check else 'rewrote'}: {', '.join(stale) or 'nothing'}")
  return 1 if (args.check and stale) else 0


if __name__ == "__main__":
  sys.exit(main())
