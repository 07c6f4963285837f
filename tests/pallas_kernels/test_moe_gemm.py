"""Grouped GEMM: the GPU Pallas kernel and jax's megablox TPU kernel (interpret mode off their
device) against lax.ragged_dot, forward and gradients; the visit metadata, the tgmm oracle, GPU and
TPU tiling checks, lowering to Mosaic-TPU, api validation and the quick bench."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.moe_gemm import api, bench, reference
from pallas_kernels.moe_gemm import kernel_gpu as kernel
from pallas_kernels.moe_gemm import kernel_tpu

INTERPRET = jax.default_backend() != "gpu"   # the compiled kernels on a GPU, else interpret mode

TILE16 = kernel.Tiling(16, 16, 16, num_warps=4, num_stages=2)
K, N = 24, 40   # neither a multiple of the 16-wide blocks: exercises the K/N padding

# (group sizes, M): zero-size groups, one group holding every row, padding rows past the total,
# M not a multiple of block_m, all groups empty, and an exactly tiled case.
PATTERNS = {
    "mixed_with_empty": ([5, 0, 17, 3, 0], 37),
    "one_group": ([0, 0, 37, 0, 0], 37),
    "heavy_padding": ([0, 9, 0, 1, 0], 37),
    "all_empty": ([0, 0, 0, 0, 0], 37),
    "straddle_many": ([1, 2, 3, 4, 20], 37),
    "tile_aligned": ([16, 16, 0, 0, 0], 32),
}


def _problem(sizes, m, dtype=jnp.float32, seed=0):
  rng = np.random.default_rng(seed)
  lhs = jnp.asarray(rng.standard_normal((m, K)), dtype)
  rhs = jnp.asarray(rng.standard_normal((len(sizes), K, N)), dtype)
  return lhs, rhs, jnp.asarray(sizes, jnp.int32)


@pytest.mark.parametrize("sizes,m", [([5, 0, 17, 3, 0], 37), ([0, 0, 0, 0], 64), ([64, 0, 0], 64),
                                     ([3, 13, 1, 0, 30, 2], 100)])
@pytest.mark.parametrize("block_m", [16, 32])
def test_visit_metadata_covers_every_row_once(sizes, m, block_m):
  mp = m + (-m % block_m)
  metadata = jax.jit(kernel.visit_metadata, static_argnums=(1, 2, 3))
  group, tile, lo, hi = np.asarray(metadata(jnp.asarray(sizes, jnp.int32), m, mp, block_m))
  e = len(sizes)
  assert group.shape == (mp // block_m + e,)
  owner = np.full(mp, -1)
  for g, t, a, b in zip(group, tile, lo, hi):
    if g > e:                              # idle step
      assert a == b
      continue
    assert t * block_m <= a < b <= (t + 1) * block_m
    assert np.all(owner[a:b] == -1)
    owner[a:b] = g
  expected = np.repeat(np.arange(e + 1), np.append(sizes, mp - sum(sizes)))   # padding owned by E
  np.testing.assert_array_equal(owner, expected)


@pytest.mark.parametrize("name", PATTERNS)
def test_forward_fp32_matches_ragged_dot(name):
  lhs, rhs, gs = _problem(*PATTERNS[name])
  out = api.gmm(lhs, rhs, gs, impl="pallas", tiling=TILE16)
  ref = reference.gmm_reference(lhs, rhs, gs)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(out[sum(PATTERNS[name][0]):], 0.0)   # padding rows exactly zero


@pytest.mark.parametrize("name", ["mixed_with_empty", "straddle_many"])
def test_forward_bf16_within_one_rounding(name):
  """bf16 in, fp32 accumulation, one rounding to bf16: within 2^-8 relative of an fp32 product."""
  lhs, rhs, gs = _problem(*PATTERNS[name], dtype=jnp.bfloat16)
  out = api.gmm(lhs, rhs, gs, impl="pallas", tiling=TILE16)
  assert out.dtype == jnp.bfloat16
  ref = reference.gmm_reference(lhs, rhs, gs, preferred_element_type=jnp.float32)
  np.testing.assert_allclose(np.asarray(out, np.float32), ref, rtol=2 ** -8, atol=1e-5)


def test_default_tiling_one_tile_many_groups():
  """No tiling given: the shape-fitted default (block_m=64) puts all rows in one tile, 3 visits."""
  lhs, rhs, gs = _problem([20, 0, 30, 4, 0], 61)
  out = api.gmm(lhs, rhs, gs, impl="pallas")
  np.testing.assert_allclose(out, reference.gmm_reference(lhs, rhs, gs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["mixed_with_empty", "one_group"])
def test_gradients_match_ragged_dot(name):
  lhs, rhs, gs = _problem(*PATTERNS[name])
  cot = jnp.asarray(np.random.default_rng(1).standard_normal((lhs.shape[0], N)), jnp.float32)
  loss = lambda matmul: lambda a, b: jnp.vdot(matmul(a, b, gs), cot)
  pallas = lambda a, b, g: api.gmm(a, b, g, impl="pallas", tiling=TILE16)
  d_lhs, d_rhs = jax.grad(loss(pallas), argnums=(0, 1))(lhs, rhs)
  r_lhs, r_rhs = jax.grad(loss(reference.gmm_reference), argnums=(0, 1))(lhs, rhs)
  np.testing.assert_allclose(d_lhs, r_lhs, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(d_rhs, r_rhs, rtol=1e-5, atol=1e-5)


def test_tgmm_reference_is_the_ragged_dot_weight_gradient():
  lhs, rhs, gs = _problem(*PATTERNS["mixed_with_empty"])
  grad = jnp.asarray(np.random.default_rng(2).standard_normal((lhs.shape[0], N)), jnp.float32)
  _, vjp = jax.vjp(lambda w: reference.gmm_reference(lhs, w, gs), rhs)
  np.testing.assert_allclose(reference.tgmm_reference(lhs, grad, gs), vjp(grad)[0],
                             rtol=1e-5, atol=1e-5)


def test_tgmm_kernel_matches_reference():
  lhs, _, gs = _problem(*PATTERNS["heavy_padding"])
  grad = jnp.asarray(np.random.default_rng(3).standard_normal((lhs.shape[0], N)), jnp.float32)
  out = kernel.tgmm(lhs, grad, gs, tiling=TILE16, interpret=INTERPRET)
  assert out.shape == (len(gs), K, N)
  np.testing.assert_allclose(out, reference.tgmm_reference(lhs, grad, gs), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(out[np.asarray(gs) == 0], 0.0)


def test_tgmm_kernel_keeps_an_inf_in_one_groups_rows_out_of_the_others():
  """Regression: tgmm masked lhs rows outside the group but not the gradient rows, so an inf in
  another group's (or a padding) row met a zero and made NaN in this group's weight gradient."""
  sizes, m = [5, 0, 17, 3, 0], 37          # groups 0, 2, 3 share 16-row tiles; rows 25.. padding
  lhs, rhs, gs = _problem(sizes, m)
  grad = np.random.default_rng(4).standard_normal((m, N)).astype(np.float32)
  grad[3] = np.inf                         # group 0's row
  grad[30] = np.nan                        # a padding row
  out = np.asarray(kernel.tgmm(lhs, jnp.asarray(grad), gs, tiling=TILE16, interpret=INTERPRET))
  want = np.asarray(reference.tgmm_reference(lhs, jnp.asarray(np.nan_to_num(grad, posinf=0)), gs))
  for g in (2, 3):                         # the groups that share a tile with the bad rows
    assert np.isfinite(out[g]).all(), f"group {g}"
    np.testing.assert_allclose(out[g], want[g], rtol=1e-5, atol=1e-5)
  # and through the VJP: a loss that ignores the padding rows but is given inf cotangents there
  _, vjp = jax.vjp(lambda a, b: api.gmm(a, b, gs, impl="pallas", tiling=TILE16), lhs, rhs)
  cot = np.zeros((m, N), np.float32)
  cot[25:] = np.inf
  d_lhs, d_rhs = vjp(jnp.asarray(cot))
  assert np.isfinite(np.asarray(d_rhs)).all()


@pytest.mark.parametrize("tiling,dtype,match", [
    (kernel.Tiling(24, 16, 16), jnp.float32, "block_m=24.*powers of two"),
    (kernel.Tiling(16, 8, 16), jnp.float32, "block_n=8.*>= 16"),
    (kernel.Tiling(16, 16, 16, num_warps=3), jnp.float32, "num_warps=3"),
    (kernel.Tiling(16, 16, 16, num_stages=0), jnp.float32, "num_stages=0"),
    (kernel.Tiling(256, 256, 128, num_stages=2), jnp.bfloat16, "KiB of shared memory"),
])
def test_kernel_rejects_tilings_the_gpu_cannot_run(tiling, dtype, match):
  lhs, rhs, gs = _problem(*PATTERNS["one_group"], dtype=dtype)
  with pytest.raises(ValueError, match=match):
    kernel.gmm(lhs, rhs, gs, tiling=tiling, interpret=INTERPRET)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("tiling", bench.TILINGS, ids=["128x128x64", "128x256x64"])
def test_forward_and_backward_lower_to_triton_for_sm90(tiling, dtype):
  """Cross-lowering for cuda builds the Triton IR here (no GPU needed), so it runs the Triton
  lowering's own checks (power-of-two tiles, supported primitives) on both kernels."""
  m, k, n, e = 512, 256, 384, 8
  bm, bn, bk = tiling.block_m, tiling.block_n, tiling.block_k
  tiling = tiling.fit_stages(jnp.dtype(dtype).itemsize, bm * bk + bk * bn)   # fp32: fewer stages

  def fwd_and_vjp(lhs, rhs, group_sizes, cot):
    out, vjp = jax.vjp(lambda a, b: kernel.gmm(a, b, group_sizes, tiling=tiling), lhs, rhs)
    return out, vjp(cot)
  args = [jax.ShapeDtypeStruct(s, d) for s, d in
          [((m, k), dtype), ((e, k, n), dtype), ((e,), jnp.int32), ((m, n), dtype)]]
  allow = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
  exported = jax.export.export(jax.jit(fwd_and_vjp), platforms=["cuda"],
                               disabled_checks=allow)(*args)
  names = re.findall(r'name = "(jspec_\w+)"', exported.mlir_module())
  assert sorted(names) == ["jspec_gmm", "jspec_gmm", "jspec_tgmm"]


def test_shared_memory_budget_boundary():
  # 128x128x64 bf16 tiles: 32 KiB per stage; 7 stages fit in 227 KiB, 8 do not.
  kernel.Tiling(128, 128, 64, num_stages=7).check(2, 128 * 64 + 64 * 128)
  with pytest.raises(ValueError, match="256 KiB"):
    kernel.Tiling(128, 128, 64, num_stages=8).check(2, 128 * 64 + 64 * 128)


def test_api_validation_errors():
  lhs, rhs, gs = _problem(*PATTERNS["one_group"])
  cases = [
      ((lhs[None], rhs, gs), {}, "lhs must be \\[M, K\\]"),
      ((lhs, rhs[0], gs), {}, "rhs must be \\[E, K, N\\]"),
      ((lhs[:, :-1], rhs, gs), {}, "contraction mismatch"),
      ((lhs, rhs, gs[:-1]), {}, "group_sizes must be \\[E\\] = \\[5\\]"),
      ((lhs, rhs, gs.astype(jnp.float32)), {}, "must be integers"),
      ((lhs, rhs, gs), {"impl": "triton"}, "choose one of"),
      ((lhs, rhs.astype(jnp.bfloat16), gs), {"impl": "pallas"}, "share one dtype"),
  ]
  if jax.default_backend() != "gpu":
    cases.append(((lhs, rhs, gs), {"impl": "pallas", "interpret": False}, "needs a GPU backend"))
  for args, kwargs, match in cases:
    with pytest.raises(ValueError, match=match):
      api.gmm(*args, **kwargs)


def test_auto_picks_the_backends_kernel(monkeypatch):
  for backend, auto, pallas in (("cpu", "reference", "pallas_gpu"),
                                ("gpu", "pallas_gpu", "pallas_gpu"),
                                ("tpu", "pallas_tpu", "pallas_tpu")):
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    assert api.resolve_impl("auto") == auto and api.resolve_impl("pallas") == pallas
    assert api.resolve_impl("reference") == "reference"
    assert api.resolve_impl("pallas_tpu") == "pallas_tpu"


def test_quick_bench_runs_and_agrees():
  records = bench.run(quick=True)
  assert [r["kind"] for r in records] == ["fwd", "fwd_bwd"]
  for r in records:
    assert "error" not in r, r
    assert r["interpret"] == (jax.default_backend() != "gpu")
    assert r["kernel_ms"] > 0 and r["ragged_dot_ms"] > 0
    assert r["max_rel_err"] < (1e-5 if r["dtype"] == "float32" else 1e-2)
    assert r["speedup_vs_ragged_dot"] == pytest.approx(r["ragged_dot_ms"] / r["kernel_ms"])


# --- jax's megablox kernel on TPU, under the same contract, run by the TPU interpreter here.
INTERPRET_TPU = jax.default_backend() != "tpu"


def tpu_gmm(lhs, rhs, gs, tiling=None):
  return api.gmm(lhs, rhs, gs, impl="pallas_tpu", interpret=INTERPRET_TPU, tiling=tiling)


@pytest.mark.parametrize("name", PATTERNS)
def test_tpu_forward_fp32_matches_ragged_dot(name):
  lhs, rhs, gs = _problem(*PATTERNS[name])
  out = tpu_gmm(lhs, rhs, gs)     # default tiles: K, N narrower than 128 lanes, taken whole
  np.testing.assert_allclose(out, reference.gmm_reference(lhs, rhs, gs), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(out[sum(PATTERNS[name][0]):], 0.0)   # megablox leaves them unset


def test_tpu_forward_bf16_and_irregular_tiles():
  sizes, m = [40, 0, 100, 7, 3], 160
  rng = np.random.default_rng(3)
  lhs = jnp.asarray(rng.standard_normal((m, 200)), jnp.bfloat16)       # K = 200: 128 + 72
  rhs = jnp.asarray(rng.standard_normal((5, 200, 136)) / 8, jnp.bfloat16)
  gs = jnp.asarray(sizes, jnp.int32)
  out = tpu_gmm(lhs, rhs, gs, tiling=(32, 128, 128))                  # 5 row tiles, N = 128 + 8
  assert out.dtype == jnp.bfloat16
  ref = reference.gmm_reference(lhs, rhs, gs, preferred_element_type=jnp.float32)
  np.testing.assert_allclose(np.asarray(out, np.float32), ref, rtol=2 ** -8, atol=1e-3)
  np.testing.assert_array_equal(np.asarray(out[sum(sizes):], np.float32), 0.0)


@pytest.mark.parametrize("name", ["mixed_with_empty", "straddle_many", "heavy_padding"])
def test_tpu_gradients_match_ragged_dot_and_ignore_padding_cotangents(name):
  lhs, rhs, gs = _problem(*PATTERNS[name])
  total = sum(PATTERNS[name][0])
  cot = np.random.default_rng(1).standard_normal((lhs.shape[0], N)).astype(np.float32)
  cot[total:] = np.inf     # whatever reaches the padding rows must not leak into a gradient
  cot = jnp.asarray(cot)
  loss = lambda matmul: lambda a, b: jnp.sum(jnp.where(jnp.isinf(cot), 0, matmul(a, b, gs) * cot))
  d_lhs, d_rhs = jax.grad(loss(tpu_gmm), argnums=(0, 1))(lhs, rhs)
  r_lhs, r_rhs = jax.grad(loss(reference.gmm_reference), argnums=(0, 1))(lhs, rhs)
  np.testing.assert_allclose(d_lhs, r_lhs, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(d_rhs, r_rhs, rtol=1e-5, atol=1e-5)
  # The raw VJP with inf cotangents on the padding rows: finite weight gradients, zero d_lhs there.
  _, vjp = jax.vjp(lambda a, b: tpu_gmm(a, b, gs), lhs, rhs)
  v_lhs, v_rhs = vjp(cot)
  assert np.isfinite(np.asarray(v_rhs)).all()
  np.testing.assert_array_equal(np.asarray(v_lhs[total:]), 0.0)
  np.testing.assert_allclose(v_rhs, r_rhs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tiling,dtype,match", [
    ((12, 24, 40), jnp.float32, "tm=12 must be a multiple of 8"),
    ((8, 24, 40), jnp.bfloat16, "tm=8 must be a multiple of 16"),
    ((8, 16, 40), jnp.float32, "tk=16 must be a multiple of 128"),
    ((8, 24, 64), jnp.float32, "tn=64 must be a multiple of 128"),
    ((8, 24), jnp.float32, "tuple of positive ints"),
    (None, jnp.float16, "float32/bfloat16"),
])
def test_tpu_rejects_tilings_a_tpu_cannot_run(tiling, dtype, match):
  lhs, rhs, gs = _problem(*PATTERNS["one_group"], dtype=dtype)
  with pytest.raises(ValueError, match=match):
    tpu_gmm(lhs, rhs, gs, tiling=tiling)
  with pytest.raises(ValueError, match="takes tiling=\\(tm, tk, tn\\)"):
    tpu_gmm(lhs, rhs, gs, tiling=TILE16)


def test_tpu_forward_and_backward_lower_to_mosaic():
  spec = jax.ShapeDtypeStruct
  args = (spec((256, 576), jnp.bfloat16), spec((8, 576, 1536), jnp.bfloat16),
          spec((8,), jnp.int32))
  loss = lambda a, b, g: kernel_tpu.gmm(a, b, g, interpret=False).sum()   # (api: needs a TPU)
  text = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).trace(*args).lower(
      lowering_platforms=("tpu",)).as_text()
  assert text.count("tpu_custom_call") == 3     # gmm, then gmm (d_lhs) and tgmm (d_rhs)
