"""The `math` family: grade-school and multi-step word problems from templates with seeded names,
items and numbers. Every template computes its exact answer; numbers are drawn so that the answer
exists and is sensible (whole where the story needs it)."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Callable

import numpy as np

from jspec.train.prompts.common import CC0, Candidate, Uses, pick, user
from jspec.train.prompts.sources import Library

NAMES = ["Amara", "Ben", "Chen", "Dalia", "Emil", "Fatima", "Gabriel", "Hana", "Ivan", "Jia",
         "Kofi", "Lena", "Mateo", "Nia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq",
         "Uma", "Victor", "Wen", "Ximena", "Yusuf", "Zoe", "Aiko", "Bruno", "Carmen", "Dev",
         "Elif", "Finn", "Grace", "Hugo", "Isla", "Jonas", "Keira", "Luca", "Maya", "Nikhil"]
SNACKS = [("notebook", "notebooks"), ("pen", "pens"), ("apple", "apples"), ("muffin", "muffins"),
          ("sticker", "stickers"), ("candle", "candles"), ("mug", "mugs"), ("plant", "plants"),
          ("sandwich", "sandwiches"), ("ticket", "tickets"), ("scarf", "scarves"),
          ("bottle of juice", "bottles of juice"), ("box of crayons", "boxes of crayons")]
ASKS = ["Show your reasoning step by step.", "Explain each step of your solution.",
        "Solve it step by step and give the final answer on its own line.",
        "Walk me through the solution.", "Think it through carefully, then give the answer.",
        "Please solve this and explain how you got the answer.", ""]
INTROS = ["", "", "", "Here's a word problem: ", "Help me solve this: ", "My kid brought home "
          "this problem and I'm stuck. ", "Math question: ", "Can you solve this? "]


@dataclasses.dataclass(frozen=True)
class Problem:
  template: str
  text: str
  answer: Fraction
  values: dict        # the numbers drawn; keys starting with "_" are not quoted in the text


def _money(x: Fraction | int) -> str:
  x = Fraction(x)
  return f"${x.numerator // x.denominator}" if x.denominator == 1 else f"${float(x):.2f}"


def shopping(rng):
  name, (_, p1), (_, p2) = pick(rng, NAMES), *[SNACKS[i] for i in rng.choice(len(SNACKS), 2,
                                                                                 replace=False)]
  a, b, pa, pb = (int(v) for v in (rng.integers(2, 9), rng.integers(2, 9), rng.integers(2, 15),
                                   rng.integers(2, 15)))
  total = a * pa + b * pb
  bill = next(x for x in (20, 50, 100, 200, 500) if x > total)
  text = (f"{name} buys {a} {p1} at ${pa} each and {b} {p2} at ${pb} each, and pays with a "
          f"${bill} bill. How much change does {name} get?")
  return text, Fraction(bill - total), dict(a=a, b=b, pa=pa, pb=pb, bill=bill)


def two_legs(rng):
  name = pick(rng, NAMES)
  v, t, w, s = (int(x) for x in (rng.integers(4, 13) * 5, rng.integers(1, 5),
                                 rng.integers(4, 13) * 5, rng.integers(1, 4)))
  text = (f"{name} drives at {v} km/h for {t} hours, then at {w} km/h for {s} more hours. How "
          f"far does {name} travel in total, and what is the average speed for the trip?")
  return text, Fraction(v * t + w * s), dict(v=v, t=t, w=w, s=s)


def ages(rng):
  a, b = (pick(rng, NAMES) for _ in range(2))
  while b == a:
    b = pick(rng, NAMES)
  k, young, n = int(rng.integers(2, 5)), int(rng.integers(3, 15)), int(rng.integers(2, 11))
  total = k * young + young + 2 * n
  text = (f"{a} is {k} times as old as {b}. In {n} years, the sum of their ages will be "
          f"{total}. How old is {a} now?")
  return text, Fraction(k * young), dict(k=k, n=n, total=total)


def discount_tax(rng):
  item = pick(rng, ["jacket", "bicycle", "lamp", "backpack", "pair of boots", "printer"])
  p, d, t = int(rng.integers(4, 40) * 5), int(pick(rng, [10, 15, 20, 25, 30, 40])), \
      int(pick(rng, [5, 8, 10, 20]))
  text = (f"A {item} costs ${p}. It is on sale for {d}% off, and then a {t}% sales tax is added "
          f"to the sale price. What is the final price?")
  return text, Fraction(p) * (100 - d) / 100 * (100 + t) / 100, dict(p=p, d=d, t=t)


def tank_fraction(rng):
  cap = int(rng.integers(4, 21) * 10)
  num, den = int(rng.integers(1, 4)), 4
  used = int(rng.integers(1, max(2, cap * num // den // 5)) * 5)    # less than the tank holds
  text = (f"A water tank holds {cap} litres and is {num}/{den} full. After {used} litres are "
          f"used, what fraction of the tank is full? Give the answer as a simplified fraction.")
  return text, (Fraction(cap * num, den) - used) / cap, dict(cap=cap, num=num, den=den, used=used)


def garden_path(rng):
  length, width, w = int(rng.integers(6, 31)), int(rng.integers(4, 21)), int(rng.integers(1, 4))
  text = (f"A rectangular garden is {length} m long and {width} m wide. A path {w} m wide runs "
          f"all the way around the outside of it. What is the area of the path?")
  return text, Fraction((length + 2 * w) * (width + 2 * w) - length * width), \
      dict(length=length, width=width, w=w)


def recipe_packages(rng):
  g, n, pack = int(rng.integers(3, 13) * 25), int(rng.integers(4, 31)), int(pick(rng, [1, 2]))
  food = pick(rng, ["flour", "rice", "pasta", "oats", "sugar", "lentils"])
  text = (f"A recipe uses {g} g of {food} per serving. A caterer needs {n} servings, and {food} "
          f"is sold in {pack} kg bags. How many bags must the caterer buy?")
  return text, Fraction(math.ceil(g * n / (pack * 1000))), dict(g=g, n=n, pack=pack)


def work_together(rng):
  a, b = (pick(rng, NAMES) for _ in range(2))
  while b == a:
    b = pick(rng, NAMES)
  x, y = int(rng.integers(2, 13)), int(rng.integers(2, 13))
  job = pick(rng, ["paint a fence", "mow a field", "sort a pile of letters", "assemble a shed"])
  text = (f"{a} can {job} in {x} hours, and {b} can do it in {y} hours. Working together at "
          f"those rates, how long will it take them?")
  return text, Fraction(x * y, x + y), dict(x=x, y=y)


def simple_interest(rng):
  p, r, t = int(rng.integers(5, 101) * 100), int(rng.integers(2, 9)), int(rng.integers(2, 11))
  text = (f"{pick(rng, NAMES)} puts ${p} in an account that pays {r}% simple interest per year. "
          f"How much interest has been earned after {t} years, and what is the balance?")
  return text, Fraction(p * r * t, 100), dict(p=p, r=r, t=t)


def compound_interest(rng):
  p, r, t = int(rng.integers(5, 51) * 100), int(rng.integers(2, 8)), int(rng.integers(2, 4))
  text = (f"${p} is invested at {r}% interest compounded once a year. What is it worth after "
          f"{t} years? Round to the nearest cent.")
  return text, Fraction(p) * Fraction(100 + r, 100) ** t, dict(p=p, r=r, t=t)


def needed_score(rng):
  n = int(rng.integers(3, 6))
  target = int(rng.integers(70, 91))
  scores = [int(x) for x in rng.integers(60, 100, size=n)]
  need = target * (n + 1) - sum(scores)
  if not 0 <= need <= 100:     # keep the story possible: pick a target that works
    target = (sum(scores) + int(rng.integers(60, 101))) // (n + 1)
    need = target * (n + 1) - sum(scores)
  text = (f"{pick(rng, NAMES)} scored {', '.join(map(str, scores))} on the first {n} tests. "
          f"What score is needed on the next test to average exactly {target}?")
  return text, Fraction(need), dict(n=n, target=target, _scores=scores)


def ratio_share(rng):
  a, b, c = (int(x) for x in rng.integers(1, 8, size=3))
  unit = int(rng.integers(2, 30) * 5)
  total = (a + b + c) * unit
  names = [str(x) for x in rng.choice(NAMES, 3, replace=False)]
  text = (f"{names[0]}, {names[1]} and {names[2]} share ${total} in the ratio {a}:{b}:{c}. How "
          f"much does each person get, and what is the largest share?")
  return text, Fraction(max(a, b, c) * unit), dict(a=a, b=b, c=c, total=total)


def inventory(rng):
  start, sold, received = int(rng.integers(10, 50) * 10), int(rng.integers(2, 10) * 10), \
      int(rng.integers(1, 10) * 10)
  pct = int(pick(rng, [10, 20, 25, 50]))
  left = start - sold + received
  while left * pct % 100:
    received += 10
    left = start - sold + received
  item = pick(rng, SNACKS)[1]
  text = (f"A shop starts the week with {start} {item}. It sells {sold} on Monday, receives a "
          f"delivery of {received} on Tuesday, and on Wednesday sells {pct}% of what it has. How "
          f"many {item} are left?")
  return text, Fraction(left * (100 - pct), 100), dict(start=start, sold=sold,
                                                        received=received, pct=pct)


def schedule_end(rng):
  h, m = int(rng.integers(7, 11)), int(pick(rng, [0, 15, 30, 45]))
  tasks = [int(x) for x in rng.integers(2, 13, size=3) * 5]
  brk = int(pick(rng, [10, 15, 20]))
  end = h * 60 + m + sum(tasks) + 2 * brk
  text = (f"{pick(rng, NAMES)} starts work at {h}:{m:02d} a.m. and does three tasks taking "
          f"{tasks[0]}, {tasks[1]} and {tasks[2]} minutes, with a {brk}-minute break between "
          f"consecutive tasks. At what time does the last task end?")
  return text, Fraction(end), dict(_h=h, _m=m, _tasks=tasks, brk=brk)


def trains_meet(rng):
  v1, v2 = int(rng.integers(6, 16) * 10), int(rng.integers(6, 16) * 10)
  d = int((v1 + v2) * rng.integers(1, 7) // 2)
  text = (f"Two trains start {d} km apart and travel towards each other on parallel tracks, one "
          f"at {v1} km/h and the other at {v2} km/h. After how many hours do they meet?")
  return text, Fraction(d, v1 + v2), dict(d=d, v1=v1, v2=v2)


def fence_cost(rng):
  length, width, gate, cost = (int(x) for x in (rng.integers(8, 41), rng.integers(5, 31),
                                                rng.integers(1, 4), rng.integers(6, 26)))
  text = (f"A farmer fences a rectangular field {length} m by {width} m, leaving a {gate} m gap "
          f"for a gate. Fencing costs ${cost} per metre. How much does the fencing cost?")
  return text, Fraction((2 * (length + width) - gate) * cost), dict(length=length, width=width,
                                                                     gate=gate, cost=cost)


def cubes_in_box(rng):
  s = int(pick(rng, [2, 3, 4, 5]))
  dims = [int(x) * s for x in rng.integers(2, 9, size=3)]
  text = (f"A box measures {dims[0]} cm by {dims[1]} cm by {dims[2]} cm. How many cubes with "
          f"{s} cm sides fit inside if they are packed without gaps?")
  return text, Fraction(math.prod(x // s for x in dims)), dict(s=s, _dims=dims)


def overtime_pay(rng):
  rate, hours = int(rng.integers(12, 41)), int(rng.integers(41, 56))
  text = (f"{pick(rng, NAMES)} earns ${rate} an hour for the first 40 hours of a week and time "
          f"and a half for every hour after that. How much is earned in a week of {hours} "
          f"hours?")
  return text, Fraction(rate * 40) + Fraction(3 * rate, 2) * (hours - 40), dict(rate=rate,
                                                                                hours=hours)


def unit_price(rng):
  n1, n2 = int(rng.integers(2, 7)), int(rng.integers(7, 13))
  p1 = int(rng.integers(2, 9))
  p2 = max(1, p1 * n2 // n1 - int(rng.integers(1, 3)))    # the bigger pack is cheaper per unit
  units = n1 * n2
  item = pick(rng, SNACKS)[1]
  text = (f"A pack of {n1} {item} costs ${p1} and a pack of {n2} costs ${p2}. How much do you "
          f"save by buying {units} {item} in the cheaper way instead of the more expensive way?")
  return text, abs(Fraction(p1 * units, n1) - Fraction(p2 * units, n2)), dict(n1=n1, n2=n2,
                                                                              p1=p1, p2=p2)


def ladder(rng):
  a, b, c = pick(rng, [(3, 4, 5), (6, 8, 10), (5, 12, 13), (9, 12, 15), (8, 15, 17),
                       (12, 16, 20), (7, 24, 25)])
  k = int(rng.integers(1, 3))
  text = (f"A {c * k} m ladder leans against a wall with its foot {a * k} m from the wall. How "
          f"high up the wall does it reach?")
  return text, Fraction(b * k), dict(c=c * k, a=a * k)


def fuel_cost(rng):
  per100, dist, price = int(rng.integers(4, 11)), int(rng.integers(2, 13) * 50), \
      Fraction(int(rng.integers(120, 200)), 100)
  text = (f"A car uses {per100} litres of fuel per 100 km. Fuel costs {_money(price)} per "
          f"litre. How much does the fuel cost for a {dist} km trip?")
  return text, Fraction(per100 * dist, 100) * price, dict(per100=per100, dist=dist, _price=price)


def growth(rng):
  pop, pct = int(rng.integers(3, 25) * 400), int(pick(rng, [5, 10, 20]))    # whole people
  text = (f"A town has {pop} residents, and its population grows by {pct}% each year. What will "
          f"the population be after 2 years?")
  return text, Fraction(pop) * Fraction(100 + pct, 100) ** 2, dict(pop=pop, pct=pct)


def marbles(rng):
  r, b, g = (int(x) for x in rng.integers(2, 9, size=3))
  text = (f"A bag holds {r} red, {b} blue and {g} green marbles. Two marbles are drawn without "
          f"putting the first back. What is the probability that both are red?")
  total = r + b + g
  return text, Fraction(r, total) * Fraction(r - 1, total - 1), dict(r=r, b=b, g=g)


def mixture(rng):
  a, b = int(rng.integers(1, 9)), int(rng.integers(1, 9))
  x, y = int(rng.integers(1, 10) * 10), int(rng.integers(1, 10) * 10)
  text = (f"{a} litres of a drink that is {x}% juice are mixed with {b} litres of a drink that "
          f"is {y}% juice. What percentage of the mixture is juice?")
  return text, Fraction(a * x + b * y, a + b), dict(a=a, b=b, x=x, y=y)


TEMPLATES: dict[str, Callable] = {f.__name__: f for f in [
    shopping, two_legs, ages, discount_tax, tank_fraction, garden_path, recipe_packages,
    work_together, simple_interest, compound_interest, needed_score, ratio_share, inventory,
    schedule_end, trains_meet, fence_cost, cubes_in_box, overtime_pay, unit_price, ladder,
    fuel_cost, growth, marbles, mixture]}


def problem(rng: np.random.Generator, template: str | None = None) -> Problem:
  name = template or pick(rng, sorted(TEMPLATES))
  text, answer, values = TEMPLATES[name](rng)
  return Problem(name, text, Fraction(answer), values)


def math_problems(lib: Library, uses: Uses, rng: np.random.Generator,
                  n: int) -> list[Candidate]:
  out = []
  for _ in range(n):
    p = problem(rng)
    text = f"{pick(rng, INTROS)}{p.text} {pick(rng, ASKS)}".strip()
    out.append(Candidate("math", user(text), f"word problem ({p.template}) {CC0}"))
  return out
