"""The CPU small-M matmul kernels (models/cpu_gemm) against a float64 numpy product, their routing
inside nnx.Linear and the Llama forward, gradients, vmap, and the XLA fallback without a compiler."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import KVCache, Llama, LlamaConfig, cpu_gemm

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU kernel")


@pytest.fixture(scope="module", autouse=True)
def built():
  if not cpu_gemm.available():
    pytest.skip("no C++ compiler here: the XLA fallback is tested below")


def _check(got, x, w, transpose_w):
  """Error within fp32 rounding of a K-term sum: |err| <= 1e-6 * sum_k |x_k w_k|."""
  x64 = np.asarray(x, np.float64)
  w64 = np.asarray(w, np.float64).T if transpose_w else np.asarray(w, np.float64)
  err = np.abs(np.asarray(got, np.float64) - x64 @ w64)
  np.testing.assert_array_less(err, 1e-6 * (np.abs(x64) @ np.abs(w64)) + 1e-30)


@pytest.mark.parametrize("transpose_w", [False, True])
@pytest.mark.parametrize("shape", [(1, 576, 192), (2, 64, 48), (3, 577, 203), (4, 7, 5),
                                   (5, 130, 97), (8, 576, 1536), (9, 3, 1), (64, 96, 80),
                                   (13, 1, 33)])
def test_kernel_matches_float64(shape, transpose_w):
  m, k, n = shape
  rng = np.random.default_rng(m * 1000 + k)
  x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
  w = jnp.asarray(rng.standard_normal((n, k) if transpose_w else (k, n), dtype=np.float32))
  got = jax.jit(lambda a, b: cpu_gemm.matmul(a, b, transpose_w=transpose_w, impl="ffi"))(x, w)
  assert got.shape == (m, n) and got.dtype == jnp.float32
  _check(got, x, w, transpose_w)


def test_leading_dims_are_rows():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2, 3, 40), dtype=np.float32))
  w = jnp.asarray(rng.standard_normal((40, 24), dtype=np.float32))
  got = cpu_gemm.matmul(x, w, impl="ffi")
  assert got.shape == (2, 3, 24)
  _check(got.reshape(6, 24), x.reshape(6, 40), w, False)


def test_zero_rows_and_zero_depth():
  w = jnp.ones((0, 5), jnp.float32)
  assert np.all(np.asarray(cpu_gemm.matmul(jnp.ones((3, 0), jnp.float32), w, impl="ffi")) == 0)


def test_gradient_and_vmap_match_reference():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((4, 3, 32), dtype=np.float32))
  w = jnp.asarray(rng.standard_normal((32, 20), dtype=np.float32))
  loss = lambda impl: lambda a, b: jnp.sum(jnp.sin(cpu_gemm.matmul(a, b, impl=impl)))
  g_ffi = jax.grad(loss("ffi"), argnums=(0, 1))(x, w)
  g_ref = jax.grad(loss("xla"), argnums=(0, 1))(x, w)
  for a, b in zip(g_ffi, g_ref):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  ws = jnp.stack([w, 2 * w, -w, w + 1])                      # a batched weight too
  got = jax.vmap(lambda a, b: cpu_gemm.matmul(a, b, impl="ffi"))(x, ws)
  np.testing.assert_allclose(got, jnp.einsum("btk,bkn->btn", x, ws), rtol=1e-5, atol=1e-5)


def test_routing():
  x32, w32 = jnp.ones((4, 8), jnp.float32), jnp.ones((8, 2), jnp.float32)
  assert cpu_gemm.use_kernel(x32, w32, "auto")
  assert not cpu_gemm.use_kernel(jnp.ones((cpu_gemm.MAX_ROWS + 1, 8)), w32, "auto")   # prefill
  assert not cpu_gemm.use_kernel(x32.astype(jnp.bfloat16), w32.astype(jnp.bfloat16), "auto")
  assert not cpu_gemm.use_kernel(x32, w32, "xla")
  with pytest.raises(ValueError, match="impl='auto'"):
    cpu_gemm.matmul(x32.astype(jnp.bfloat16), w32.astype(jnp.bfloat16), impl="ffi")
  with pytest.raises(ValueError, match="one of"):
    cpu_gemm.matmul(x32, w32, impl="fast")
  with pytest.raises(ValueError, match="matmul_impl"):
    Llama(LlamaConfig.tiny(), matmul_impl="fast")
  # nnx.Linear only hands its plain contraction to the kernel; others go to lax.dot_general.
  dot = cpu_gemm.DotGeneral("ffi")
  a, b = jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5))
  np.testing.assert_allclose(dot(a, b, (((2,), (1,)), ((0,), (0,)))), jnp.einsum("bij,bjk->bik", a, b))
  assert hash(dot) == hash(cpu_gemm.DotGeneral("ffi")) and dot == cpu_gemm.DotGeneral("ffi")


@pytest.mark.parametrize("tie", [True, False])
def test_llama_forward_same_as_xla(tie):
  """Prefill (XLA either way), a 5-token verify block and a 1-token step: logits and cache agree
  to fp32 rounding between the kernel and XLA's dot."""
  cfg = LlamaConfig.tiny(num_layers=2, tie_embeddings=tie)
  outs = []
  for impl in ("ffi", "xla"):
    model = Llama(cfg, rngs=nnx.Rngs(7), matmul_impl=impl)
    cache = KVCache.init(cfg, 2, 96)
    rng = np.random.default_rng(0)
    step = []
    for t in (70, 5, 1):
      out = model(jnp.asarray(rng.integers(0, cfg.vocab_size, (2, t))), cache)
      cache = out.cache
      step.append(out.logits)
    outs.append((step, cache))
  for a, b in zip(outs[0][0], outs[1][0]):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(outs[0][1]), jax.tree_util.tree_leaves(outs[1][1])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_fallback_without_compiler(tmp_path):
  """No compiler: one warning, XLA's dot (and the dequantising reference for stored formats),
  same numbers; impl='ffi' then says why it cannot."""
  code = """
import warnings, jax.numpy as jnp, numpy as np
from models import cpu_gemm
x, w = jnp.arange(12.0).reshape(3, 4), jnp.ones((4, 2))
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  y = cpu_gemm.matmul(x, w)
assert np.allclose(y, np.asarray(x) @ np.asarray(w))
assert any("unavailable" in str(c.message) for c in caught), [str(c.message) for c in caught]
try:
  cpu_gemm.matmul(x, w, impl="ffi")
except cpu_gemm.CpuGemmBuildError as e:
  assert "compiler" in str(e), e
else:
  raise AssertionError("impl='ffi' without a kernel must raise")
from models.weight_formats import dequantize, quantize
t = quantize(np.linspace(-1, 1, 64 * 3, dtype=np.float32).reshape(3, 64), "q4_1")
xq = jnp.linspace(0, 1, 128).reshape(2, 64)
assert np.allclose(cpu_gemm.qmatmul(xq, t), np.asarray(xq) @ np.asarray(dequantize(t)).T, atol=1e-5)
print("ok")
"""
  env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"), JSPEC_CACHE=str(tmp_path))
  proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
  assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
