"""Plain decoding: batched equals row-by-row, compiles once, exact EOS / max_new_tokens, seeded
sampling, clear errors for bad input."""

import jax
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, count_compiles
from jspec.cli import main as cli_main
from models import Llama, LlamaConfig

CFG = LlamaConfig.tiny()


@pytest.fixture(scope="module")
def tiny():
  return Llama(CFG, rngs=nnx.Rngs(7))


def _prompts(seed, lengths):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, CFG.vocab_size, n).tolist() for n in lengths]


@pytest.mark.slow
def test_batched_equals_row_by_row_default_model(smollm, chat_ids):
  decoder = Decoder(smollm.model)
  batched = decoder.generate(chat_ids, max_new_tokens=12, eos=False).token_ids
  assert len({len(p) for p in chat_ids}) > 1     # ragged prompts
  for ids, row in zip(chat_ids, batched):
    assert decoder.generate([ids], max_new_tokens=12, eos=False).token_ids[0] == row


def test_batched_equals_row_by_row_sampled(tiny):
  """With per-row seeds a row's sampled output does not depend on the rest of the batch."""
  prompts = _prompts(0, [3, 11, 6])
  decoder = Decoder(tiny)
  kw = dict(max_new_tokens=10, temperature=[0.0, 0.8, 1.0], top_k=[0, 0, 20], top_p=[1.0, 0.9, 1.0])
  batched = decoder.generate(prompts, seed=[11, 12, 13], **kw).token_ids
  for i, p in enumerate(prompts):
    single = decoder.generate([p], seed=[11 + i], max_new_tokens=10, temperature=kw["temperature"][i],
                              top_k=kw["top_k"][i], top_p=kw["top_p"][i]).token_ids[0]
    assert single == batched[i]


def test_seeded_and_reproducible(tiny):
  decoder = Decoder(tiny)
  prompts = _prompts(1, [5, 5])
  a = decoder.generate(prompts, max_new_tokens=16, temperature=1.0, seed=3).token_ids
  b = decoder.generate(prompts, max_new_tokens=16, temperature=1.0, seed=3).token_ids
  c = decoder.generate(prompts, max_new_tokens=16, temperature=1.0, seed=4).token_ids
  assert a == b and a != c


def test_compiles_once_for_same_static_shapes(tiny):
  decoder = Decoder(tiny)
  with count_compiles() as first:
    decoder.generate(_prompts(2, [7, 12]), max_new_tokens=20, temperature=0.5)
  with count_compiles() as second:   # other prompts, same bucket, other sampling values
    decoder.generate(_prompts(3, [9, 4]), max_new_tokens=20, temperature=[0.0, 1.0], top_p=0.5)
  assert first.count >= 2 and second.count == 0


def test_count_compiles_counts_persistent_cache_hits():
  """A program loaded from the persistent compilation cache (tests/conftest.py turns one on) is
  counted: a recompile served from disk must not pass a no-recompile test."""
  import jax.numpy as jnp
  from jax import monitoring
  if not jax.config.jax_compilation_cache_dir:
    pytest.skip("no persistent compilation cache configured")
  hits = []
  monitoring.register_event_listener(
      lambda event, **kw: hits.append(event) if event.endswith("/cache_hits") else None)
  f = lambda x: jnp.tanh(x @ x.T).sum(axis=0) * 3.25
  x = jnp.ones((48, 48))
  old = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  try:
    jax.jit(f)(x).block_until_ready()         # compiled, and written to the cache
    jax.clear_caches()
    with count_compiles() as c:
      jax.jit(f)(x).block_until_ready()       # loaded from the cache
  finally:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", old)
  assert hits and c.count >= 1


def test_max_new_tokens_is_exact_per_row(tiny):
  out = Decoder(tiny).generate(_prompts(4, [4, 8, 2]), max_new_tokens=[3, 7, 1], eos=False)
  assert [len(t) for t in out.token_ids] == [3, 7, 1]
  assert out.finish_reason == ["length"] * 3


def test_eos_stops_each_row_at_its_first_eos(tiny):
  prompts = _prompts(5, [6, 3])
  free = Decoder(tiny).generate(prompts, max_new_tokens=24, eos=False).token_ids
  eos = free[0][5]                                    # a token row 0 emits at step 5
  out = Decoder(tiny, eos_ids=[eos]).generate(prompts, max_new_tokens=24)
  for row, full in zip(out.token_ids, free):
    expected = full[:full.index(eos) + 1] if eos in full else full
    assert row == expected
  assert out.finish_reason[0] == "stop" and out.token_ids[0][-1] == eos


@pytest.mark.parametrize("prompts, kwargs, message", [
    ([[]], {}, "prompt 0 is empty"),
    ([[1] * 600], {}, "prompt 0 has 600 tokens, more than the model's context of 512"),
    ([[1] * 500], dict(max_new_tokens=20), r"exceeds the model's context of 512"),
    ([[1, 2]], dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
    ([[1, 999]], {}, r"token ids outside \[0, 128\)"),
    ([[1, 2]], dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    ([], {}, "no prompts given"),
    # limits compared as Python ints: no int32 wrap, no OverflowError
    ([[1, 2]], dict(max_new_tokens=2147483647), r"\(2147483647\) exceeds the model's context "
     "of 512; lower max_new_tokens to at most 510"),
    ([[1, 2]], dict(max_new_tokens=10_000_000_000), r"\(10000000000\) exceeds"),
    ([[1, 2], [3]], dict(max_new_tokens=[4, 2**40]), r"prompt 1 \(1 tokens\) \+ max_new_tokens"),
    # never truncated: non-integer ids and counts are refused
    ([[1.7, 2.2]], {}, "prompt 0 has a non-integer token id 1.7; token ids must be ints"),
    ([[1, 2.0]], {}, "non-integer token id 2.0"),
    ([[1, 2]], dict(max_new_tokens=4.9), "max_new_tokens must be an integer.*got 4.9"),
    ([[1, 2]], dict(max_new_tokens=[3.0]), r"max_new_tokens must be an integer.*got \[3.0\]"),
    # a bare prompt, or text, instead of a list of token-id lists
    ([1, 2, 3], {}, r"list of token-id lists, one per row \(e.g. \[\[1, 2, 3\]\]\).*prompt 0 is 1 "
     r"\(int\)"),
    (["hello"], {}, r"list of token-id lists.*encode text with the tokenizer.*'hello' \(str\)"),
    ("hello", {}, "list of token-id lists.*got a str"),
])
def test_bad_input_is_rejected_before_any_work(tiny, prompts, kwargs, message):
  with count_compiles() as c, pytest.raises(ValueError, match=message):
    Decoder(tiny).generate(prompts, **kwargs)
  assert c.count == 0


def test_spec_decoder_shares_the_request_checks(tiny):
  from jspec import SpecDecoder
  sd = SpecDecoder(tiny, {"method": "ngram", "num_speculative_tokens": 2})
  with count_compiles() as c:
    for prompts, kwargs, message in [
        ([[1.7, 2.2]], {}, "non-integer token id 1.7"),
        ([[1, 2]], dict(max_new_tokens=4.9), "max_new_tokens must be an integer"),
        ([1, 2, 3], {}, "list of token-id lists"),
        ([[1, 2]], dict(max_new_tokens=2147483647), r"\(2147483647\) exceeds the model's context")]:
      with pytest.raises(ValueError, match=message):
        sd.generate(prompts, **kwargs)
      with pytest.raises(ValueError, match=message):
        list(sd.stream(prompts, **kwargs))
  assert c.count == 0


def test_cli_rejects_empty_prompt_and_unknown_model():
  with pytest.raises(SystemExit, match="the prompt is empty"):
    cli_main(["generate", "  "])
  with pytest.raises(SystemExit, match="unknown model 'nope'"):
    cli_main(["generate", "hello", "--model", "nope"])
  with pytest.raises(SystemExit, match="--num-draft values must be >= 1 or 'auto'"):
    cli_main(["generate", "hello", "--drafter", "ngram", "--num-draft", "-1"])
  with pytest.raises(SystemExit, match="--num-draft takes comma-separated integers or 'auto'"):
    cli_main(["generate", "hello", "--drafter", "ngram", "--num-draft", "many"])
  with pytest.raises(SystemExit, match=r"top_p must be in \(0, 1\]"):
    cli_main(["generate", "hello", "--top-p", "2"])


def test_top2_gap_matches_sort():
  from jspec.decode import top2_gap
  logits = np.random.default_rng(0).normal(size=(6, 300)).astype(np.float32)
  logits[2, 7] = logits[2, 9] = 50.0                       # an exact tie has gap 0
  s = np.sort(logits, axis=-1)
  np.testing.assert_array_equal(np.asarray(top2_gap(jax.numpy.asarray(logits))), s[:, -1] - s[:, -2])
