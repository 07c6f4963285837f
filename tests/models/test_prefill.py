"""Chunked prefill (`Llama.prefill`) equals the one-shot forward: the logits at each row's last
prompt token, the cache it leaves (slots each row holds, and lengths) and the taps, on ragged
prompts whose ends fall in different chunks, on every attention path of this backend."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import KVCache, Llama, LlamaConfig


@pytest.mark.parametrize("impl", ["auto", "reference"])
@pytest.mark.parametrize("chunk", [4, 5, 16])
def test_chunked_prefill_equals_one_shot(impl, chunk):
  cfg = LlamaConfig.tiny()
  model = Llama(cfg, rngs=nnx.Rngs(3), attention_impl=impl)
  rng = np.random.default_rng(0)
  lens = jnp.asarray([16, 1, 9, 4], jnp.int32)   # ends in the first, middle and last chunks
  tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (4, 16)), jnp.int32)
  tokens = jnp.where(jnp.arange(16)[None, :] < lens[:, None], tokens, 0)
  graphdef, state = nnx.split(model)
  taps = (0, 1, cfg.num_layers)

  @jax.jit
  def both(state, tokens, lens):
    m = nnx.merge(graphdef, state)
    cache = KVCache.init(cfg, 4, 24)
    one = m(tokens, cache, num_new=lens, logit_indices=(lens - 1)[:, None], taps=taps)
    return one, m.prefill(tokens, cache, lens, taps=taps, chunk=chunk)

  one, chunked = both(state, tokens, lens)
  np.testing.assert_allclose(np.asarray(chunked.logits), np.asarray(one.logits), atol=1e-5)
  np.testing.assert_array_equal(np.asarray(chunked.cache.lengths), np.asarray(lens))
  np.testing.assert_array_equal(np.asarray(one.cache.lengths), np.asarray(lens))
  held = np.arange(24)[None, :] < np.asarray(lens)[:, None]                   # [B, S]
  for a, b in zip(one.cache.k + one.cache.v, chunked.cache.k + chunked.cache.v):
    np.testing.assert_allclose(np.asarray(b)[held], np.asarray(a)[held], atol=1e-5)
  for a, b in zip(one.hidden, chunked.hidden):
    assert b.shape == a.shape
    np.testing.assert_allclose(np.asarray(b)[held[:, :16]], np.asarray(a)[held[:, :16]],
                               atol=1e-5)


def test_prefill_rejects_a_bad_chunk():
  cfg = LlamaConfig.tiny()
  model = Llama(cfg, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="chunk must be >= 1"):
    model.prefill(jnp.zeros((1, 4), jnp.int32), KVCache.init(cfg, 1, 8), jnp.asarray([4]),
                  chunk=0)


def test_chunks_past_the_longest_prompt_are_not_run():
  """Prompts of <= 5 tokens in a width of 16 (pad_to): chunks 2 and 3 of 4 never run (their taps
  stay zero), and the result equals the one-shot forward of the unpadded width."""
  cfg = LlamaConfig.tiny()
  model = Llama(cfg, rngs=nnx.Rngs(1))
  lens = jnp.asarray([5, 2], jnp.int32)
  tokens = jnp.zeros((2, 16), jnp.int32).at[:, :5].set(jnp.asarray([[3, 4, 5, 6, 7], [8, 9, 0, 0, 0]]))
  out = model.prefill(tokens, KVCache.init(cfg, 2, 20), lens, taps=(1,), chunk=4)
  one = model(tokens[:, :8], KVCache.init(cfg, 2, 20), num_new=lens,
              logit_indices=(lens - 1)[:, None], taps=(1,))
  np.testing.assert_allclose(np.asarray(out.logits), np.asarray(one.logits), atol=1e-5)
  assert np.all(np.asarray(out.hidden[0][:, 8:]) == 0)
  assert np.any(np.asarray(out.hidden[0][:, :8]) != 0)


def test_prefill_chunk_rule():
  from models.llama import PREFILL_CHUNK_RANGE, prefill_chunk
  lo, hi = PREFILL_CHUNK_RANGE
  assert prefill_chunk(1) == hi and prefill_chunk(1000) == lo
  for b in range(1, 70):
    c = prefill_chunk(b)
    assert lo <= c <= hi and c & (c - 1) == 0   # a power of two in range
    assert c == hi or c == lo or c * b <= 1024 < 2 * c * b


def test_no_copy_of_the_cache_in_the_compiled_prefill_or_decode():
  """The decoder's programs update the cache in place: no copy of a cache-shaped buffer anywhere
  in the compiled HLO (the cache is donated; the kernel reads it where it lies)."""
  from jspec.decode import Decoder, decode, prefill, row_keys
  from jspec.sampling import SamplingParams
  cfg = LlamaConfig.tiny()
  d = Decoder(Llama(cfg, rngs=nnx.Rngs(0)))
  b, s = 2, 100
  cache = KVCache.init(cfg, b, s)
  shape = f"f32[{b},{s},{cfg.num_kv_heads},{cfg.head_dim}]"
  programs = [
      prefill.lower(d.graphdef, d.weights, cache, jnp.zeros((b, 64), jnp.int32),
                    jnp.asarray([64, 30])),
      decode.lower(d.graphdef, d.weights, cache, jnp.zeros((b, cfg.vocab_size)),
                   SamplingParams.make(b, 0.0, 0, 1.0), row_keys(0, b), jnp.asarray([5, 5]),
                   buffer_len=8, eos_ids=())]
  for lowered in programs:
    text = lowered.compile().as_text()
    copies = [line for line in text.splitlines() if " copy(" in line and shape in line]
    assert not copies, copies[:2]
