"""Target-written prompts steered by family (Magpie with opening words): the target continues a
user turn that starts with one of a family's opening words, so the corpus also holds requests
phrased the way a chat user (as the target imagines one) phrases them, beside the template
families. One JSON Lines file per family; merge them with `jspec train prompts --include`.

  jspec train magpie OUT_DIR --per-family 500 [--batch-size 64] [--seed 0]
"""

from __future__ import annotations

import os

import numpy as np

from jspec.train.data import synthesize_prompts

# family -> opening words of the user turn (the target writes the rest)
STEERED = {
    "stem": ("Explain how", "Why does", "What is the difference between", "How does",
             "Can you explain the science behind", "What happens when", "Describe the process of",
             "How do scientists", "What causes", "In simple terms, what is"),
    "humanities": ("What were the main causes of", "How did", "Discuss the significance of",
                   "Compare the ideas of", "Summarize the history of", "What role did",
                   "Why is the book", "What can we learn from", "How has the meaning of",
                   "Analyze the themes of"),
    "writing": ("Write a short story about", "Write a poem about", "Compose an email to",
                "Draft a speech for", "Write a blog post about", "Rewrite the following",
                "Write a letter to", "Create a dialogue between", "Write a product description for",
                "Give me a catchy slogan for"),
    "roleplay": ("Pretend you are", "Let's role-play: you are", "Act as", "Imagine you are",
                 "You are a", "Play the role of", "Stay in character as"),
    "advice": ("How can I", "What should I do if", "Any tips for", "What's the best way to",
               "I'm struggling with", "Can you help me plan", "How do I convince",
               "Is it a good idea to"),
    "reasoning": ("A riddle:", "Solve this logic puzzle:", "If all", "Which is heavier,",
                  "Three friends", "What comes next in the sequence", "Is the following argument "
                  "valid:", "Suppose that"),
    "open": ("",),
}


def family_seed(seed: int, family: str) -> int:
  return int(np.random.SeedSequence([seed, *family.encode()]).generate_state(1)[0] >> 1)


def synthesize_families(model, tokenizer, out_dir: str, *, per_family: int, batch_size: int = 64,
                        max_new_tokens: int = 96, seed: int = 0, families=None,
                        progress: bool = True) -> dict[str, str]:
  """Samples `per_family` steered user turns for each family into out_dir/magpie_<family>.jsonl
  (resumable, deterministic: `jspec.train.data.synthesize_prompts`); returns family -> path."""
  families = list(STEERED) if families is None else list(families)
  unknown = [f for f in families if f not in STEERED]
  if unknown:
    raise ValueError(f"unknown families {unknown}; choose from {sorted(STEERED)}")
  if per_family < 1:
    raise ValueError(f"--per-family must be >= 1, got {per_family}")
  os.makedirs(out_dir, exist_ok=True)
  paths = {}
  for family in families:
    paths[family] = os.path.join(out_dir, f"magpie_{family}.jsonl")
    synthesize_prompts(model, tokenizer, paths[family], num_prompts=per_family,
                       batch_size=batch_size, max_new_tokens=max_new_tokens,
                       seed=family_seed(seed, family), openings=STEERED[family],
                       category=family, progress=progress)
  return paths
