"""Weights kept as stored (models/weight_formats, models/stored_layers, cpu_gemm.qmatmul):
GGUF blocks split against gguf-py's own quantizer and dequantizer, the quantizers' error bounds,
the C++ kernel against a float64 product of the reference dequantisation, a Llama with stored
layers against its float32 twin holding the same (dequantised) weights, and the errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import KVCache, Llama, LlamaConfig, cpu_gemm
from models.stored_layers import StoredEmbed, StoredLinear, store_weights, weight_bytes
from models.weight_formats import (FORMATS, QuantTensor, WeightFormatError, dequantize, from_gguf,
                                   permute_rows, quantize)

STORED = FORMATS[1:]
needs_kernel = pytest.mark.skipif(jax.default_backend() != "cpu" or not cpu_gemm.available(),
                                  reason="the C++ kernel runs on CPU with a compiler")


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1", "bf16"])
def test_gguf_blocks_dequantise_as_gguf_does(fmt):
  """Bytes written by gguf-py's quantizer, split by from_gguf and dequantised by the reference,
  equal gguf-py's own dequantisation bit for bit."""
  gguf = pytest.importorskip("gguf")
  qtype = getattr(gguf.GGMLQuantizationType, fmt.upper())
  w = np.random.default_rng(1).standard_normal((6, 96)).astype(np.float32) * 0.1
  raw = gguf.quants.quantize(w, qtype)
  want = gguf.quants.dequantize(raw, qtype)
  t = from_gguf(raw, fmt, 6, 96)
  assert t.nbytes == raw.nbytes               # the stored bytes, none added
  np.testing.assert_array_equal(np.asarray(dequantize(t)), want)


@pytest.mark.parametrize("fmt", STORED)
def test_quantize_error_within_half_a_step(fmt):
  """Round to nearest: every weight within half its block's step (plus the fp16 rounding of the
  scale and minimum) of the float it stands for; q4_0's grid is -8..7 steps with the extreme at
  -8, so the far side's extreme may be clipped by one step."""
  w = np.random.default_rng(2).standard_normal((8, 128)).astype(np.float32)
  w[0, :32] = 0.0                              # an all-zero block
  t = quantize(w, fmt)
  err = np.abs(np.asarray(dequantize(t)) - w)
  if fmt == "bf16":
    bound = np.abs(w) * 2.0 ** -8
  elif fmt == "int8":
    bound = np.broadcast_to(np.asarray(t.d)[:, None] * 0.5, w.shape) * 1.001
  else:
    d = np.abs(np.asarray(t.d, np.float32))
    step = np.repeat(d, 32, axis=1)
    extreme = np.repeat(np.abs(w.reshape(8, 4, 32)).max(axis=2), 32, axis=1)
    bound = (1.0 if fmt == "q4_0" else 0.5) * step + extreme * 2.0 ** -9   # fp16 d and m
  assert np.all(err <= bound + 1e-7)
  assert np.all(np.asarray(dequantize(t))[0, :32] == 0)


def test_row_lookup_and_permutation_keep_rows():
  w = np.random.default_rng(3).standard_normal((10, 64)).astype(np.float32)
  for fmt in STORED:
    t = quantize(w, fmt)
    full = np.asarray(dequantize(t))
    ids = jnp.array([[3, 0], [9, 3]])
    np.testing.assert_array_equal(np.asarray(dequantize(t, rows=ids)), full[np.asarray(ids)])
    order = np.random.default_rng(4).permutation(10)
    np.testing.assert_array_equal(np.asarray(dequantize(permute_rows(t, order))), full[order])


@needs_kernel
@pytest.mark.parametrize("fmt", STORED)
@pytest.mark.parametrize("shape", [(1, 576, 192), (3, 64, 7), (4, 1536, 33), (5, 32, 1),
                                   (16, 96, 41), (2, 160, 4), (7, 1536, 9), (12, 1536, 5),
                                   (17, 64, 6), (9, 48, 3)])
def test_kernel_matches_float64(fmt, shape):
  """The kernel reads the stored bytes; error within fp32 rounding of a K-term sum of the
  reference dequantisation's products. Shapes cover both of its paths: registers (up to 16 rows,
  K in 32s; K = 1536 in groups of rows) and the L1 buffer (17 rows; bf16 / int8 at K = 48)."""
  m, k, n = shape
  if fmt in ("bf16", "int8") and k % 16 or fmt not in ("bf16", "int8") and k % 32:
    pytest.skip("K does not fit the format")
  rng = np.random.default_rng(m * 100 + k + n)
  t = jax.device_put(quantize(rng.standard_normal((n, k)).astype(np.float32), fmt))
  x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
  got = jax.jit(lambda a, b: cpu_gemm.qmatmul(a, b, impl="ffi"))(x, t)
  assert got.shape == (m, n) and got.dtype == jnp.float32
  w64 = np.asarray(dequantize(t), np.float64)
  x64 = np.asarray(x, np.float64)
  err = np.abs(np.asarray(got, np.float64) - x64 @ w64.T)
  np.testing.assert_array_less(err, 1e-6 * (np.abs(x64) @ np.abs(w64).T) + 1e-30)


@needs_kernel
def test_kernel_leading_dims_and_reference_agree():
  rng = np.random.default_rng(5)
  t = jax.device_put(quantize(rng.standard_normal((24, 64)).astype(np.float32), "q4_1"))
  x = jnp.asarray(rng.standard_normal((2, 3, 64)).astype(np.float32))
  got = cpu_gemm.qmatmul(x, t, impl="ffi")
  ref = cpu_gemm.qmatmul(x, t, impl="xla")
  assert got.shape == (2, 3, 24)
  np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-5)


def test_bad_shapes_and_formats_are_refused():
  with pytest.raises(WeightFormatError, match="multiple of 32"):
    quantize(np.ones((4, 48), np.float32), "q4_1")
  with pytest.raises(WeightFormatError, match="multiple of 16"):
    quantize(np.ones((4, 40), np.float32), "int8")
  with pytest.raises(WeightFormatError, match="unknown stored weight format"):
    quantize(np.ones((4, 64), np.float32), "q5_k")
  with pytest.raises(WeightFormatError, match="bytes per row"):
    from_gguf(np.zeros((4, 30), np.uint8), "q8_0", 4, 64)
  t = quantize(np.ones((4, 64), np.float32), "q8_0")
  with pytest.raises(ValueError, match="x has 32 features, the weight 64"):
    cpu_gemm.qmatmul(jnp.ones((1, 32)), t)


CFG = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=16, tie_embeddings=True, max_position=64)


def _twin(stored: Llama, float_model: Llama) -> Llama:
  """float_model with every weight that `stored` holds in a format replaced by its dequantised
  value: the same function, computed by the float32 path."""
  twin = nnx.clone(float_model)
  layers = dict(nnx.iter_modules(twin))
  for path, module in nnx.iter_modules(stored):
    for name, child in vars(module).items():
      if isinstance(child, StoredLinear):
        getattr(layers[path], name).kernel[...] = dequantize(child.tensor()).T
      elif isinstance(child, StoredEmbed):
        getattr(layers[path], name).embedding[...] = dequantize(child.tensor())
  return twin


@pytest.mark.parametrize("fmt", STORED)
@pytest.mark.parametrize("tie", [True, False])
def test_stored_model_equals_its_float_twin(fmt, tie):
  """Prefill and a 3-token verify block through a Llama whose layers hold `fmt` against the
  float32 model holding the dequantised weights: logits within 1e-4."""
  import dataclasses
  cfg = dataclasses.replace(CFG, tie_embeddings=tie)
  base = Llama(cfg, rngs=nnx.Rngs(7))
  stored = store_weights(nnx.clone(base), fmt=fmt)
  assert isinstance(stored.embed, StoredEmbed)
  assert isinstance(stored.layers[1].mlp.down_proj, StoredLinear)
  assert tie or isinstance(stored.lm_head, StoredLinear)
  twin = _twin(stored, base)
  if fmt != "bf16":
    assert weight_bytes(stored) < weight_bytes(base) / 2.5
  tokens = jnp.array([[1, 5, 9, 11, 4, 2], [7, 7, 3, 0, 0, 0]], jnp.int32)
  lens = jnp.array([6, 3], jnp.int32)

  def run(model):
    out = model.prefill(tokens, KVCache.init(cfg, 2, 32), lens)
    block = model(jnp.array([[3, 8, 1], [2, 2, 5]], jnp.int32), out.cache)
    return out.logits, block.logits

  for got, want in zip(jax.jit(lambda: run(stored))(), jax.jit(lambda: run(twin))()):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(np.asarray(stored.head_rows(jnp.array([4, 1]))),
                                np.asarray(twin.head_rows(jnp.array([4, 1]))))


def test_store_weights_refuses_a_misfit():
  cfg = LlamaConfig(vocab_size=40, hidden_size=48, intermediate_size=96, num_layers=1,
                    num_heads=3, num_kv_heads=1, head_dim=16, max_position=32)
  with pytest.raises(WeightFormatError, match="multiple of 32.*--weights f32"):
    store_weights(Llama(cfg, rngs=nnx.Rngs(0)), fmt="q8_0")
