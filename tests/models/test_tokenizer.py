"""The tokenizer rebuilt from GGUF metadata against transformers' tokenizer of the same file."""

import pytest

from models import Tokenizer

pytestmark = pytest.mark.slow

TEXTS = [
    "Hello, world!",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "    indented\t\ttabs   and    runs of     spaces\n\n\n",
    "Numbers: 1234567890, 3.14159, -42, 1e-9, 2026-11-30",
    "Unicode: café, naïve, Zürich, 東京, Привет мир, emoji 🎉🚀, math ∑∫√",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "Mixed <|endoftext|> special tokens <|im_end|> inside text",
    "x" * 300 + " " + "ab" * 50,
    "",
    "   leading spaces and trailing   ",
    "SELECT * FROM users WHERE id = 'x'; -- comment\n{\"json\": [1, 2, {\"k\": null}]}",
]


def test_encode_matches_transformers(smollm, hf_tokenizer):
  tok = smollm.tokenizer
  for text in TEXTS:
    assert tok.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False), text


def test_decode_round_trip(smollm):
  tok = smollm.tokenizer
  for text in TEXTS:
    assert tok.decode(tok.encode(text)) == text


def test_special_tokens_are_single_ids(smollm):
  tok = smollm.tokenizer
  for name in ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]:
    ids = tok.encode(name)
    assert len(ids) == 1 and tok.token(ids[0]) == name
  assert tok.eos_ids == (tok.encode("<|im_end|>")[0],)


def test_chat_template_matches_transformers(smollm, hf_tokenizer):
  messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]
  for msgs in (messages, messages[1:2]):
    ours = smollm.tokenizer.apply_chat_template(msgs)
    theirs = hf_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert ours == theirs


def test_tokenizer_json_folder_matches_gguf(smollm, hf_tokenizer, tmp_path):
  hf_tokenizer.save_pretrained(tmp_path)
  folder_tok = Tokenizer.from_folder(str(tmp_path))
  for text in TEXTS:
    assert folder_tok.encode(text) == smollm.tokenizer.encode(text)
  assert folder_tok.chat_template == smollm.tokenizer.chat_template
  assert folder_tok.eos_ids == smollm.tokenizer.eos_ids
