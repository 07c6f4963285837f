"""Tokenizers rebuilt from GGUF metadata or read from `tokenizer.json`, with jinja2 chat templates."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from models.errors import ModelLoadError, UnsupportedModelError

_CONTROL = 3  # llama.cpp token_type for control (special) tokens


class Tokenizer:

  def __init__(self, backend, *, bos_id: int | None, eos_ids: Sequence[int],
               chat_template: str | None, add_bos: bool = False):
    self.backend = backend
    self.bos_id = bos_id
    self.eos_ids = tuple(int(i) for i in eos_ids)
    self.chat_template = chat_template
    self.add_bos = add_bos

  @property
  def vocab_size(self) -> int:
    return self.backend.get_vocab_size(with_added_tokens=True)

  def token(self, token_id: int) -> str:
    return self.backend.id_to_token(token_id)

  def encode(self, text: str) -> list[int]:
    check_text(text)
    ids = self.backend.encode(text, add_special_tokens=False).ids
    if self.add_bos and self.bos_id is not None:
      ids = [self.bos_id] + ids
    return ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    return self.backend.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: Sequence[dict[str, str]],
                          add_generation_prompt: bool = True) -> str:
    if not self.chat_template:
      raise ValueError("this tokenizer has no chat template; pass raw text (--raw in the CLI)")
    for i, m in enumerate(messages):
      if not isinstance(m, dict) or "role" not in m or "content" not in m:
        raise ValueError(f"message {i} must be a dict with 'role' and 'content', got {m!r}")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
      raise ValueError(f"chat template: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    tmpl = env.from_string(self.chat_template)
    bos = self.token(self.bos_id) if self.bos_id is not None else ""
    eos = self.token(self.eos_ids[0]) if self.eos_ids else ""
    return tmpl.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                       bos_token=bos, eos_token=eos)

  # Construction ---------------------------------------------------------------------------------

  @classmethod
  def from_gguf_metadata(cls, meta: dict[str, Any]) -> "Tokenizer":
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
      raise UnsupportedModelError(
          f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                                     byte_fallback=False))
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre == "smollm" or pre == "default" or pre == "gpt-2":
      # SmolLM2 (StarCoder-style): split digits one by one, then GPT-2 byte-level splitting.
      steps = [pre_tokenizers.Digits(individual_digits=True)] if pre == "smollm" else []
      steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    elif pre in ("qwen2", "llama3", "llama-bpe"):
      pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 if pre == "qwen2" else
                 r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}")
      pattern += r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
      steps = [pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    else:
      raise UnsupportedModelError(f"GGUF pre-tokenizer {pre!r} is not supported")
    backend.pre_tokenizer = pre_tokenizers.Sequence(steps)
    backend.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None:
      special = [AddedToken(tokens[i], special=True, normalized=False)
                 for i, ty in enumerate(types) if int(ty) == _CONTROL]
      backend.add_special_tokens(special)
    eos = meta.get("tokenizer.ggml.eos_token_id")
    eot = meta.get("tokenizer.ggml.eot_token_id")
    eos_ids = [int(i) for i in (eos, eot) if i is not None]
    return cls(backend, bos_id=meta.get("tokenizer.ggml.bos_token_id"),
               eos_ids=sorted(set(eos_ids)), chat_template=meta.get("tokenizer.chat_template"),
               add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)))

  @classmethod
  def from_folder(cls, folder: str) -> "Tokenizer":
    """Reads `tokenizer.json` (+ `tokenizer_config.json`, `generation_config.json`) from a folder."""
    from tokenizers import Tokenizer as HFTokenizer

    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
      raise ModelLoadError(f"{folder!r} has no tokenizer.json")
    backend = HFTokenizer.from_file(path)
    conf = _read_json(os.path.join(folder, "tokenizer_config.json"))
    gen = _read_json(os.path.join(folder, "generation_config.json"))

    def token_id(tok):
      if isinstance(tok, dict):
        tok = tok.get("content")
      return backend.token_to_id(tok) if tok else None

    eos_ids = gen.get("eos_token_id", token_id(conf.get("eos_token")))
    eos_ids = [eos_ids] if isinstance(eos_ids, int) else [i for i in (eos_ids or []) if i is not None]
    template = conf.get("chat_template")
    jinja_path = os.path.join(folder, "chat_template.jinja")   # transformers >= 4.50 writes this
    if template is None and os.path.isfile(jinja_path):
      with open(jinja_path) as f:
        template = f.read()
    return cls(backend, bos_id=token_id(conf.get("bos_token")), eos_ids=eos_ids,
               chat_template=template, add_bos=bool(conf.get("add_bos_token")))


def check_text(text, what: str = "text") -> None:
  """Raises ValueError unless `text` is a str that encodes as UTF-8 (command-line arguments with
  undecodable bytes arrive as lone surrogates, which the tokenizer cannot take)."""
  if not isinstance(text, str):
    raise ValueError(f"{what} must be a str, got {type(text).__name__}"
                     + ("; decode it first, e.g. data.decode('utf-8')" if isinstance(
                         text, (bytes, bytearray)) else ""))
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    ch = ord(text[e.start])   # surrogateescape keeps an undecodable byte b as U+DC00 + b
    bad = f"byte 0x{ch - 0xDC00:02x}" if 0xDC80 <= ch <= 0xDCFF else f"lone surrogate U+{ch:04X}"
    raise ValueError(f"{what} is not valid UTF-8 ({bad} at character {e.start}); "
                     "pass UTF-8 text") from None


def _read_json(path: str) -> dict:
  if not os.path.isfile(path):
    return {}
  with open(path) as f:
    return json.load(f)
