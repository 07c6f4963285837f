"""The speculative engine on a tiny random model: no recompilation, exact stops, cache-full rows,
streaming, the n-gram drafter against a plain-Python reference, and configuration errors."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder, SpeculativeConfig, count_compiles
from jspec.drafters.base import Context
from jspec.drafters.model_free.ngram import NgramDrafter
from jspec.sampling import SamplingParams
from models import Llama, LlamaConfig

CFG = LlamaConfig.tiny()


@pytest.fixture(scope="module")
def tiny():
  return Llama(CFG, rngs=nnx.Rngs(5))


def _prompts(seed, lengths):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, CFG.vocab_size, n).tolist() for n in lengths]


def test_no_recompilation_over_200_rounds(tiny):
  sd = SpecDecoder(tiny, {"method": "layer_skip", "num_speculative_tokens": 1, "num_layers": 1})
  prompts = _prompts(0, [6, 9])
  kw = dict(max_new_tokens=420, temperature=[0.0, 1.0], eos=False)
  warm = sd.generate(prompts, **kw)
  with count_compiles() as c:   # on-device while loop: same shapes, other values
    out = sd.generate(_prompts(1, [4, 11]), seed=9, **kw)
  assert out.rounds >= 400 and c.count == 0     # >= 200 rounds per row
  chunks = sd.stream(prompts, **kw)             # the host loop over the jitted round
  for _ in range(3):
    next(chunks)                                # warm-up: prefill + the first rounds
  with count_compiles() as c:
    rounds = sum(1 for _ in chunks)
  assert rounds >= 200 and c.count == 0
  assert warm.finish_reason == ["length", "length"]


def test_stream_equals_generate(tiny):
  sd = SpecDecoder(tiny, {"method": "ngram", "num_speculative_tokens": 3})
  prompts = _prompts(2, [12, 5, 8])
  kw = dict(max_new_tokens=30, temperature=[0.0, 0.9, 1.2], top_k=[0, 0, 10], seed=[1, 2, 3],
            eos=False)
  out = sd.generate(prompts, **kw)
  streamed = [[] for _ in prompts]
  for chunk in sd.stream(prompts, **kw):
    for row, toks in zip(streamed, chunk):
      row.extend(toks)
  assert streamed == out.token_ids


def _self_draft(model, d):
  return SpecDecoder(model, {"method": "draft_model", "num_speculative_tokens": d},
                     draft_model=model)


def test_max_new_tokens_is_exact_with_multi_token_rounds(tiny):
  sd = _self_draft(tiny, 3)   # the target drafting for itself accepts every token: AL = D + 1
  out = sd.generate(_prompts(3, [5, 7, 3, 9]), max_new_tokens=[3, 7, 1, 10], eos=False)
  assert [len(t) for t in out.token_ids] == [3, 7, 1, 10]
  assert out.finish_reason == ["length"] * 4
  assert out.per_position_acceptance == [1.0, 1.0, 1.0]


def test_eos_inside_an_accepted_block_truncates_there(tiny):
  prompts = _prompts(4, [6, 4])
  free = _self_draft(tiny, 3).generate(prompts, max_new_tokens=24, eos=False).token_ids
  plain = Decoder(tiny).generate(prompts, max_new_tokens=24, eos=False).token_ids
  assert free == plain
  eos = free[0][6]            # rounds emit tokens 1-4, 5-8, ...: index 6 is inside a block
  out = SpecDecoder(tiny, {"method": "draft_model", "num_speculative_tokens": 3},
                    draft_model=tiny, eos_ids=[eos]).generate(prompts, max_new_tokens=24)
  for row, full in zip(out.token_ids, free):
    assert row == (full[:full.index(eos) + 1] if eos in full else full)
  assert out.finish_reason[0] == "stop"


def test_full_cache_stops_the_row_cleanly(tiny):
  sd = _self_draft(tiny, 3)
  prompts = _prompts(5, [5, 3])
  free = sd.generate(prompts, max_new_tokens=40, eos=False).token_ids
  out = sd.generate(prompts, max_new_tokens=40, eos=False, max_len=16)
  assert out.finish_reason == ["cache_full", "cache_full"]
  for row, full, p in zip(out.token_ids, free, prompts):
    assert len(row) == 16 - len(p) and row == full[:len(row)]    # no lost or wrong tokens


def _ngram_reference(history, d, lo, hi):
  """vLLM's rule in plain Python: longest n in [lo, hi], earliest earlier occurrence."""
  n_tok = len(history)
  for n in range(hi, lo - 1, -1):
    if n_tok < n + 1:
      continue
    suffix = history[-n:]
    for i in range(0, n_tok - n):
      if history[i:i + n] == suffix:
        cont = history[i + n:i + n + d]
        return cont, len(cont)
  return [], 0


@pytest.mark.parametrize("lo, hi", [(1, 1), (1, 3), (2, 4)])
def test_ngram_matches_reference(lo, hi):
  rng = np.random.default_rng(lo * 10 + hi)
  d, s = 4, 40
  drafter = NgramDrafter(d, lo, hi)
  for _ in range(30):
    b = 4
    lens = rng.integers(1, s, b)
    toks = rng.integers(0, 5, (b, s))       # small alphabet: many repeats
    ctx = Context(tokens=jnp.asarray(toks, jnp.int32), length=jnp.asarray(lens, jnp.int32),
                  prompt_len=jnp.asarray(lens, jnp.int32), sampling=SamplingParams.make(b))
    draft, _ = drafter.propose(None, (), ctx, None)
    for r in range(b):
      cont, n = _ngram_reference(toks[r, :lens[r]].tolist(), d, lo, hi)
      assert int(draft.length[r]) == n
      assert np.asarray(draft.tokens[r, :n]).tolist() == cont


@pytest.mark.parametrize("cfg, message", [
    ({"method": "ngram", "num_speculative_tokens": -1}, r"num_speculative_tokens must be an integer in \[1, 64\]"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "use plain decoding for 0"),
    ({"method": "eagle9", "num_speculative_tokens": 2}, "unknown speculative method 'eagle9'"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3,
      "prompt_lookup_max": 2}, "prompt_lookup_min <= prompt_lookup_max"),
    ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}, "unknown speculative config keys"),
    ({"num_speculative_tokens": 2}, "needs 'method'"),
])
def test_bad_config(cfg, message):
  with pytest.raises(ValueError, match=message):
    SpeculativeConfig.from_dict(cfg)


def test_bad_engine_input(tiny):
  other = Llama(LlamaConfig.tiny(vocab_size=64), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"draft model vocabulary \(64\) differs from the target's \(128\)"):
    SpecDecoder(tiny, {"method": "draft_model", "num_speculative_tokens": 2}, draft_model=other)
  with pytest.raises(ValueError, match="layer-skip needs 1 <= num_layers < 2"):
    SpecDecoder(tiny, {"method": "layer_skip", "num_speculative_tokens": 2, "num_layers": 2})
  sd = SpecDecoder(tiny, {"method": "ngram", "num_speculative_tokens": 8})
  with count_compiles() as c:
    with pytest.raises(ValueError, match=r"num_speculative_tokens \(8\) is too large for max_len=12"):
      sd.generate([[1, 2, 3, 4]], max_new_tokens=5, max_len=12)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
      sd.generate([[1, 2, 3]], top_p=1.5)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
      sd.generate([[1, 2], []])
  assert c.count == 0


def test_drafters_see_prompt_taps_and_committed_counts(tiny):
  """The contract learned drafters rely on: init_state gets the prompt's taps (equal to the
  target's own forward), and commit's num_new adds up to what each row committed."""
  import dataclasses as dc

  import jax

  from jspec.drafters.model_free.ngram import NgramDrafter
  from models import KVCache

  @dc.dataclass(frozen=True)
  class Probe(NgramDrafter):
    target_taps: tuple = (1,)

    def init_state(self, params, prompt, ctx, max_len):
      return (ctx.target_hidden[0], jnp.zeros_like(ctx.length), ctx.length)

    def commit(self, params, state, ctx):
      taps, total, start = state
      return (taps, total + ctx.num_new, start)

  prompts = _prompts(7, [5, 9])
  sd = SpecDecoder(tiny, {"method": "ngram", "num_speculative_tokens": 3})
  sd.drafter = Probe(3)
  state, sampling = sd.prefill(prompts, max_new_tokens=20, eos=False)
  taps, _, start = state.drafter_state
  for r, p in enumerate(prompts):
    ref = tiny(jnp.asarray([p]), KVCache.init(CFG, 1, 16), taps=(1,)).hidden[0]
    np.testing.assert_allclose(np.asarray(taps[r, :len(p)]), np.asarray(ref[0]), atol=1e-5)
  from jspec import engine
  final = jax.jit(engine.spec_generate, static_argnames=("graphdef", "drafter", "eos_ids"))(
      sd.graphdef, sd.weights, sd.drafter, None, state, sampling, eos_ids=())
  _, total, start = final.drafter_state
  np.testing.assert_array_equal(np.asarray(total), np.asarray(final.length - start))
  assert np.asarray(final.length - start).tolist() == [19, 19]   # 20 new, the first at prefill


def test_offered_counts_the_rounds_that_verified_each_position(tiny):
  """offered_at[i]: rounds that verified draft i after accepting drafts < i. A drafter that always
  proposes D (a draft model) is offered position 0 every round and position i whenever i - 1 was
  accepted; n-gram without a match proposes nothing, so its first position is offered in fewer
  rounds than run, and the acceptance per offer is then above the acceptance per round."""
  prompts = _prompts(0, [6, 9])
  full = SpecDecoder(tiny, {"method": "draft_model", "num_speculative_tokens": 3},
                     draft_model=Llama(CFG, rngs=nnx.Rngs(8))).generate(
                         prompts, max_new_tokens=30, eos=False, temperature=[0.0, 1.0])
  assert full.offered_at[0] == full.rounds
  assert full.offered_at[1:] == full.accepted_at[:-1]
  rng = np.random.default_rng(3)
  mixed = [rng.integers(0, CFG.vocab_size, 12).tolist() * 2, rng.integers(0, CFG.vocab_size, 20).tolist()]
  out = SpecDecoder(tiny, {"method": "ngram", "num_speculative_tokens": 3}).generate(
      mixed, max_new_tokens=30, eos=False)
  assert 0 < out.offered_at[0] < out.rounds
  assert all(o <= a for o, a in zip(out.offered_at[1:], out.accepted_at[:-1]))
  assert out.conditional_acceptance[0] > out.per_position_acceptance[0]


def test_a_bf16_cache_keeps_speculation_exact(tiny):
  """With the KV cache in bf16 (`cache_dtype`), a verify block, a plain step and the adaptive
  round's unwritten block read the same rounded keys: the target drafting for itself accepts every
  token, and every decoder emits bf16-cache plain decoding. The cache is a different target from
  the fp32 one, close to it."""
  model = nnx.clone(tiny)
  model.cache_dtype = jnp.dtype(jnp.bfloat16)
  prompts = _prompts(6, [5, 9, 3])
  plain = Decoder(model).generate(prompts, max_new_tokens=20, eos=False)
  full = _self_draft(model, 3).generate(prompts, max_new_tokens=20, eos=False)
  assert full.token_ids == plain.token_ids and full.per_position_acceptance == [1.0] * 3
  for cfg in ({"method": "draft_model", "num_speculative_tokens": "auto", "draft_lengths": [0, 1, 3]},
              {"method": "ngram", "num_speculative_tokens": 3}):
    out = SpecDecoder(model, cfg, draft_model=model, time_rounds=False).generate(
        prompts, max_new_tokens=20, eos=False)
    assert out.token_ids == plain.token_ids, cfg
  ids = jnp.asarray([prompts[1]])
  logits = {m.cache_dtype: m(ids, m.init_cache(1, 16)).logits for m in (tiny, model)}
  cache = model.init_cache(1, 16)   # held as bf16 bits on CPU (an integer scatter is in place)
  assert cache.dtype == jnp.bfloat16 and cache.k[0].dtype.itemsize == 2
  np.testing.assert_allclose(np.asarray(logits[jnp.dtype(jnp.bfloat16)]),
                             np.asarray(logits[jnp.dtype(jnp.float32)]), atol=0.05)
  with pytest.raises(ValueError, match="cache_dtype must be one of float32, bfloat16"):
    Llama(CFG, cache_dtype="float16")
