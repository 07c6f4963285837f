"""The `roleplay` family: a persona and a scenario, given as a system message or inside the user
turn, and the user's opening line in character."""

from __future__ import annotations

import numpy as np

from jspec.train.prompts.common import CC0, Candidate, Uses, chance, pick, user
from jspec.train.prompts.sources import Library

# (persona, the user's possible roles, things the user asks about)
PERSONAS = [
    ("a ship's captain on a nineteenth-century clipper", ["a passenger", "a new deckhand",
     "a stowaway who was just found"], ["the weather ahead", "life at sea", "how to tie a "
     "bowline", "the next port", "the ship's cargo"]),
    ("a medieval blacksmith", ["a young apprentice", "a travelling knight", "a curious "
     "merchant"], ["how a sword is forged", "the price of horseshoes", "the best iron",
     "village gossip", "tempering steel"]),
    ("a friendly museum guide at a natural history museum", ["a visiting student", "a "
     "tourist", "a parent with two children"], ["the dinosaur skeletons", "the oldest "
     "fossil", "how meteorites are identified", "the gem collection", "the museum's history"]),
    ("a detective in 1920s Chicago", ["a nervous witness", "a rookie officer", "a newspaper "
     "reporter"], ["the missing jewels", "last night's alibi", "a strange footprint",
     "the case so far", "a mysterious letter"]),
    ("an astronaut on the International Space Station", ["a school student on a radio call",
     "a mission controller", "a journalist"], ["sleeping in zero gravity", "the view of "
     "Earth", "daily exercise", "eating in space", "a spacewalk"]),
    ("a barista at a busy neighbourhood café", ["a first-time customer", "a regular", "a "
     "new coworker"], ["the difference between a latte and a flat white", "today's special",
     "decaf options", "how to steam milk", "the coffee beans"]),
    ("a park ranger in a mountain national park", ["a hiker", "a family on a camping trip",
     "a wildlife photographer"], ["bear safety", "the best trail for beginners", "weather "
     "on the summit", "where to see elk", "campfire rules"]),
    ("a wise old librarian", ["a student writing a thesis", "a child looking for a book",
     "a new volunteer"], ["finding sources", "a good mystery novel", "the archive", "how "
     "books are catalogued", "the library's oldest book"]),
    ("a personal trainer at a local gym", ["a complete beginner", "someone returning after "
     "an injury", "a busy parent"], ["a first workout plan", "warming up properly",
     "staying motivated", "how often to train", "stretching"]),
    ("a tour guide in ancient Rome", ["a time-travelling tourist", "a merchant from Gaul",
     "a young senator's son"], ["the Colosseum", "the Forum", "what Romans eat", "the "
     "baths", "chariot races"]),
    ("a customer support agent for an internet provider", ["a customer with a slow "
     "connection", "a customer moving house", "a confused new subscriber"], ["the router "
     "lights", "upgrading the plan", "a billing question", "the Wi-Fi password",
     "a scheduled outage"]),
    ("a chef running a small Italian restaurant", ["a cooking-class student", "a food "
     "critic", "a new line cook"], ["fresh pasta", "the secret of a good risotto",
     "tonight's menu", "kitchen hygiene", "choosing olive oil"]),
    ("a wizard mentor in a fantasy academy", ["a first-year apprentice", "a visiting "
     "scholar", "a nervous student before an exam"], ["the first spell to learn",
     "potion ingredients", "the forbidden library", "magical creatures", "the history of "
     "the academy"]),
    ("a job interviewer for a software company", ["a candidate for a junior role",
     "a candidate switching careers", "an intern applicant"], ["the team's work",
     "the interview process", "a behavioural question", "a small coding question",
     "the company culture"]),
    ("a pirate quartermaster", ["a new recruit", "a captured navy officer", "a village "
     "trader"], ["sharing the treasure", "the ship's rules", "the map", "the next raid",
     "life aboard"]),
    ("a kind primary-school teacher", ["a pupil who is stuck on fractions", "a worried "
     "parent", "a student teacher"], ["fractions", "the class project", "reading at home",
     "the school trip", "making friends"]),
    ("a travel agent specialising in Japan", ["a honeymooning couple", "a solo backpacker",
     "a family of four"], ["a ten-day itinerary", "rail passes", "cherry blossom season",
     "etiquette in temples", "staying in a ryokan"]),
    ("a lighthouse keeper on a remote island", ["a stranded sailor", "a visiting "
     "writer", "a supply-boat captain"], ["the storm last night", "how the lamp works",
     "loneliness", "the island's birds", "old shipwrecks"]),
    ("a Socratic philosophy tutor", ["a first-year student", "a curious engineer",
     "a sceptical sixth-former"], ["what justice is", "free will", "whether knowledge is "
     "possible", "the good life", "a thought experiment"]),
    ("a retro video-game shop owner", ["a collector", "a teenager new to old consoles",
     "a parent buying a gift"], ["a rare cartridge", "cleaning old consoles", "the best "
     "8-bit games", "prices", "repairing a controller"]),
    ("an air-traffic controller at a small airport", ["a student pilot", "a visiting "
     "journalist", "a nervous passenger on a tour"], ["landing clearance", "the radar "
     "screen", "fog procedures", "radio phrases", "a busy morning"]),
    ("a gardener at a botanical garden", ["a visitor", "a volunteer", "a school group's "
     "teacher"], ["the greenhouse orchids", "composting", "the oldest tree", "pruning "
     "roses", "carnivorous plants"]),
    ("a hotel concierge in Paris", ["a guest arriving late", "a business traveller",
     "a couple celebrating an anniversary"], ["dinner reservations", "museum tickets",
     "getting to the airport", "a rainy-day plan", "a lost suitcase"]),
    ("an enthusiastic science-fair judge", ["a young exhibitor", "a teacher", "a parent"],
     ["the volcano project", "the judging criteria", "how to present results",
      "the winning entry", "improving an experiment"]),
    ("a stern but fair drill sergeant", ["a new recruit", "a recruit who overslept",
     "a visiting officer"], ["the morning run", "the rules of the barracks", "the "
     "obstacle course", "teamwork", "inspection day"]),
    ("a bookshop owner who loves science fiction", ["a customer looking for a gift",
     "a book-club organiser", "a teenager who dislikes reading"], ["a first sci-fi novel",
     "classic authors", "a short story collection", "upcoming releases", "space operas"]),
    ("a time traveller from the year 2300", ["a curious historian", "a sceptical "
     "journalist", "a child"], ["the future of cities", "how you travel", "what happened "
     "to the internet", "food in 2300", "why you came back"]),
    ("a veterinary nurse at a small-animal clinic", ["a pet owner with a new kitten",
     "a worried dog owner", "a work-experience student"], ["the first vaccinations",
     "a dog that won't eat", "clipping claws", "pet insurance", "a check-up"]),
    ("a mountain guide leading a glacier trek", ["a first-time trekker", "a photographer",
     "a group leader"], ["crampons", "crevasse safety", "altitude sickness", "the route",
     "the weather window"]),
    ("a shopkeeper in a fantasy village", ["an adventurer", "a thief pretending to be a "
     "customer", "a lost traveller"], ["healing potions", "the map to the old mine",
     "rumours in town", "a haggled price", "the dragon sightings"]),
]
SYSTEMS = [
    "You are {persona}. Stay in character throughout the conversation. {style}",
    "Role-play as {persona}. The user is {role}. {style}",
    "Act as {persona}. Answer in character, {style_lower}",
    "You are playing {persona} in an interactive story. {style} Never break character.",
]
STYLES = ["Keep your replies short and vivid.", "Speak warmly and a little old-fashioned.",
          "Use plenty of sensory detail.", "Be patient and explain things simply.",
          "Be witty, but stay helpful.", "Answer in two or three paragraphs.",
          "Ask the user a question back now and then.", "Use the vocabulary of your trade."]
OPENINGS = [
    "Hello! I'm {role}. Could you tell me about {thing}?",
    "Excuse me, {thing} has me puzzled. Can you explain?",
    "Good day. As {role}, I was hoping you could help me with {thing}.",
    "I've heard stories about {thing}. Are they true?",
    "Before anything else, what should I know about {thing}?",
    "*walks in, looking around* So... what can you tell me about {thing}?",
    "I have to ask about {thing}. What's your take?",
    "Sorry to bother you. I'm {role} and I'm completely new to all this. Where do I start "
    "with {thing}?",
    "What's the one thing about {thing} that most people get wrong?",
    "Can you show me how {thing} works, step by step?",
    "Tell me a story about {thing} from your own experience.",
    "Quick question about {thing}: is it as hard as it sounds?",
]
SINGLE_TURN = [
    "Let's role-play. You are {persona} and I am {role}. {opening}",
    "Pretend you're {persona}. I'll be {role}. Here's my first line: \"{opening}\"",
    "Play the part of {persona}; I'm {role}. {style} {opening}",
    "I want to practise a conversation. You're {persona}, I'm {role}. Start by answering "
    "this: {opening}",
]


def roleplay(lib: Library, uses: Uses, rng: np.random.Generator, n: int) -> list[Candidate]:
  out = []
  for _ in range(n):
    persona, roles, things = pick(rng, PERSONAS)
    role, style = pick(rng, roles), pick(rng, STYLES)
    opening = pick(rng, OPENINGS).format(role=role, thing=pick(rng, things))
    opening = opening[0].upper() + opening[1:]
    fill = dict(persona=persona, role=role, style=style,
                style_lower=style[0].lower() + style[1:], opening=opening)
    if chance(rng, 0.6):
      messages = user(opening, pick(rng, SYSTEMS).format(**fill))
    else:
      messages = user(" ".join(pick(rng, SINGLE_TURN).format(**fill).split()))
    out.append(Candidate("roleplay", messages, f"role-play prompt {CC0}"))
  return out
