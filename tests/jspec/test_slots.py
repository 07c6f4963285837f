"""Slot-refill decoding: every request's tokens equal plain decoding of it alone (greedy and seeded
sampling, whatever slot it ran in and whatever ran beside it), captured features equal a
teacher-forced forward of the finished sequence, no recompilation across request streams, clear
errors for bad requests."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, count_compiles
from jspec.slots import Request, SlotDecoder
from models import Llama, LlamaConfig
from models.kv_cache import KVCache

CFG = LlamaConfig.tiny()
EOS = (3,)


@pytest.fixture(scope="module")
def tiny():
  return Llama(CFG, rngs=nnx.Rngs(5))


def _requests(seed, n, **kw):
  rng = np.random.default_rng(seed)
  return [Request(rng.integers(4, CFG.vocab_size, int(rng.integers(2, 40))).tolist(),
                  int(rng.integers(1, 24)), seed=int(rng.integers(0, 2**31)), **kw)
          for _ in range(n)]


def _alone(tiny, r: Request):
  out = Decoder(tiny, eos_ids=EOS).generate([list(r.prompt)], max_new_tokens=r.max_new_tokens,
                                            temperature=r.temperature, top_k=r.top_k,
                                            top_p=r.top_p, seed=[r.seed])
  return out.token_ids[0], out.finish_reason[0]


@pytest.mark.parametrize("sampled", [False, True])
def test_each_request_equals_plain_decoding_alone(tiny, sampled):
  kw = dict(temperature=1.0, top_p=0.9) if sampled else {}
  reqs = _requests(1, 11, **kw)
  res = SlotDecoder(tiny, eos_ids=EOS, slots=4, max_len=96, max_new_tokens=32,
                    admit_width=2).generate(reqs)
  assert [r.index for r in res] == list(range(len(reqs)))
  assert any(r.finish_reason == "stop" for r in res) or not sampled
  for r, q in zip(res, reqs):
    assert (r.token_ids, r.finish_reason) == _alone(tiny, q)


def test_slotting_does_not_change_sampled_rows(tiny):
  reqs = _requests(2, 9, temperature=0.8, top_k=30)
  a = SlotDecoder(tiny, eos_ids=EOS, slots=4, max_len=96, max_new_tokens=32).generate(reqs)
  b = SlotDecoder(tiny, eos_ids=EOS, slots=2, max_len=96, max_new_tokens=32,
                  admit_width=2).generate(reqs[::-1])[::-1]
  assert [x.token_ids for x in a] == [x.token_ids for x in b]
  c = SlotDecoder(tiny, eos_ids=EOS, slots=4, max_len=96, max_new_tokens=32).generate(
      [Request(q.prompt, q.max_new_tokens, 0.8, 30, seed=q.seed + 1) for q in reqs])
  assert [x.token_ids for x in a] != [x.token_ids for x in c]     # the seed matters


def test_features_equal_teacher_forced_forward(tiny):
  taps = (0, 1)
  reqs = _requests(3, 6)
  res = SlotDecoder(tiny, eos_ids=EOS, slots=2, max_len=96, max_new_tokens=32, admit_width=1,
                    taps=taps).generate(reqs)
  for r, q in zip(res, reqs):
    seq = list(q.prompt) + r.token_ids
    out = tiny(jnp.asarray([seq]), KVCache.init(CFG, 1, len(seq)), taps=taps + (CFG.num_layers,))
    ref = np.stack(list(out.hidden[:-1]) + [tiny.norm(out.hidden[-1])], axis=2)[0]
    assert r.features.shape == (len(seq), len(taps) + 1, CFG.hidden_size)
    got = r.features.astype(np.float32)
    np.testing.assert_allclose(got, ref, rtol=2**-7, atol=1e-3)    # bfloat16 rounding


def test_no_recompile_across_streams(tiny):
  sd = SlotDecoder(tiny, eos_ids=EOS, slots=4, max_len=96, max_new_tokens=32, admit_width=2)
  sd.generate(_requests(4, 7))
  with count_compiles() as c:
    sd.generate(_requests(5, 13, temperature=0.7))
  assert c.count == 0


@pytest.mark.parametrize("req, match", [
    (Request([], 4), "empty prompt"),
    (Request([1, 2], 0), "max_new_tokens=0"),
    (Request([1, 2], 40), "allows 1..32"),
    (Request([1] * 90, 10), "exceeds the slot length 96"),
    (Request([1, CFG.vocab_size], 4), "outside"),
    (Request([1, 2], 4, temperature=-1.0), "temperature"),
    ([1, 2, 3], "Request objects"),
])
def test_bad_requests_fail_before_any_work(tiny, req, match):
  sd = SlotDecoder(tiny, slots=2, max_len=96, max_new_tokens=32)
  with count_compiles() as c, pytest.raises(ValueError, match=match):
    sd.generate([Request([5, 6], 3), req])
  assert c.count == 0


def test_bad_settings(tiny):
  with pytest.raises(ValueError, match="admit_width"):
    SlotDecoder(tiny, slots=4, admit_width=5)
  with pytest.raises(ValueError, match="max_new_tokens < max_len"):
    SlotDecoder(tiny, max_len=32, max_new_tokens=32)
  with pytest.raises(ValueError, match="tap"):
    SlotDecoder(tiny, max_len=64, max_new_tokens=8, taps=(CFG.num_layers,))
