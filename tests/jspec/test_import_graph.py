"""The import graph of jspec, models and pallas_kernels: no cycle (function-level imports count),
no arrow that climbs a layer, no private name taken from another module. A negative control runs
the same checks on a small package built to break each rule."""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("jspec", "models", "pallas_kernels")

# Layers, lowest first: a module may import its own layer or lower ones. The longest matching
# prefix decides; the rest of jspec (engine, drafters, decoders, sampling, io, ...) is the core.
LAYERS = {"pallas_kernels": 0, "models": 1, "jspec": 2, "jspec.plan": 3, "jspec.train": 4,
          "jspec.bench": 5, "jspec.cli": 6}


def modules(root: str, packages) -> dict[str, str]:
  """Module name -> file, for every .py under the packages."""
  out = {}
  for pkg in packages:
    for folder, _, files in os.walk(os.path.join(root, pkg)):
      for f in files:
        if f.endswith(".py"):
          path = os.path.join(folder, f)
          name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
          out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
  return out


def _target(name: str, mods) -> str | None:
  """The module an import names: itself, or the nearest enclosing module we have."""
  while name and name not in mods:
    name = name.rpartition(".")[0]
  return name or None


def scan(root: str, packages) -> tuple[dict[str, set[str]], list[str]]:
  """(edges: module -> modules it imports, anywhere in the file; private-name uses across
  modules, as 'module:line name')."""
  mods = modules(root, packages)
  edges, private = {m: set() for m in mods}, []
  for mod, path in mods.items():
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    aliases = {}                  # local name -> module it is bound to
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        for a in node.names:
          t = _target(a.name, mods)
          if t and t != mod:
            edges[mod].add(t)
            aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
      elif isinstance(node, ast.ImportFrom):
        if node.level:
          parts = package.split(".")
          base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module
                                                                  else []))
        else:
          base = node.module or ""
        for a in node.names:
          full = f"{base}.{a.name}"
          t = full if full in mods else _target(base, mods)
          if t is None or t == mod:
            continue
          edges[mod].add(t)
          if full in mods:
            aliases[a.asname or a.name] = full
          elif a.name.startswith("_") and not a.name.startswith("__"):
            private.append(f"{mod}:{node.lineno} {base}.{a.name}")
    for node in ast.walk(tree):
      if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
          node.value.id in aliases and node.attr.startswith("_") and \
          not node.attr.startswith("__") and aliases[node.value.id] != mod:
        private.append(f"{mod}:{node.lineno} {aliases[node.value.id]}.{node.attr}")
  return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan, iterative)."""
  index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
  for start in edges:
    if start in index:
      continue
    work = [(start, iter(sorted(edges[start])))]
    index[start] = low[start] = counter[0]
    counter[0] += 1
    stack.append(start)
    on.add(start)
    while work:
      v, it = work[-1]
      w = next(it, None)
      if w is not None:
        if w not in index:
          index[w] = low[w] = counter[0]
          counter[0] += 1
          stack.append(w)
          on.add(w)
          work.append((w, iter(sorted(edges.get(w, ())))))
        elif w in on:
          low[v] = min(low[v], index[w])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[v])
      if low[v] == index[v]:
        comp = []
        while True:
          w = stack.pop()
          on.discard(w)
          comp.append(w)
          if w == v:
            break
        if len(comp) > 1:
          out.append(sorted(comp))
  return out


def layer(mod: str, layers) -> int:
  best = max((p for p in layers if mod == p or mod.startswith(p + ".")), key=len)
  return layers[best]


def upward(edges: dict[str, set[str]], layers) -> list[str]:
  return sorted(f"{a} -> {b}" for a, targets in edges.items() for b in targets
                if layer(a, layers) < layer(b, layers))


def test_no_cycle_no_upward_arrow_no_private_import():
  edges, private = scan(ROOT, PACKAGES)
  assert len(edges) > 100                        # the walk found the packages
  assert cycles(edges) == []
  assert upward(edges, LAYERS) == []
  assert private == []


def test_the_checks_catch_what_they_forbid(tmp_path):
  files = {
      "pkg/__init__.py": "",
      "pkg/low.py": "import pkg.high\n",                             # upward, and a cycle ...
      "pkg/high.py": "from pkg import low\n"                         # ... with this one
                     "def f():\n  from pkg.other import _secret\n",  # lazy private import
      "pkg/other.py": "_secret = 1\n",
      "pkg/user.py": "import pkg.other as o\nx = o._secret\n",                # private attribute
  }
  for name, text in files.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text)
  edges, private = scan(str(tmp_path), ("pkg",))
  assert cycles(edges) == [["pkg.high", "pkg.low"]]
  assert upward(edges, {"pkg": 0, "pkg.high": 1}) == ["pkg.low -> pkg.high"]
  assert sorted(private) == ["pkg.high:3 pkg.other._secret", "pkg.user:2 pkg.other._secret"]


@pytest.mark.parametrize("mod, want", [("jspec.cli", 6), ("jspec.bench.speedup", 5),
                                       ("jspec.engine", 2), ("models.llama", 1)])
def test_layers_by_longest_prefix(mod, want):
  assert layer(mod, LAYERS) == want
