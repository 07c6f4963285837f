"""The example drafter of docs/extending.md (docs/examples/bigram_drafter.py, on the tests' path
via conftest), registered from outside jspec by importing it: its table against a by-hand one,
greedy identity with plain decoding, no recompilation. It is also in the exact-enumeration
losslessness test (test_lossless_exact.py)."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder, count_compiles
from jspec.drafters import registry
from models import Llama, LlamaConfig


@pytest.fixture(scope="module")
def example():
  import bigram_drafter
  return bigram_drafter


def test_the_table_is_the_last_successor_of_each_token(example):
  rows = [[5, 1, 5, 2, 7, 0, 0], [3, 3, 4, 0, 0, 0, 0]]
  lengths = [5, 3]
  got = np.asarray(example.successors(jnp.asarray(rows), jnp.asarray(lengths), 8))
  for row, n, table in zip(rows, lengths, got):
    want = [-1] * 8
    for t in range(n - 1):
      want[row[t]] = row[t + 1]
    assert table.tolist() == want


def test_registered_by_import_and_greedy_equals_plain(example):
  assert "bigram" in registry.methods()
  model = Llama(LlamaConfig.tiny(), rngs=nnx.Rngs(0))
  prompts = [[1, 2, 3, 1, 2, 3, 1], [7, 8, 7, 8, 9]]
  plain = Decoder(model).generate(prompts, max_new_tokens=24, eos=False).token_ids
  spec = SpecDecoder(model, {"method": "bigram", "num_speculative_tokens": 3})
  out = spec.generate(prompts, max_new_tokens=24, eos=False)
  assert out.token_ids == plain
  with count_compiles() as c:
    again = spec.generate([[4, 5, 4, 5, 6], [1, 1, 1, 2, 3]], max_new_tokens=24, eos=False)
  assert c.count == 0 and len(again.token_ids[1]) == 24
