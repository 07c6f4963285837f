"""The `reasoning` family: logic puzzles generated with a known, unique answer (checked by brute
force while generating): orderings, a small zebra grid, knights and knaves, syllogisms, number
sequences, calendar arithmetic and meeting scheduling."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
from typing import Callable

import numpy as np

from jspec.train.prompts.common import CC0, Candidate, Uses, pick, user
from jspec.train.prompts.mathgen import NAMES
from jspec.train.prompts.sources import Library

ASKS = ["Explain your reasoning.", "Show how you worked it out.", "Reason step by step, then "
        "state the answer.", "Justify each step.", "Explain how you know the answer is unique.",
        "Walk me through your logic."]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth"]


@dataclasses.dataclass(frozen=True)
class Puzzle:
  kind: str
  text: str
  answer: str
  data: dict          # the structured clues, for checking


# Orderings -------------------------------------------------------------------------------------

def _holds(clue: tuple, pos: dict) -> bool:
  kind, a, b = clue
  return {"before": lambda: pos[a] < pos[b], "right_before": lambda: pos[a] + 1 == pos[b],
          "at": lambda: pos[a] == b, "not_at": lambda: pos[a] != b,
          "apart": lambda: abs(pos[a] - pos[b]) >= 2}[kind]()


def ordering_solutions(people: list[str], clues: list[tuple]) -> list[tuple[str, ...]]:
  return [perm for perm in itertools.permutations(people)
          if all(_holds(c, {p: i for i, p in enumerate(perm)}) for c in clues)]


def _say(clue: tuple, n: int) -> str:
  kind, a, b = clue
  if kind in ("at", "not_at"):
    place = f"finish {ORDINALS[b]}" if b < n - 1 else "finish last"
    return f"{a} did {place}." if kind == "at" else f"{a} did not {place}."
  return {"before": f"{a} finished ahead of {b}.",
          "right_before": f"{a} crossed the line immediately before {b}.",
          "apart": f"{a} and {b} did not finish next to each other."}[kind]


def ordering(rng: np.random.Generator) -> Puzzle:
  n = int(rng.integers(4, 6))
  people = [str(x) for x in rng.choice(NAMES, n, replace=False)]
  truth = [people[i] for i in rng.permutation(n)]
  pos = {p: i for i, p in enumerate(truth)}
  clues: list[tuple] = []
  alive = list(itertools.permutations(people))
  while len(alive) > 1:    # add true clues that rule something out until one order is left
    kind = pick(rng, ["before", "before", "right_before", "at", "not_at", "apart"])
    a, b = (str(x) for x in rng.choice(people, 2, replace=False))
    clue = ((kind, a, int(rng.integers(n))) if kind in ("at", "not_at") else (kind, a, b))
    if not _holds(clue, pos):
      continue
    left = [w for w in alive if _holds(clue, {p: i for i, p in enumerate(w)})]
    if len(left) < len(alive):
      clues.append(clue)
      alive = left
  race = pick(rng, ["a race", "a spelling bee", "a cooking contest", "a chess tournament"])
  text = (f"{', '.join(people[:-1])} and {people[-1]} took part in {race}, with no ties. "
          + " ".join(_say(c, n) for c in clues) + " What was the finishing order?")
  return Puzzle("ordering", text, ", ".join(truth), dict(people=people, clues=clues))


# Zebra grid (3 houses) ------------------------------------------------------------------------

def zebra(rng: np.random.Generator) -> Puzzle:
  names = [str(x) for x in rng.choice(NAMES, 3, replace=False)]
  colours = [str(x) for x in rng.choice(["red", "blue", "green", "yellow", "white"], 3,
                                        replace=False)]
  pets = [str(x) for x in rng.choice(["cat", "dog", "parrot", "rabbit", "goldfish"], 3,
                                     replace=False)]
  worlds = [(n, c, p) for n in itertools.permutations(names) for c in itertools.permutations(
      colours) for p in itertools.permutations(pets)]
  truth = worlds[int(rng.integers(len(worlds)))]
  facts = []       # (text, predicate over a world)
  for i in range(3):
    n, c, p = truth[0][i], truth[1][i], truth[2][i]
    facts += [(f"{n} lives in the {c} house.", lambda w, n=n, c=c: w[1][w[0].index(n)] == c),
              (f"The {p} lives in the {c} house.", lambda w, p=p, c=c: w[1][w[2].index(p)] == c),
              (f"{n} does not own the {pets[(pets.index(p) + 1) % 3]}.",
               lambda w, n=n, q=pets[(pets.index(p) + 1) % 3]: w[2][w[0].index(n)] != q),
              (f"The {c} house is {['on the left', 'in the middle', 'on the right'][i]}.",
               lambda w, c=c, i=i: w[1][i] == c)]
  for i in range(2):
    facts.append((f"The {truth[1][i]} house is directly left of the {truth[1][i + 1]} house.",
                  lambda w, a=truth[1][i], b=truth[1][i + 1]: w[1].index(a) + 1 == w[1].index(b)))
  chosen, alive = [], worlds
  for k in rng.permutation(len(facts)):
    left = [w for w in alive if facts[k][1](w)]
    if len(left) < len(alive):
      chosen.append(facts[k])
      alive = left
    if len(alive) == 1:
      break
  target = pick(rng, pets)
  owner = truth[0][truth[2].index(target)]
  text = (f"Three friends, {', '.join(names)}, live in three houses in a row (left, middle, "
          f"right), painted {', '.join(colours)}, and each keeps one pet: a {pets[0]}, a "
          f"{pets[1]} or a {pets[2]}. " + " ".join(t for t, _ in chosen)
          + f" Who owns the {target}?")
  return Puzzle("zebra", text, owner, dict(truth=truth, worlds=sum(all(f(w) for _, f in chosen)
                                                                   for w in worlds)))


# Knights and knaves --------------------------------------------------------------------------

def _statement(rng, speaker: int, n: int) -> tuple:
  other = int(pick(rng, [i for i in range(n) if i != speaker]))
  return pick(rng, [("knave", other), ("knight", other), ("same", other), ("differ", other),
                    ("some_knave", -1), ("all_knights", -1)])


def knights_truth(stmt: tuple, speaker: int, world: tuple[bool, ...]) -> bool:
  kind, o = stmt
  return {"knave": lambda: not world[o], "knight": lambda: world[o],
          "same": lambda: world[o] == world[speaker], "differ": lambda: world[o] != world[speaker],
          "some_knave": lambda: not all(world), "all_knights": lambda: all(world)}[kind]()


def knights_solutions(statements: list[tuple]) -> list[tuple[bool, ...]]:
  n = len(statements)
  return [w for w in itertools.product([True, False], repeat=n)
          if all(knights_truth(s, i, w) == w[i] for i, s in enumerate(statements))]


def knights(rng: np.random.Generator) -> Puzzle:
  n = int(rng.integers(2, 4))
  names = [str(x) for x in rng.choice(NAMES, n, replace=False)]
  while True:
    statements = [_statement(rng, i, n) for i in range(n)]
    sols = knights_solutions(statements)
    if len(sols) == 1:
      break

  def say(i, s):
    kind, o = s
    return {"knave": f"{names[o]} is a knave.", "knight": f"{names[o]} is a knight.",
            "same": f"{names[o]} and I are the same type.",
            "differ": f"{names[o]} and I are different types.",
            "some_knave": "At least one of us is a knave.",
            "all_knights": "We are all knights."}[kind]
  text = ("On an island, knights always tell the truth and knaves always lie. You meet "
          f"{', '.join(names)}. " + " ".join(f"{names[i]} says: \"{say(i, s)}\""
                                             for i, s in enumerate(statements))
          + " Who is a knight and who is a knave?")
  answer = ", ".join(f"{nm}: {'knight' if k else 'knave'}" for nm, k in zip(names, sols[0]))
  return Puzzle("knights", text, answer, dict(statements=statements))


# Syllogisms -----------------------------------------------------------------------------------

# (premise 1, premise 2, conclusion, valid?) over terms A, B, C
SYLLOGISMS = [
    ("All {A} are {B}.", "All {B} are {C}.", "all {A} are {C}", True),
    ("All {A} are {B}.", "All {C} are {B}.", "all {A} are {C}", False),
    ("No {A} are {B}.", "All {C} are {A}.", "no {C} are {B}", True),
    ("Some {A} are {B}.", "All {B} are {C}.", "some {A} are {C}", True),
    ("All {A} are {B}.", "Some {C} are {B}.", "some {C} are {A}", False),
    ("All {A} are {B}.", "No {B} are {C}.", "no {A} are {C}", True),
    ("All {C} are {B}.", "Some {A} are not {B}.", "some {A} are not {C}", True),
    ("No {A} are {B}.", "Some {C} are not {A}.", "some {C} are {B}", False),
    ("Some {A} are {B}.", "Some {B} are {C}.", "some {A} are {C}", False),
    ("No {A} are {B}.", "No {B} are {C}.", "no {A} are {C}", False),
]
TERMS = ["wumpuses", "glorbs", "tinkers", "blickets", "zorbs", "fendles", "quibs", "marlocks",
         "painters", "cyclists", "violinists", "gardeners", "robots", "dragons", "librarians",
         "pilots", "chess players", "sailors", "bakers", "astronomers"]


def syllogism(rng: np.random.Generator) -> Puzzle:
  p1, p2, concl, valid = pick(rng, SYLLOGISMS)
  a, b, c = (str(x) for x in rng.choice(TERMS, 3, replace=False))
  f = dict(A=a, B=b, C=c)
  text = (f"Premises: {p1.format(**f)} {p2.format(**f)} Does it follow that "
          f"{concl.format(**f)}? Answer yes or no.")
  return Puzzle("syllogism", text, "yes" if valid else "no", dict(valid=valid))


# Sequences ------------------------------------------------------------------------------------

def _sequence_rule(rng) -> tuple[str, Callable[[int], int]]:
  a, d = int(rng.integers(-20, 30)), int(pick(rng, [-7, -5, -3, 2, 3, 4, 6, 7, 9, 11]))
  r = int(pick(rng, [2, 3, -2]))
  k = int(rng.integers(1, 9))
  f0, f1 = int(rng.integers(1, 6)), int(rng.integers(1, 8))

  def fibonacci(i):
    x, y = f0, f1
    for _ in range(i):
      x, y = y, x + y
    return x

  rules = [
      ("arithmetic", lambda i: a + d * i),
      ("geometric", lambda i: k * r ** i),
      ("squares", lambda i: (i + 1) ** 2 + a),
      ("quadratic", lambda i: k * i * i + d * i + a),
      ("fibonacci", fibonacci),
      ("alternating", lambda i: (a + d * (i // 2)) if i % 2 == 0 else (k + r * (i // 2))),
      ("double_plus_one", lambda i: (k + 1) * 2 ** i - 1),
  ]
  return pick(rng, rules)


def sequence(rng: np.random.Generator) -> Puzzle:
  name, rule = _sequence_rule(rng)
  shown = int(rng.integers(5, 8))
  terms = [rule(i) for i in range(shown)]
  q = pick(rng, ["What is the next number", "What number comes next",
                 "Find the next term"])
  text = f"{q} in the sequence {', '.join(map(str, terms))}, ...? Describe the rule."
  return Puzzle("sequence", text, str(rule(shown)), dict(rule=name, terms=terms))


# Calendar -------------------------------------------------------------------------------------

def calendar(rng: np.random.Generator) -> Puzzle:
  year = int(rng.integers(2024, 2041))
  start = datetime.date(year, 1, 1) + datetime.timedelta(days=int(rng.integers(0, 300)))
  if rng.random() < 0.5:
    days = int(rng.integers(10, 1000))
    text = (f"Today is a {WEEKDAYS[start.weekday()]}. What day of the week will it be in "
            f"{days} days?")
    answer = WEEKDAYS[(start.weekday() + days) % 7]
    data = dict(start=start.weekday(), days=days)
  else:
    end = start + datetime.timedelta(days=int(rng.integers(5, 200)))
    text = (f"{start.day} {MONTHS[start.month - 1]} {year} is a {WEEKDAYS[start.weekday()]}. "
            f"What day of the week is {end.day} {MONTHS[end.month - 1]} {end.year}?")
    answer = WEEKDAYS[end.weekday()]
    data = dict(start=start.isoformat(), end=end.isoformat())
  return Puzzle("calendar", text, answer, data)


# Scheduling -----------------------------------------------------------------------------------

def earliest_finish(durations: dict[str, int], after: dict[str, int],
                    precede: list[tuple[str, str]], start: int) -> tuple[int, tuple[str, ...]]:
  """Shortest finish time (minutes) of one person doing every task once, no overlap: each task
  starts no earlier than its `after` time, and (a, b) in precede means b starts after a ends."""
  best = None
  for order in itertools.permutations(sorted(durations)):
    if any(order.index(a) > order.index(b) for a, b in precede):
      continue
    t = start
    for task in order:
      t = max(t, after.get(task, start)) + durations[task]
    if best is None or t < best[0]:
      best = (t, order)
  return best


def _clock(minutes: int) -> str:
  return f"{minutes // 60}:{minutes % 60:02d}"


def scheduling(rng: np.random.Generator) -> Puzzle:
  names = ["the report", "the budget review", "a client call", "the code review",
           "the team meeting", "ordering supplies", "the interview"]
  tasks = [str(x) for x in rng.choice(names, int(rng.integers(3, 5)), replace=False)]
  durations = {t: int(rng.integers(2, 10) * 10) for t in tasks}
  start = int(rng.integers(8, 10)) * 60
  fixed = str(pick(rng, tasks))
  after = {fixed: start + int(rng.integers(1, 8)) * 15}
  a, b = (str(x) for x in rng.choice(tasks, 2, replace=False))
  precede = [(a, b)]
  finish, _ = earliest_finish(durations, after, precede, start)
  parts = ", ".join(f"{t} ({durations[t]} minutes)" for t in tasks)
  text = (f"Starting at {_clock(start)}, {pick(rng, NAMES)} has to do these tasks one at a "
          f"time: {parts}. {fixed[0].upper() + fixed[1:]} cannot start before "
          f"{_clock(after[fixed])}, and {b} can only start once {a} is finished. What is the "
          f"earliest time everything can be done, and in what order?")
  return Puzzle("scheduling", text, _clock(finish), dict(durations=durations, after=after,
                                                         precede=precede, start=start))


KINDS: dict[str, Callable[[np.random.Generator], Puzzle]] = {
    "ordering": ordering, "zebra": zebra, "knights": knights, "syllogism": syllogism,
    "sequence": sequence, "calendar": calendar, "scheduling": scheduling}


def reasoning(lib: Library, uses: Uses, rng: np.random.Generator, n: int) -> list[Candidate]:
  out = []
  for _ in range(n):
    kind = pick(rng, sorted(KINDS))
    p = KINDS[kind](rng)
    out.append(Candidate("reasoning", user(f"{p.text} {pick(rng, ASKS)}"),
                         f"logic puzzle ({p.kind}) {CC0}"))
  return out
