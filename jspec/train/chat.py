"""The chat template as the data steps need it: the rendered text around each message's content,
the user header a Magpie prompt continues, the glue between turns for multi-turn continuation, and
the cleaning of a sampled user turn."""

from __future__ import annotations

from typing import Sequence

MIN_PROMPT_CHARS = 8          # shorter sampled user turns are dropped as degenerate
_PLACEHOLDER = "JSPECPLACEHOLDER{}X7F3A"


def _render_split(tokenizer, messages: Sequence[dict], add_generation_prompt: bool) -> list[str]:
  """Renders `messages` with each content replaced by a placeholder and returns the template text
  around the contents: len(messages) + 1 segments."""
  holders = [_PLACEHOLDER.format(i) for i in range(len(messages))]
  text = tokenizer.apply_chat_template(
      [{"role": m["role"], "content": h} for m, h in zip(messages, holders)],
      add_generation_prompt=add_generation_prompt)
  segments = []
  for m, h in zip(messages, holders):
    if text.count(h) != 1:
      raise ValueError(
          f"the chat template does not insert the {m['role']} message verbatim (a placeholder "
          f"content was found {text.count(h)} times in the rendered text, expected once); "
          "Magpie-style sampling and multi-turn continuation need a template that places each "
          "message's content as is")
    before, text = text.split(h)
    segments.append(before)
  segments.append(text)
  return segments


def user_header(tokenizer, system: str | None = None) -> str:
  """The rendered chat template up to where the (first) user message's content begins, e.g. for
  SmolLM2 '<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\n'."""
  messages = ([{"role": "system", "content": system}] if system else []) + \
      [{"role": "user", "content": ""}]
  segments = _render_split(tokenizer, messages, add_generation_prompt=False)
  return "".join(s + m["content"] for s, m in zip(segments[:-2], messages[:-1])) + segments[-2]


def turn_glue(tokenizer, messages: Sequence[dict]) -> tuple[str, str]:
  """Template text after an assistant reply to `messages` up to the next user content, and after
  that user content up to the next assistant reply (the generation prompt)."""
  n = len(messages)
  segments = _render_split(tokenizer, list(messages) + [{"role": "assistant", "content": "a"},
                                                        {"role": "user", "content": "u"}],
                           add_generation_prompt=True)
  prefix = "".join(s + m["content"] for s, m in zip(segments[:n], messages)) + segments[n]
  if prefix != tokenizer.apply_chat_template(list(messages), add_generation_prompt=True):
    raise ValueError("the chat template renders earlier turns differently once a turn is added; "
                     "multi-turn continuation needs a prefix-stable template (use multi_turn=0)")
  return segments[n + 1], segments[n + 2]


def encode_piece(tokenizer, text: str) -> list[int]:
  """Token ids of a piece of text inside a conversation (no BOS even if the tokenizer adds one)."""
  ids = list(tokenizer.encode(text))
  bos = getattr(tokenizer, "bos_id", None)
  if getattr(tokenizer, "add_bos", False) and ids and ids[0] == bos:
    ids = ids[1:]
  return ids


def prompt_ids(tokenizer, messages: Sequence[dict]) -> list[int]:
  # the library's convention for a chat prompt (README, CLI, bench)
  return list(tokenizer.encode(tokenizer.apply_chat_template(list(messages))))


def clean_user_turn(tokenizer, ids: Sequence[int], drop_truncated: bool,
                     opening: str = "") -> tuple[str | None, str]:
  """A sampled user turn (continuing `opening`) -> (stripped text or None, reason)."""
  eos = set(tokenizer.eos_ids)
  stopped = bool(ids) and ids[-1] in eos
  body = list(ids[:-1] if stopped else ids)
  if not stopped and drop_truncated:
    return None, "truncated"
  text = tokenizer.decode(body)
  if tokenizer.decode(body, skip_special_tokens=True) != text:
    return None, "special_tokens"
  if not text.strip():
    return None, "empty"
  if len(text.strip()) < MIN_PROMPT_CHARS:
    return None, "too_short"
  return (opening + text).strip(), "kept"
