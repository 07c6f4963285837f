"""The `writing` family: composition requests (task x topic x audience x tone x length) and
rewrites of documentation paragraphs (formal, simpler, shorter, bullet points...)."""

from __future__ import annotations

import numpy as np

from jspec.train.prompts.common import CC0, Candidate, Uses, chance, pick, user
from jspec.train.prompts.passages import prose_paragraphs
from jspec.train.prompts.sources import Library

REWRITE_SHARE = 0.25

TOPICS = [
    "working from home", "starting a vegetable garden on a balcony", "learning a second language "
    "as an adult", "reducing food waste at home", "the reopening of the town library",
    "a new protected bike lane downtown", "saving up for a first trip abroad", "volunteering at "
    "an animal shelter", "switching to a four-day work week", "the joys of baking bread",
    "a neighbourhood clean-up day", "learning to play the guitar", "moving to a new city",
    "the benefits of walking meetings", "keeping a journal", "a community repair café",
    "planning a family reunion", "getting started with birdwatching", "the first day at a new "
    "job", "digital minimalism", "a school science fair", "the history of the local bakery",
    "adopting a rescue dog", "a weekend hiking trip", "public transport improvements",
    "learning to code after forty", "running a first 10 km race", "an open-source project "
    "reaching its first release", "renovating an old bicycle", "a farmers' market opening",
    "the importance of sleep", "organising a book club", "a power outage that brought "
    "neighbours together", "switching careers into teaching", "urban beekeeping", "a rainy "
    "summer holiday", "the first snow of winter", "a small café's tenth anniversary",
    "mentoring junior colleagues", "a team hackathon", "the end of a long project", "restoring "
    "a wetland", "a tiny-house lifestyle", "learning chess online", "a grandparent's recipe "
    "book", "night photography", "a charity bake sale", "composting in an apartment",
    "a lost-and-found cat", "a museum's new dinosaur exhibit", "carpooling to work",
]
AUDIENCES = ["coworkers", "a hiring manager", "high-school students", "parents", "retirees",
             "new customers", "the city council", "a close friend", "our newsletter "
             "subscribers", "first-year university students", "small-business owners",
             "the neighbourhood association", "tech-savvy teenagers", "a landlord", "volunteers"]
TONES = ["formal", "friendly", "humorous", "enthusiastic", "professional", "warm", "concise",
         "persuasive", "nostalgic", "playful", "serious", "inspiring", "calm", "heartfelt"]
LENGTHS = ["in about {n} words", "in {k} sentences", "in under {n} words", "in {k} short "
           "paragraphs", "", "", "briefly"]
CONSTRAINTS = ["Include a call to action.", "Avoid jargon.", "Use at least one metaphor.",
               "End with a question.", "Don't use the word \"very\".", "Write it in the second "
               "person.", "Use British spelling.", "Add a catchy title.", "Keep sentences "
               "short.", "Include one concrete example.", "Start with a surprising fact.", "",
               "", ""]
TASKS = [
    "Write a {tone} email to {audience} about {topic} {length}.",
    "Write a short story about {topic} {length}. The tone should be {tone}.",
    "Write a {form} about {topic}.",
    "Write a blog post about {topic} for {audience} {length}.",
    "Write a cover letter for a {job} position. Mention {topic} as a personal interest.",
    "Write a product description for {product} aimed at {audience} {length}.",
    "Write a {tone} speech for {occasion} {length}.",
    "Write a review of {reviewed}. Make it {tone}.",
    "Write a LinkedIn post about {topic} {length}.",
    "Write a {tone} toast for {occasion}.",
    "Draft a polite complaint letter to {company} about {complaint}.",
    "Write a short dialogue between {pair} about {topic}.",
    "Write an essay outline on {topic} for {audience}.",
    "Write a newsletter introduction for {audience} about {topic} {length}.",
    "Write a thank-you note to {recipient} for {gift}.",
    "Write song lyrics about {topic} with a chorus.",
    "Write a persuasive paragraph convincing {audience} to care about {topic}.",
    "Write a FAQ section (five questions) for {product}.",
    "Write a motivational message for {audience} who are {situation}.",
    "Write a bedtime story for a {age}-year-old about {topic}.",
    "Write a job posting for a {job} at a small company {length}.",
    "Write an apology message to {recipient} for {mistake}. Keep it {tone}.",
    "Write a social media caption about {topic} with two hashtags.",
    "Write a diary entry from the point of view of someone experiencing {topic}.",
    "Write the opening paragraph of a novel that begins with {topic}.",
    "Write an invitation to {occasion} for {audience} {length}.",
]
FORMS = ["haiku", "sonnet", "limerick", "free-verse poem", "rhyming poem of four stanzas",
         "acrostic poem", "short ballad", "villanelle"]
JOBS = ["junior data analyst", "barista", "project coordinator", "nurse", "graphic designer",
        "software engineer", "library assistant", "sales associate", "teacher's aide",
        "warehouse supervisor", "UX researcher", "event planner", "lab technician"]
PRODUCTS = ["a reusable water bottle", "a noise-cancelling headset", "a handmade ceramic mug",
            "a solar phone charger", "a standing desk", "a beginner's watercolour kit", "a smart "
            "plant pot", "an ergonomic keyboard", "a travel backpack", "a board game about "
            "trains", "a subscription box of local snacks", "a lightweight tent"]
OCCASIONS = ["a colleague's retirement party", "a best friend's wedding", "a graduation "
             "ceremony", "the opening of a community garden", "an award dinner", "a team's "
             "end-of-year celebration", "a sibling's 30th birthday", "a school reunion"]
REVIEWED = ["a neighbourhood pizza place", "a budget smartphone", "a weekend pottery class",
            "a historical novel", "a city walking tour", "a cheap electric kettle", "a jazz "
            "concert", "a hotel by the sea", "a cooking app", "a pair of running shoes"]
COMPANIES = ["an internet provider", "an airline", "a furniture store", "a gym", "a delivery "
             "service", "a landlord's management company"]
COMPLAINTS = ["repeated service outages", "a delayed refund", "a damaged delivery", "being "
              "charged twice", "a cancelled booking", "a broken promise about repairs"]
PAIRS = ["a grandparent and a grandchild", "two astronauts", "a chef and a food critic",
         "a detective and a witness", "two old friends", "a teacher and a student", "a cat and "
         "a dog", "a robot and a gardener"]
RECIPIENTS = ["my aunt", "a colleague", "my neighbour", "a former teacher", "my team", "a "
              "client", "my best friend"]
GIFTS = ["a birthday present", "help with moving house", "a thoughtful book recommendation",
         "covering my shift", "a home-cooked meal", "their mentoring this year"]
MISTAKES = ["missing a meeting", "forgetting their birthday", "a late delivery", "a rude "
            "comment", "double-booking a room", "losing a borrowed book"]
SITUATIONS = ["studying for final exams", "starting a new job", "training for a marathon",
              "recovering from a setback", "learning something difficult", "moving abroad"]

REWRITES = [
    "Rewrite this paragraph in a more formal register.",
    "Rewrite this so a complete beginner can follow it.",
    "Make this paragraph about half as long without losing the key information.",
    "Turn this paragraph into a bulleted list.",
    "Rewrite this in a friendly, conversational tone for a blog.",
    "Rewrite the following in the active voice where possible.",
    "Rewrite this for a non-technical manager.",
    "Improve the flow and clarity of this paragraph. Keep the meaning.",
    "Rewrite this as a short tweet thread (three tweets).",
    "Rewrite this paragraph as if explaining it to a ten-year-old.",
    "Paraphrase this paragraph so it doesn't reuse the original sentences.",
    "Rewrite this as a short FAQ entry: a question and its answer.",
    "Make this sound more enthusiastic, as if for a product announcement.",
    "Rewrite this in plain English, removing any jargon.",
]


def _compose(rng: np.random.Generator) -> str:
  n, k = pick(rng, [80, 100, 150, 200, 250, 300, 400]), int(rng.integers(2, 6))
  text = pick(rng, TASKS).format(
      tone=pick(rng, TONES), audience=pick(rng, AUDIENCES), topic=pick(rng, TOPICS),
      length=pick(rng, LENGTHS).format(n=n, k=k), form=pick(rng, FORMS), job=pick(rng, JOBS),
      product=pick(rng, PRODUCTS), occasion=pick(rng, OCCASIONS), reviewed=pick(rng, REVIEWED),
      company=pick(rng, COMPANIES), complaint=pick(rng, COMPLAINTS), pair=pick(rng, PAIRS),
      recipient=pick(rng, RECIPIENTS), gift=pick(rng, GIFTS), mistake=pick(rng, MISTAKES),
      situation=pick(rng, SITUATIONS), age=int(rng.integers(4, 10)))
  text = " ".join(text.replace(" .", ".").split())
  extra = pick(rng, CONSTRAINTS) if chance(rng, 0.5) else ""
  return f"{text} {extra}".strip()


def writing(lib: Library, uses: Uses, rng: np.random.Generator, n: int) -> list[Candidate]:
  n_rewrite = int(round(n * REWRITE_SHARE))
  out = [Candidate("writing", user(_compose(rng)), f"writing request {CC0}")
         for _ in range(n - n_rewrite)]
  paras = prose_paragraphs(lib, lo=300, hi=1300)
  for p in uses.take(rng, paras, n_rewrite, key=lambda p: p.key):
    ask = pick(rng, REWRITES)
    text = f"{ask}\n\n{p.text}" if chance(rng, 0.7) else f"{p.text}\n\n{ask}"
    out.append(Candidate("writing", user(text), f"{p.source}; request {CC0}", p.key, ask))
  return out
