"""What the adaptive-round scripts (switch_overhead.py, choice_host_device.py) start from: the
default model, the first suite prompts of each category as chat-templated token ids, and the generate
settings (max_new_tokens, the suite's 512-token padding)."""
import models
from jspec.prompt_suite import load, select


def default_model_and_prompts(categories: str, max_new_tokens: int, per_category: int = 1):
  """(loaded model, its tokenizer, [token ids per prompt], generate kwargs)."""
  lm = models.load("smollm2-135m-instruct")
  tok = lm.tokenizer
  prompts = select(load("benchmarks/prompts/suite.jsonl"), categories.split(","), per_category)
  ids = [tok.encode(tok.apply_chat_template(list(p.messages))) for p in prompts]
  return lm, tok, ids, dict(max_new_tokens=max_new_tokens, pad_to=512)
