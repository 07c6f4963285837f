"""The document families over third-party docs: `summarization`, `rag_qa` (a passage + a question
answerable from it), `extraction` (structured facts from a passage) and `translation`."""

from __future__ import annotations

import re

import numpy as np

from jspec.train.prompts.common import (CC0, LONG_PASSAGE, SHORT_PASSAGE, Candidate, Uses, chance,
                                        est_tokens, pick, split_long, user)
from jspec.train.prompts.passages import (Passage, api_pages, doc_params, doc_passages, doc_raises,
                                          doc_returns, prose_paragraphs, sentences)
from jspec.train.prompts.sources import Library

LONG_SHARE = {"summarization": 0.25, "rag_qa": 0.2}   # of the family's prompts
SHORT, LONG = (1100, 3000), (3000, 10000)     # passage characters, before the token bounds
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Simplified Chinese",
             "Japanese", "Russian", "Korean", "Dutch", "Polish", "Turkish", "Arabic", "Hindi",
             "Vietnamese", "Indonesian", "Swedish", "Greek", "Ukrainian", "Czech"]

SUMMARY_ASKS = [
    "Summarize the following documentation in {n} bullet points.",
    "Give me a short summary ({n} sentences) of this text.",
    "TL;DR this for me.",
    "Write a one-paragraph summary of the passage below for a {audience}.",
    "What are the key takeaways here? List at most {n}.",
    "Condense this into no more than {words} words.",
    "Summarize this for a {audience} who has never used {dist}.",
    "Can you summarize this? Keep it brief.",
    "No time to read all of this: which {n} points matter most?",
    "Write a headline and a two-sentence summary for this text.",
    "Summarize the passage as a numbered list of its main ideas.",
    "Give a one-sentence summary, then a slightly longer one.",
    "Explain the gist of this documentation in plain language.",
    "Summarize the following, focusing on what a user has to do.",
    "Produce an executive summary of this text ({words} words or fewer).",
]
AUDIENCES = ["beginner programmer", "data scientist", "product manager", "student",
             "busy engineer", "non-technical reader", "new team member", "technical writer"]
RAG_SYSTEMS = [
    "Answer only from the context the user provides. If the context does not answer the "
    "question, say that it doesn't.",
    "You answer questions about documentation. Use only the supplied excerpt and quote it where "
    "helpful.",
    "You are a documentation assistant. Base every answer strictly on the given context; do not "
    "use outside knowledge.",
]
RAG_FRAMES = [
    "Context:\n{p}\n\nQuestion: {q}",
    "<context>\n{p}\n</context>\n\n{q}",
    "Read the documentation below and answer: {q}\n\n{p}",
    "{q}\n\nUse this excerpt to answer:\n\n{p}",
    "Documentation:\n\"\"\"\n{p}\n\"\"\"\n\nBased only on the documentation above: {q}",
    "Here is some reference material.\n\n---\n{p}\n---\n\n{q} Answer briefly.",
    "{p}\n\nQ: {q}",
]
TRANSLATE_ASKS = [
    "Translate into {lang}:\n\n{t}",
    "How would you say this in {lang}?\n\n\"{t}\"",
    "Please translate the following into {lang}, keeping code names in backticks unchanged.\n\n{t}",
    "Give me a {lang} translation of this documentation snippet:\n\n{t}",
    "Translate to {lang}, then explain any technical terms you left in English.\n\n{t}",
    "I'm localizing docs for {lang}-speaking users. Translate this:\n\n{t}",
    "Translate the text below into {lang}. Use a formal register.\n\n{t}",
    "{t}\n\nTranslate that into {lang}.",
    "Can you put this into natural-sounding {lang}?\n\n{t}",
    "Translate into {lang} and also give a word-for-word gloss of the first sentence.\n\n{t}",
]


def _wrap(rng: np.random.Generator, p: Passage) -> str:
  """The passage as a user would paste it: bare, fenced by delimiters or introduced."""
  return pick(rng, [p.text, f"---\n{p.text}\n---", f'"""\n{p.text}\n"""',
                    f"<document>\n{p.text}\n</document>", f"This is {p.title}:\n\n{p.text}"])


def _cite(p: Passage, what: str) -> str:
  return f"{p.source}; {what} {CC0}"


def _fit(passages: list[Passage], lo: int, hi: int) -> list[Passage]:
  return [p for p in passages if lo <= est_tokens(p.text) <= hi]


def _pools(lib: Library, short: tuple[int, int]) -> tuple[list[Passage], list[Passage]]:
  """(short, long) passages: `short` characters (LONG for the long ones; an API page is cut as
  soon as it reaches the lower bound, so its bound is higher), then common's token bounds."""
  long_pages = api_pages(lib, LONG[0] * 7 // 5, LONG[1])
  return (_fit(doc_passages(lib, *short) + api_pages(lib, *short), 0, SHORT_PASSAGE),
          _fit(doc_passages(lib, *LONG) + long_pages, *LONG_PASSAGE))


def summarization(lib: Library, uses: Uses, rng: np.random.Generator,
                  n: int) -> list[Candidate]:
  n_short, n_long = split_long(n, LONG_SHARE["summarization"])
  short, long = _pools(lib, SHORT)
  out = []
  for pool, k in ((short, n_short), (long, n_long)):
    for p in uses.take(rng, pool, k, key=lambda p: p.key):
      dist = p.units[0].dist.name if p.units else "this library"
      ask = pick(rng, SUMMARY_ASKS).format(n=int(rng.integers(2, 6)), words=pick(rng, [40, 60, 80,
                                           100, 150]), audience=pick(rng, AUDIENCES), dist=dist)
      body = _wrap(rng, p)
      text = f"{ask}\n\n{body}" if chance(rng, 0.6) else f"{body}\n\n{ask}"
      out.append(Candidate("summarization", user(text), _cite(p, "request"), p.key, ask))
  return out


def questions(rng: np.random.Generator, p: Passage) -> list[str]:
  """Questions answerable from the passage (about its documented functions or its prose)."""
  qs = []
  for u in p.units:
    f = u.qualname
    defaults = [(n, d) for n, d in u.params if d is not None]
    if defaults:
      name, _ = pick(rng, defaults)
      qs += [f"What is the default value of the `{name}` parameter of `{f}`?",
             f"If I call `{f}` without passing `{name}`, what value does it use?"]
    required = [n for n, d in u.params if d is None and not n.startswith("*")]
    if u.params:
      qs.append(f"Which parameters of `{f}` are required, and which are optional?"
                if required and defaults else f"How many parameters does `{f}` take?")
    described = doc_params(u.doc)
    if described:
      name, _ = pick(rng, described)
      qs += [f"What is the `{name}` argument of `{f}` for?",
             f"According to the docs, what should I pass as `{name}` to `{f}`?"]
    if doc_returns(u.doc):
      qs.append(f"What does `{f}` return?")
    raises = doc_raises(u.doc)
    if raises:
      qs.append(f"When does `{f}` raise `{pick(rng, raises)}`?")
    qs.append(f"In one sentence, what does `{f}` do?")
  if len(p.units) >= 2:
    u = pick(rng, p.units)
    first = sentences(" ".join(u.doc.split("\n\n")[0].split()))
    if first and re.match(r"(Return|Compute|Create|Get|Set|Convert|Load|Save|Build|Make|Check|"
                          r"Apply|Read|Write|Add|Remove|Find|Parse)s?\b", first[0]):
      qs.append(f"Which of these functions would I use to {first[0][0].lower()}"
                f"{first[0][1:].rstrip('.')}?")
    qs.append("Which of the documented functions take no required arguments?")
  if not p.units:
    ticks = sorted(set(re.findall(r"`([A-Za-z_][\w.]{2,40})(?:\(\))?`", p.text)))
    if ticks:
      qs.append(f"What does the passage say about `{pick(rng, ticks)}`?")
    heads = re.findall(r"^#+\s+(.{4,60})$", p.text, re.MULTILINE)
    if heads:
      qs.append(f"What does the section \"{pick(rng, heads).strip()}\" explain?")
    if re.search(r"pip install|conda install", p.text):
      qs.append("How do I install it, according to this text?")
    qs += ["What is the main purpose of what this passage describes?",
           "What limitations or caveats does the text mention, if any?",
           "Who is this text written for, and what should they take away from it?",
           "According to the text, what is the first thing a new user should do?"]
  return qs


def rag_qa(lib: Library, uses: Uses, rng: np.random.Generator, n: int) -> list[Candidate]:
  n_short, n_long = split_long(n, LONG_SHARE["rag_qa"])
  short, long = _pools(lib, (500, 3000))
  out = []
  for pool, k in ((short, n_short), (long, n_long)):
    for p in uses.take(rng, pool, k, key=lambda p: p.key):
      q = pick(rng, questions(rng, p))
      system = pick(rng, RAG_SYSTEMS) if chance(rng, 0.3) else None
      text = pick(rng, RAG_FRAMES).format(p=p.text, q=q)
      out.append(Candidate("rag_qa", user(text, system), _cite(p, "question"), p.key,
                           f"{system or ''} {text.replace(p.text, '')}"))
  return out


def extraction_asks(rng: np.random.Generator, p: Passage) -> list[str]:
  asks = []
  for u in p.units[:1]:
    asks += [f"List every parameter of `{u.qualname}` as a JSON array of objects with the keys "
             f"\"name\", \"default\" (null if none) and \"description\".",
             f"Make a markdown table of the parameters of `{u.qualname}`: name, default, "
             f"meaning.",
             f"Write a YAML summary of `{u.qualname}` with the keys name, parameters, returns and "
             f"raises."]
  if len(p.units) >= 2:
    asks += ["Make a table of the functions documented here with a one-line purpose for each.",
             "Extract the name and full signature of every function below, as a JSON list.",
             "For each function below, list its parameters that have default values, with the "
             "defaults. Answer as JSON."]
  if any(doc_raises(u.doc) for u in p.units):
    asks.append("Extract every exception mentioned and the condition that triggers it, as a "
                "bullet list.")
  if re.search(r"https?://", p.text):
    asks.append("Extract all URLs in the text, each with a short label saying what it points "
                "to.")
  if re.search(r"\b\d+\.\d+(?:\.\d+)?\b", p.text):
    asks.append("Find every version number or numeric constant mentioned and say what each "
                "refers to. Answer as JSON.")
  if re.search(r"`[^`]+`", p.text):
    asks.append("List all the code identifiers that appear in backticks, without duplicates.")
  asks += ["Create a glossary of the technical terms in this passage, one line per term.",
           "Turn this text into a structured outline in JSON: a title and a list of key points.",
           "Extract the names of all libraries, modules, classes and functions mentioned, "
           "grouped by kind.",
           "Pull out every instruction or requirement the reader must follow, as a checklist."]
  return asks


def extraction(lib: Library, uses: Uses, rng: np.random.Generator, n: int) -> list[Candidate]:
  pool = _fit(doc_passages(lib, 400, 3000) + api_pages(lib, 1000, 3000), 0, SHORT_PASSAGE)
  out = []
  for p in uses.take(rng, pool, n, key=lambda p: p.key):
    ask = pick(rng, extraction_asks(rng, p))
    body = _wrap(rng, p)
    text = f"{ask}\n\n{body}" if chance(rng, 0.65) else f"{body}\n\n{ask}"
    out.append(Candidate("extraction", user(text), _cite(p, "request"), p.key, ask))
  return out


def translation(lib: Library, uses: Uses, rng: np.random.Generator,
                n: int) -> list[Candidate]:
  """Single sentences and short runs of 2-4 sentences from prose paragraphs of the docs."""
  items: list[Passage] = []
  for para in prose_paragraphs(lib):
    sents = [s for s in sentences(para.text) if 8 <= len(s.split()) <= 45]
    for i, s in enumerate(sents):
      items.append(Passage(f"{para.key}#s{i}", s, para.source, para.title, ()))
    if len(sents) >= 2 and len(para.text) <= 700:
      items.append(Passage(para.key, para.text, para.source, para.title, ()))
  out = []
  for p in uses.take(rng, items, n, key=lambda p: p.key):
    lang = pick(rng, LANGUAGES)
    text = pick(rng, TRANSLATE_ASKS).format(lang=lang, t=p.text)
    out.append(Candidate("translation", user(text), _cite(p, "request"), p.key,
                         text.replace(p.text, "")))
  return out
