"""The Pallas weight-only matmul (int8 with per-row scales, bf16) against its reference, in
interpret mode off a GPU; shapes off the tile grid; bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.weight_matmul import Tiling, reference, weight_matmul

INTERPRET = jax.default_backend() != "gpu"


def _weights(kind, n, k, rng):
  w = rng.standard_normal((n, k)).astype(np.float32)
  if kind == "bf16":
    return jnp.asarray(w, jnp.bfloat16), None
  scale = np.abs(w).max(axis=1) / 127
  return jnp.asarray(np.rint(w / scale[:, None]), jnp.int8), jnp.asarray(scale, jnp.float32)


@pytest.mark.parametrize("kind", ["int8", "bf16"])
@pytest.mark.parametrize("m, k, n", [(1, 64, 64), (5, 96, 40), (17, 128, 130)])
def test_matches_reference(kind, m, k, n):
  rng = np.random.default_rng(m + k + n)
  q, scale = _weights(kind, n, k, rng)
  x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
  got = weight_matmul(x, q, scale, tiling=Tiling(block_n=32, block_k=32), interpret=INTERPRET)
  want = reference(x, q, scale)
  assert got.shape == (m, n) and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)


def test_bad_input():
  x = jnp.ones((2, 64))
  with pytest.raises(ValueError, match="need a scale of shape"):
    weight_matmul(x, jnp.ones((8, 64), jnp.int8), interpret=True)
  with pytest.raises(ValueError, match="take no scale"):
    weight_matmul(x, jnp.ones((8, 64), jnp.bfloat16), jnp.ones((8,)), interpret=True)
  with pytest.raises(ValueError, match="int8 or bfloat16"):
    weight_matmul(x, jnp.ones((8, 64), jnp.float32), interpret=True)
  with pytest.raises(ValueError, match="must share K"):
    weight_matmul(x, jnp.ones((8, 32), jnp.bfloat16), interpret=True)
  with pytest.raises(ValueError, match="powers of two"):
    weight_matmul(x, jnp.ones((8, 64), jnp.bfloat16), tiling=Tiling(block_k=24), interpret=True)
