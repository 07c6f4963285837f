"""The `advice` family: everyday how-to questions, science explanations and history / humanities
questions, built from topic pools with an optional bit of context about the asker."""

from __future__ import annotations

import numpy as np

from jspec.train.prompts.common import CC0, Candidate, Uses, chance, pick, user
from jspec.train.prompts.sources import Library

EVERYDAY = {
    "cooking": ["cook rice without it going mushy", "plan a week of cheap vegetarian dinners",
                "keep herbs fresh longer", "make a basic tomato sauce", "bake bread without a "
                "mixer", "sharpen a kitchen knife", "cook for a dinner party of eight",
                "use up leftover vegetables", "season a cast-iron pan", "meal-prep lunches"],
    "travel": ["pack for a two-week trip in a carry-on", "deal with jet lag", "plan a road "
               "trip on a budget", "find quiet places in a touristy city", "travel by train "
               "across Europe", "prepare for a long-haul flight", "travel with a toddler",
               "choose travel insurance", "stay safe when hiking alone", "learn basic phrases "
               "before a trip"],
    "study": ["prepare for a maths exam in three weeks", "take better lecture notes", "stop "
              "procrastinating on an essay", "memorise vocabulary", "study in a noisy house",
              "form a useful study group", "read academic papers faster", "balance study "
              "and a part-time job", "revise for several exams at once", "write a strong "
              "thesis statement"],
    "careers": ["ask for a raise", "prepare for a job interview", "change careers at 35",
                "write a CV with little experience", "negotiate a job offer", "give feedback "
                "to a colleague", "run an effective meeting", "find a mentor", "handle a "
                "difficult manager", "decide between two job offers"],
    "home": ["remove a red wine stain", "fix a dripping tap", "declutter a small flat",
             "keep a house cool in summer without air conditioning", "paint a room neatly",
             "organise a small kitchen", "reduce the heating bill", "hang shelves on a "
             "plaster wall", "get rid of condensation on windows", "childproof a living room"],
    "gardening": ["grow tomatoes in pots", "start a compost heap", "keep slugs off "
                  "lettuces", "choose plants for a shady corner", "care for a fiddle-leaf "
                  "fig", "grow herbs on a windowsill", "attract bees to a garden", "prune an "
                  "apple tree", "water a garden during a drought", "plant bulbs for spring"],
    "money": ["make a simple monthly budget", "build an emergency fund", "split bills "
              "fairly with flatmates", "stop impulse buying", "save for a holiday",
              "understand a payslip", "plan for a big purchase", "keep track of "
              "subscriptions", "teach a teenager about money", "prepare for a rent increase"],
    "productivity": ["plan a busy week", "stop checking my phone so often", "keep a to-do "
                     "list that actually works", "focus while working from home", "say no "
                     "to extra work politely", "build a morning routine", "manage email "
                     "overload", "prioritise when everything is urgent", "take better "
                     "breaks", "start a habit and keep it"],
    "technology": ["back up photos from my phone", "choose a password manager", "speed up "
                   "an old laptop", "set up parental controls", "spot a phishing email",
                   "organise files on my computer", "choose a first programming language",
                   "improve home Wi-Fi coverage", "keep my accounts secure", "move to a new "
                   "phone without losing data"],
    "hobbies": ["get started with watercolour painting", "learn to juggle", "choose a first "
                "telescope", "start running", "learn chess openings", "begin knitting",
                "take better photos with a phone", "start a podcast", "learn to sketch "
                "people", "build a first model railway"],
    "social": ["make friends in a new city", "start a conversation at a networking event",
               "write a good wedding speech", "resolve a disagreement with a flatmate",
               "host a relaxed dinner party", "remember people's names", "give a "
               "thoughtful gift on a budget", "politely leave a conversation", "keep in "
               "touch with old friends", "welcome a new neighbour"],
    "pets": ["house-train a puppy", "introduce a new cat to an older cat", "keep a dog "
             "calm during fireworks", "choose a first pet for a child", "travel with a cat",
             "teach a dog to walk on a loose lead", "set up a fish tank", "keep a rabbit "
             "entertained", "trim a dog's nails", "look after a pet while working full time"],
}
EVERYDAY_ASKS = [
    "How do I {x}?", "What's the best way to {x}?", "Any tips on how to {x}?",
    "Can you give me a step-by-step plan to {x}?", "I've never tried to {x} before. Where "
    "should I start?", "What are common mistakes people make when they {x}?",
    "Give me five practical tips to {x}.", "I keep failing to {x}. What am I doing wrong?",
    "Explain how to {x}, briefly.", "What do I need to {x}, and how long does it take?",
]
ASKERS = ["I'm a student.", "I'm a busy parent.", "I'm a complete beginner.", "I live in a "
          "small flat.", "I'm on a tight budget.", "I only have weekends free.", "I'm "
          "retired and have plenty of time.", "I'm new to the country.", "", "", "", ""]
STEM = ["photosynthesis", "how vaccines train the immune system", "plate tectonics",
        "how a refrigerator moves heat", "why the sky is blue", "how GPS works out your "
        "position", "the greenhouse effect", "how batteries store energy", "natural "
        "selection", "how airplanes generate lift", "the water cycle", "how a transistor "
        "works", "what DNA replication is", "how compilers turn code into machine code",
        "the difference between weather and climate", "how tides work", "entropy",
        "how a neural network learns", "why ice floats", "how the heart pumps blood",
        "public-key cryptography", "how solar panels make electricity", "black holes",
        "the Doppler effect", "how antibiotics work", "why we have seasons", "how sound "
        "travels", "what a prime number is and why they matter", "how rainbows form",
        "the speed of light", "how earthquakes are measured", "what an algorithm is",
        "how hash tables work", "the Pythagorean theorem", "exponential growth",
        "how the internet routes data", "how a car engine works", "what probability means",
        "how bridges carry loads", "the periodic table", "how eyes see colour",
        "fermentation", "how magnets work", "what a derivative is in calculus", "osmosis",
        "how clouds form", "the Big Bang theory", "how recycling plastic works",
        "what inflation is in economics", "how a vaccine trial is designed"]
STEM_ASKS = [
    "Explain {x} in simple terms.", "Can you explain {x} to a 12-year-old?", "I never "
    "understood {x}. Can you help?", "Give me an intuitive explanation of {x}, then a more "
    "precise one.", "What is {x}? Use an analogy.", "Explain {x} as if I were a university "
    "student.", "Write a short explainer on {x} with one worked example.", "What are the "
    "most common misconceptions about {x}?", "Summarize {x} in three sentences.",
]
HISTORY = ["the fall of the Western Roman Empire", "the French Revolution", "the Industrial "
           "Revolution", "the First World War", "the Renaissance", "the printing press's "
           "spread in Europe", "the Cold War", "the collapse of the Bronze Age "
           "civilisations", "the abolition of slavery in the British Empire", "the Meiji "
           "Restoration", "the Protestant Reformation", "the American Civil War", "the "
           "Black Death", "the Silk Road trade", "the end of apartheid", "the moon landing",
           "the rise of the Mongol Empire", "the Great Depression", "the invention of "
           "writing", "the decolonisation of Africa", "the fall of the Berlin Wall", "the "
           "Scientific Revolution", "the Age of Exploration", "the Russian Revolution",
           "the founding of the United Nations", "the Viking expansion", "the Ottoman "
           "Empire's decline", "the women's suffrage movement", "the agricultural "
           "revolution", "the construction of the pyramids"]
HISTORY_ASKS = [
    "Explain the causes of {x}.", "What were the main consequences of {x}?", "Why is {x} "
    "considered so important?", "Give me a short timeline of {x}.", "What would a student "
    "need to know about {x} for an exam?", "How do historians disagree about {x}?",
    "Describe everyday life during {x}.", "What lessons, if any, does {x} hold for today?",
    "Compare the causes and the effects of {x}.",
]
HUMANITIES = ["utilitarianism and deontology", "realism and impressionism in painting",
              "democracy and republic", "epic poetry and the novel", "stoicism and "
              "epicureanism", "baroque and classical music", "myth and legend", "free "
              "trade and protectionism", "tragedy and comedy in Greek theatre",
              "modernism and postmodernism", "rights and duties", "urban and rural life"]
HUMANITIES_ASKS = ["What's the difference between {x}?", "Compare {x}, with an example of "
                   "each.", "Explain {x} and why the distinction matters.",
                   "Write a short comparison of {x} for a student."]
SHAPES = ["", "", "", " Keep it short.", " Use bullet points.", " Give examples.",
          " Please be practical.", " Answer in under 150 words."]


def _one(rng: np.random.Generator) -> str:
  kind = rng.choice(4, p=[0.5, 0.25, 0.17, 0.08])
  if kind == 0:
    x = pick(rng, pick(rng, list(EVERYDAY.values())))
    text = pick(rng, EVERYDAY_ASKS).format(x=x)
    asker = pick(rng, ASKERS)
    text = f"{asker} {text}" if asker and chance(rng, 0.5) else text
  elif kind == 1:
    text = pick(rng, STEM_ASKS).format(x=pick(rng, STEM))
  elif kind == 2:
    text = pick(rng, HISTORY_ASKS).format(x=pick(rng, HISTORY))
  else:
    text = pick(rng, HUMANITIES_ASKS).format(x=pick(rng, HUMANITIES))
  return (text + pick(rng, SHAPES)).strip()


def advice(lib: Library, uses: Uses, rng: np.random.Generator, n: int) -> list[Candidate]:
  return [Candidate("advice", user(_one(rng)), f"question {CC0}") for _ in range(n)]
