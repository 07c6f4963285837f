"""verify_attention: reference vs a per-row numpy oracle; the GPU (Triton-style) and TPU (Mosaic)
Pallas kernels vs the reference, in interpret mode off their device (the TPU kernel under
`pltpu.InterpretParams`); the CPU C++ kernel vs the oracle (and that it reads no key past a row's
length); split-KV, paged vs contiguous, layout-rule errors, lowering to Triton and to Mosaic-TPU,
the Llama forward and a speculative generate on every path."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.config import LlamaConfig
from models.kv_cache import KVCache
from models.llama import Llama
from pallas_kernels.verify_attention import (attend_unwritten, attend_unwritten_reference,
                                             attention_mask, choose_impl, kernel_cpu,
                                             paged_verify_attention,
                                             paged_verify_attention_reference, verify_attention,
                                             verify_attention_reference)

INTERPRET = jax.default_backend() != "gpu"   # the compiled kernels on a GPU, else interpret mode

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}   # bf16: probabilities rounded before P @ V
# Jitted: one compile per shape instead of one per eager op (the file must stay fast on 2 cores).
reference = jax.jit(verify_attention_reference)
paged_reference = jax.jit(paged_verify_attention_reference)


def make_inputs(b, t, hq, kvh, s, dh, lengths, *, dtype=jnp.float32, tree=False, seed=0):
  rng = np.random.default_rng(seed)   # numpy: no per-shape compiles of jax.random
  q, k, v = (jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
             for shape in ((b, t, hq, dh), (b, s, kvh, dh), (b, s, kvh, dh)))
  return q, k, v, jnp.asarray(lengths, jnp.int32), random_tree(b, t, seed) if tree else None


def random_tree(b, t, seed):
  """[B, T, T] ancestor-or-self masks of random trees (node u's parent is some node < u)."""
  rng = np.random.default_rng(seed)
  mask = np.zeros((b, t, t), bool)
  for row in range(b):
    for u in range(t):
      mask[row, u, u] = True
      if u:
        mask[row, u] |= mask[row, rng.integers(0, u)]
  return jnp.asarray(mask)


def oracle(q, k, v, lengths, tree_mask):
  """Per (row, token, head) loop in float64 over the keys that token may see."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, t, hq, dh = q.shape
  s, kvh = k.shape[1], k.shape[2]
  out = np.zeros_like(q)
  for row in range(b):
    n = int(lengths[row])
    for i in range(t):
      news = [u for u in range(t) if (u <= i if tree_mask is None else tree_mask[row, i, u])]
      keys = [j for j in list(range(n)) + [n + u for u in news] if j < s]
      for h in range(hq):
        kh = h // (hq // kvh)
        scores = k[row, keys, kh] @ q[row, i, h] / np.sqrt(dh)
        p = np.exp(scores - scores.max())
        out[row, i, h] = (p / p.sum()) @ v[row, keys, kh]
  return out


def assert_close(x, y, dtype):
  np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                             atol=TOL[dtype], rtol=TOL[dtype])


# (B, T, Hq, KVH, S, Dh, lengths, tree): odd lengths, an empty prefix, new keys past the cache end.
REFERENCE_CASES = [
    (2, 1, 4, 4, 24, 16, [0, 23], False),
    (2, 3, 8, 2, 24, 16, [5, 17], True),
    (1, 5, 8, 1, 24, 32, [21], False),   # slots 24, 25 dropped
    (1, 6, 4, 1, 24, 16, [19], True),    # slot 24 dropped
]


@pytest.mark.parametrize("b,t,hq,kvh,s,dh,lengths,tree", REFERENCE_CASES)
def test_reference_matches_per_row_oracle(b, t, hq, kvh, s, dh, lengths, tree):
  q, k, v, lengths, tm = make_inputs(b, t, hq, kvh, s, dh, lengths, tree=tree)
  np.testing.assert_allclose(np.asarray(reference(q, k, v, lengths, tm)),
                             oracle(q, k, v, lengths, tm), atol=1e-5)


# (B, T, G, KVH, S, Dh, lengths, tree, dtype, block_k, num_splits)
KERNEL_CASES = [
    (2, 1, 1, 2, 100, 16, [0, 67], False, jnp.float32, 32, 1),          # T=1, empty prefix
    (2, 3, 4, 2, 100, 32, [37, 98], True, jnp.float32, 16, 1),          # tree, slot 100 dropped
    (1, 5, 8, 1, 64, 16, [29], False, jnp.bfloat16, 16, 1),
    (1, 4, 8, 1, 64, 16, [45], True, jnp.bfloat16, 16, 2),
    (1, 40, 4, 1, 80, 16, [3], False, jnp.float32, 32, 1),              # 160 rows: two row tiles
]


@pytest.mark.parametrize("b,t,g,kvh,s,dh,lengths,tree,dtype,block_k,num_splits", KERNEL_CASES)
def test_kernel_matches_reference(b, t, g, kvh, s, dh, lengths, tree, dtype, block_k, num_splits):
  q, k, v, lengths, tm = make_inputs(b, t, g * kvh, kvh, s, dh, lengths, dtype=dtype, tree=tree)
  out = verify_attention(q, k, v, lengths, tm, impl="pallas", interpret=INTERPRET, block_k=block_k,
                         num_splits=num_splits)
  assert out.shape == q.shape and out.dtype == q.dtype
  assert_close(out, reference(q, k, v, lengths, tm), dtype)


def test_split_kv_equals_no_split():
  # 3 splits over uneven prefixes (7 and 1 blocks of 16): some splits get no prefix block at all.
  q, k, v, lengths, tm = make_inputs(2, 3, 8, 2, 128, 16, [101, 9], tree=True, seed=1)
  run = lambda n: verify_attention(q, k, v, lengths, tm, impl="pallas", interpret=INTERPRET,
                                   block_k=16, num_splits=n)
  split = run(3)
  np.testing.assert_allclose(np.asarray(split), np.asarray(run(1)), atol=1e-6)
  assert_close(split, reference(q, k, v, lengths, tm), jnp.float32)


def test_kernel_gives_zeros_to_a_row_that_sees_nothing():
  q, k, v, _, _ = make_inputs(1, 2, 2, 1, 16, 16, [0])
  tm = jnp.asarray([[[False, False], [True, True]]])
  out = verify_attention(q, k, v, jnp.asarray([0]), tm, impl="pallas", interpret=INTERPRET)
  np.testing.assert_array_equal(np.asarray(out[0, 0]), 0.0)
  assert_close(out[0, 1], reference(q, k, v, jnp.asarray([0]), tm)[0, 1],
               jnp.float32)


def to_pages(cache, page_size, seed):
  """Scatters a contiguous [B, S, KVH, Dh] cache into shuffled pages; returns pages, tables."""
  b, s, kvh, dh = cache.shape
  per_row = s // page_size
  order = np.random.default_rng(seed).permutation(b * per_row + 3)   # 3 pages nobody uses
  tables = order[:b * per_row].reshape(b, per_row)
  pages = np.zeros((len(order), page_size, kvh, dh), np.float32)
  pages[tables.reshape(-1)] = np.asarray(cache).reshape(b * per_row, page_size, kvh, dh)
  return jnp.asarray(pages, cache.dtype), jnp.asarray(tables, jnp.int32)


# (T, G, page_size, lengths, tree, block_k, num_splits)
@pytest.mark.parametrize("t,g,page_size,lengths,tree,block_k,num_splits", [
    (1, 4, 8, [13, 0], False, 16, 1),
    (3, 2, 16, [46, 61], True, 16, 2),    # row 1: slots 64, 65 dropped
])
def test_paged_equals_contiguous(t, g, page_size, lengths, tree, block_k, num_splits):
  q, k, v, lengths, tm = make_inputs(2, t, 2 * g, 2, 64, 16, lengths, tree=tree, seed=2)
  (k_pages, tables), (v_pages, _) = to_pages(k, page_size, 0), to_pages(v, page_size, 0)
  want = reference(q, k, v, lengths, tm)
  np.testing.assert_array_equal(
      np.asarray(paged_reference(q, k_pages, v_pages, tables, lengths, tm)),
      np.asarray(want))
  out = paged_verify_attention(q, k_pages, v_pages, tables, lengths, tm, impl="pallas",
                               interpret=INTERPRET, block_k=block_k, num_splits=num_splits)
  assert_close(out, want, jnp.float32)


@pytest.mark.parametrize("kwargs,shape,match", [
    (dict(block_k=48), None, "block_k must be a power of two"),
    (dict(block_q=8), None, "block_q must be a power of two >= 16"),
    (dict(num_splits=0), None, "num_splits must be >= 1"),
    (dict(block_k=128, num_stages=4), (1, 1, 4, 1, 64, 256), "shared memory"),
    (dict(), (1, 1, 4, 1, 64, 24), "head_dim 24"),
])
def test_kernel_rejects_configs_a_gpu_cannot_run(kwargs, shape, match):
  b, t, hq, kvh, s, dh = shape or (1, 2, 4, 2, 64, 16)
  q, k, v, lengths, _ = make_inputs(b, t, hq, kvh, s, dh, [5])
  with pytest.raises(ValueError, match=match):
    verify_attention(q, k, v, lengths, impl="pallas", interpret=INTERPRET, **kwargs)


# Lowering for CUDA runs Pallas' Triton lowering (its power-of-two and op-support checks) without a
# GPU; jaxlib <= 0.10.2 then stops at the IR, later ones compile it with Triton, which needs a GPU.
@pytest.mark.skipif(jax.__version_info__ > (0, 10, 2) and jax.default_backend() != "gpu",
                    reason="Triton compiles during lowering on jaxlib > 0.10.2: needs a GPU")
@pytest.mark.parametrize("paged,t,g,dh,dtype,tree,kwargs", [
    (False, 1, 8, 128, jnp.bfloat16, False, dict(num_splits=4)),
    (False, 5, 4, 64, jnp.float32, True, dict(num_splits=1, block_k=32)),
    (False, 200, 4, 128, jnp.bfloat16, False, dict(num_splits=2)),    # 800 rows: 7 tiles
    (True, 3, 4, 128, jnp.bfloat16, True, dict(num_splits=2)),
    (True, 2, 1, 64, jnp.float16, False, dict(num_splits=1, block_k=32)),   # pages of 64 > block_k
])
def test_kernel_lowers_to_triton_for_cuda(paged, t, g, dh, dtype, tree, kwargs):
  b, kvh = 2, 2
  spec = jax.ShapeDtypeStruct
  q = spec((b, t, g * kvh, dh), dtype)
  args = (spec((b,), jnp.int32), spec((b, t, t), jnp.bool_) if tree else None)
  if paged:
    pages = spec((40, 64 if kwargs.get("block_k") else 16, kvh, dh), dtype)
    fn = functools.partial(paged_verify_attention, impl="pallas", interpret=False, **kwargs)
    lowered = jax.jit(fn).trace(q, pages, pages, spec((b, 9), jnp.int32), *args)
  else:
    kv = spec((b, 1000, kvh, dh), dtype)
    fn = functools.partial(verify_attention, impl="pallas", interpret=False, **kwargs)
    lowered = jax.jit(fn).trace(q, kv, kv, *args)
  text = lowered.lower(lowering_platforms=("cuda",)).as_text()
  # One Triton custom call (its target was renamed after jaxlib 0.10.2).
  assert text.count("__gpu$xla.gpu.triton") + text.count("triton_kernel_call") == 1


def test_paged_kernel_rejects_odd_page_size():
  q, k, v, lengths, _ = make_inputs(1, 1, 2, 1, 24, 16, [5])
  k_pages = k.reshape(2, 12, 1, 16)
  with pytest.raises(ValueError, match="page_size must be a power of two"):
    paged_verify_attention(q, k_pages, k_pages, jnp.asarray([[0, 1]]), lengths, impl="pallas",
                           interpret=INTERPRET)


def test_api_validates_inputs():
  q, k, v, lengths, _ = make_inputs(2, 3, 4, 2, 16, 16, [1, 2])
  bad = [
      (dict(q=q[..., :3, :]), "multiple of KV heads"),
      (dict(v=v[:, :8]), "same shape"),
      (dict(lengths=lengths[:1]), "lengths must be an integer"),
      (dict(lengths=lengths.astype(jnp.float32)), "lengths must be an integer"),
      (dict(tree_mask=jnp.ones((2, 3, 2), bool)), "tree_mask must be bool"),
      (dict(tree_mask=jnp.ones((2, 3, 3), jnp.int32)), "tree_mask must be bool"),
      (dict(impl="triton"), "impl must be one of"),
      (dict(mask=jnp.ones((2, 3, 15), bool)), "mask must be"),
  ]
  for change, match in bad:
    args = dict(q=q, k=k, v=v, lengths=lengths) | change
    with pytest.raises(ValueError, match=match):
      verify_attention(**args)
  with pytest.raises(ValueError, match="attention_impl must be one of"):
    Llama(LlamaConfig.tiny(), attention_impl="fast")


def test_auto_takes_the_backends_kernel_and_falls_back_with_a_warning(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  assert choose_impl("auto", head_dim=64, dtype=jnp.float16) == "reference"
  assert choose_impl("pallas", head_dim=64, dtype=jnp.bfloat16) == "pallas_gpu"
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert choose_impl("auto", head_dim=64, dtype=jnp.bfloat16) == "pallas_gpu"
  assert choose_impl("reference", head_dim=64, dtype=jnp.bfloat16) == "reference"
  with pytest.warns(UserWarning, match="head_dim 80"):
    assert choose_impl("auto", head_dim=80, dtype=jnp.bfloat16) == "reference"
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  assert choose_impl("auto", head_dim=80, dtype=jnp.bfloat16) == "pallas_tpu"   # any head_dim
  assert choose_impl("pallas", head_dim=64, dtype=jnp.float32) == "pallas_tpu"
  assert choose_impl("pallas_gpu", head_dim=64, dtype=jnp.float32) == "pallas_gpu"
  with pytest.warns(UserWarning, match="float16"):
    assert choose_impl("auto", head_dim=64, dtype=jnp.float16) == "reference"


def test_llama_forward_is_the_same_on_the_kernel_path():
  cfg = LlamaConfig.tiny()
  prompt = jnp.asarray([[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]])
  tree = jnp.asarray([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]] * 2, bool)   # two siblings of token 0
  runs = []
  impls = ("reference", "pallas_gpu", "pallas_tpu") + (("cpu",) if ON_CPU else ())
  for impl in impls:   # Pallas kernels in interpret mode off-device
    graphdef, state = nnx.split(Llama(cfg, rngs=nnx.Rngs(4), attention_impl=impl))
    forward = jax.jit(lambda state, ids, cache, **kw: nnx.merge(graphdef, state)(ids, cache, **kw))
    prefill = forward(state, prompt, KVCache.init(cfg, 2, 16), num_new=jnp.asarray([5, 3]))
    positions = prefill.cache.lengths[:, None] + jnp.asarray([[0, 1, 1]])
    verify = forward(state, jnp.asarray([[1, 2, 3], [4, 5, 6]]), prefill.cache, tree_mask=tree,
                     positions=positions)
    runs.append((prefill, verify))
  for ref, pal in [pair for run in runs[1:] for pair in zip(runs[0], run)]:
    np.testing.assert_allclose(np.asarray(pal.logits), np.asarray(ref.logits), atol=1e-5)
    for a, b in zip(ref.cache.k + ref.cache.v, pal.cache.k + pal.cache.v):
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(pal.cache.lengths), np.asarray(ref.cache.lengths))


def test_bench_quick_writes_json(tmp_path):
  from pallas_kernels import bench
  path = tmp_path / "bench.json"
  bench.main(["--json", str(path), "--quick"])
  report = json.loads(path.read_text())
  assert {"device", "jax_version", "attention", "gmm"} <= set(report)
  rows = report["attention"]
  assert rows and {r["impl"] for r in rows} == {"pallas", "reference"}
  for r in rows:
    assert r["median_ms"] > 0 and r["hbm_gb_per_s"] > 0 and r["max_abs_err"] < 2e-2


# --- The Mosaic-TPU kernel, run by the TPU interpreter on this CPU (the GPU kernel's cases, TPU
# tiles: block_k a multiple of 128 or the whole cache, block_q on the sublane tile).
INTERPRET_TPU = jax.default_backend() != "tpu"

# (B, T, G, KVH, S, Dh, lengths, tree, dtype, block_k, block_q, num_splits)
TPU_CASES = [
    (2, 1, 1, 2, 300, 16, [0, 267], False, jnp.float32, 128, None, 1),   # T=1, partial last block
    (2, 3, 4, 2, 300, 32, [137, 299], True, jnp.float32, 128, None, 1),  # tree; 300, 301 dropped
    (1, 5, 8, 1, 256, 16, [129], False, jnp.bfloat16, 128, None, 1),
    (1, 4, 8, 1, 512, 16, [405], True, jnp.bfloat16, 128, None, 3),      # split-KV, uneven shares
    (1, 40, 4, 1, 80, 16, [3], False, jnp.float32, 80, 64, 1),           # 160 rows: three row tiles
    (2, 2, 4, 3, 64, 64, [0, 61], False, jnp.float32, None, None, 1),    # the default model's heads
]


@pytest.mark.parametrize("b,t,g,kvh,s,dh,lengths,tree,dtype,block_k,block_q,num_splits", TPU_CASES)
def test_tpu_kernel_matches_reference(b, t, g, kvh, s, dh, lengths, tree, dtype, block_k, block_q,
                                      num_splits):
  q, k, v, lengths, tm = make_inputs(b, t, g * kvh, kvh, s, dh, lengths, dtype=dtype, tree=tree)
  out = verify_attention(q, k, v, lengths, tm, impl="pallas_tpu", interpret=INTERPRET_TPU,
                         block_k=block_k, block_q=block_q, num_splits=num_splits)
  assert out.shape == q.shape and out.dtype == q.dtype
  assert_close(out, reference(q, k, v, lengths, tm), dtype)


def test_tpu_split_kv_equals_no_split_and_a_row_that_sees_nothing_gets_zeros():
  q, k, v, lengths, tm = make_inputs(2, 3, 8, 2, 640, 16, [601, 9], tree=True, seed=1)
  run = lambda n: verify_attention(q, k, v, lengths, tm, impl="pallas_tpu",
                                   interpret=INTERPRET_TPU, block_k=128, num_splits=n)
  split = run(3)     # row 1 has one block: two of its splits get none
  np.testing.assert_allclose(np.asarray(split), np.asarray(run(1)), atol=1e-6)
  assert_close(split, reference(q, k, v, lengths, tm), jnp.float32)
  q, k, v, _, _ = make_inputs(1, 2, 2, 1, 16, 16, [0])
  tm = jnp.asarray([[[False, False], [True, True]]])
  out = verify_attention(q, k, v, jnp.asarray([0]), tm, impl="pallas_tpu", interpret=INTERPRET_TPU)
  np.testing.assert_array_equal(np.asarray(out[0, 0]), 0.0)
  assert_close(out[0, 1], reference(q, k, v, jnp.asarray([0]), tm)[0, 1], jnp.float32)


# (T, G, page_size, lengths, tree, dtype, num_splits)
@pytest.mark.parametrize("t,g,page_size,lengths,tree,dtype,num_splits", [
    (1, 4, 8, [13, 0], False, jnp.float32, 1),
    (3, 2, 16, [46, 61], True, jnp.float32, 2),    # row 1: slots 64, 65 dropped
    (4, 8, 16, [30, 3], True, jnp.bfloat16, 1),
])
def test_tpu_paged_equals_contiguous(t, g, page_size, lengths, tree, dtype, num_splits):
  q, k, v, lengths, tm = make_inputs(2, t, 2 * g, 2, 64, 16, lengths, tree=tree, seed=2,
                                     dtype=dtype)
  (k_pages, tables), (v_pages, _) = to_pages(k, page_size, 0), to_pages(v, page_size, 0)
  out = paged_verify_attention(q, k_pages, v_pages, tables, lengths, tm, impl="pallas_tpu",
                               interpret=INTERPRET_TPU, num_splits=num_splits)
  assert_close(out, reference(q, k, v, lengths, tm), dtype)


@pytest.mark.parametrize("kwargs,shape,dtype,match", [
    (dict(block_q=12), None, jnp.float32, "block_q must be a positive multiple of 8"),
    (dict(block_q=8), None, jnp.bfloat16, "block_q must be a positive multiple of 16"),
    (dict(block_k=100), None, jnp.float32, "block_k must be a positive multiple of 128"),
    (dict(num_splits=0), None, jnp.float32, "num_splits must be >= 1"),
    (dict(), None, jnp.float16, "cast to bfloat16"),
    (dict(block_k=2048, block_q=256), (1, 64, 4, 1, 4096, 256), jnp.float32, "VMEM"),
])
def test_tpu_kernel_rejects_layouts_a_tpu_cannot_run(kwargs, shape, dtype, match):
  b, t, hq, kvh, s, dh = shape or (1, 2, 4, 2, 256, 16)
  spec = jax.ShapeDtypeStruct   # shapes only: the checks run before any work
  q, kv = spec((b, t, hq, dh), dtype), spec((b, s, kvh, dh), dtype)
  fn = functools.partial(verify_attention, impl="pallas_tpu", interpret=True, **kwargs)
  with pytest.raises(ValueError, match=match):
    jax.eval_shape(fn, q, kv, kv, spec((b,), jnp.int32))


def test_tpu_paged_kernel_rejects_pages_off_the_sublane_tile():
  q, k, v, lengths, _ = make_inputs(1, 1, 2, 1, 24, 16, [5], dtype=jnp.bfloat16)
  pages = k.reshape(3, 8, 1, 16)
  with pytest.raises(ValueError, match="page_size must be a multiple of 16 for bfloat16"):
    paged_verify_attention(q, pages, pages, jnp.asarray([[0, 1, 2]]), lengths, impl="pallas_tpu",
                           interpret=True)
  with pytest.raises(ValueError, match="block_k must be None or the page size 8"):
    paged_verify_attention(q.astype(jnp.float32), pages.astype(jnp.float32),
                           pages.astype(jnp.float32), jnp.asarray([[0, 1, 2]]), lengths,
                           impl="pallas_tpu", interpret=True, block_k=16)


# Lowering for TPU runs Pallas' Mosaic lowering (the block-shape rule, op support) without a TPU.
@pytest.mark.parametrize("paged,t,g,kvh,dh,dtype,tree,num_splits", [
    (False, 4, 3, 3, 64, jnp.float32, False, 1),      # the default model's attention shape
    (False, 5, 4, 2, 128, jnp.bfloat16, True, 2),
    (True, 3, 4, 2, 128, jnp.bfloat16, True, 2),
    (True, 1, 8, 1, 64, jnp.float32, False, 1),
])
def test_tpu_kernel_lowers_to_mosaic(paged, t, g, kvh, dh, dtype, tree, num_splits):
  b = 2
  spec = jax.ShapeDtypeStruct
  q = spec((b, t, g * kvh, dh), dtype)
  args = (spec((b,), jnp.int32), spec((b, t, t), jnp.bool_) if tree else None)
  kw = dict(impl="pallas_tpu", interpret=False, num_splits=num_splits)
  if paged:
    pages = spec((40, 128, kvh, dh), dtype)
    traced = jax.jit(functools.partial(paged_verify_attention, **kw)).trace(
        q, pages, pages, spec((b, 9), jnp.int32), *args)
  else:
    kv = spec((b, 1000, kvh, dh), dtype)
    traced = jax.jit(functools.partial(verify_attention, **kw)).trace(q, kv, kv, *args)
  assert traced.lower(lowering_platforms=("tpu",)).as_text().count("tpu_custom_call") == 1


def test_speculative_generate_on_the_tpu_kernel_equals_plain_decoding():
  from jspec import Decoder, SpecDecoder
  model = Llama(LlamaConfig.tiny(), rngs=nnx.Rngs(5), attention_impl="pallas_tpu")
  prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 3, 9, 3, 9, 3, 9]]   # repeats: n-gram drafts land
  kw = dict(max_new_tokens=12, temperature=0.0, eos=False)
  config = {"method": "ngram", "num_speculative_tokens": 3}
  spec = SpecDecoder(model, config).generate(prompts, **kw)
  plain = Decoder(model).generate(prompts, **kw)
  assert spec.token_ids == plain.token_ids
  assert spec.rounds < 2 * 11      # drafts were accepted: multi-token verify blocks ran (2 rows)


# --- Review fixes: lengths past the cache, block tables past their end, the no-page sentinel (-1).
@pytest.mark.parametrize("impl,kw", [("pallas_gpu", dict(block_k=16)),
                                     ("pallas_tpu", dict(block_k=128))])
def test_a_length_past_the_cache_attends_the_whole_cache(impl, kw):
  """Row 0's length (230) is past the cache (S = 200, not a block multiple): every slot is prefix,
  and nothing past S may be read (the GPU kernel walked past S, the TPU one saw the padding)."""
  q, k, v, lengths, _ = make_inputs(2, 3, 4, 2, 200, 16, [230, 5])
  want = reference(q, k, v, lengths, None)
  assert np.isfinite(np.asarray(want)).all()
  out = verify_attention(q, k, v, lengths, impl=impl, interpret=True, **kw)
  assert np.isfinite(np.asarray(out)).all()
  assert_close(out, want, jnp.float32)


@pytest.mark.parametrize("impl", ["pallas_gpu", "pallas_tpu"])
def test_paged_no_page_sentinel_and_tables_past_their_end(impl):
  """Row 0: length 70 past its 4 pages of 16 (the kernel must not walk past the table). Row 1: its
  page 2 is unallocated (-1) inside its prefix and new keys, page 3 points past the pool (99); both
  are no page, whose slots hold no key, in the reference and in the kernels alike."""
  q, k, v, lengths, tm = make_inputs(2, 3, 4, 2, 64, 16, [70, 40], tree=True, seed=5)
  (k_pages, tables), (v_pages, _) = to_pages(k, 16, 0), to_pages(v, 16, 0)
  tables = tables.at[1, 2].set(-1).at[1, 3].set(99)
  want = paged_reference(q, k_pages, v_pages, tables, lengths, tm)
  # The sentinel's meaning, built independently: the contiguous cache with row 1's slots 32..63
  # masked out of the attention.
  slot_ok = np.ones((2, 64), bool)
  slot_ok[1, 32:] = False
  mask = attention_mask(lengths, 3, 64, tm) & jnp.asarray(slot_ok)[:, None, :]
  defined = verify_attention_reference(q, k, v, lengths, tm, mask=mask)
  np.testing.assert_allclose(np.asarray(want), np.asarray(defined), atol=1e-6)
  assert np.isfinite(np.asarray(want)).all()
  out = paged_verify_attention(q, k_pages, v_pages, tables, lengths, tm, impl=impl,
                               interpret=True, **(dict(block_k=16) if impl == "pallas_gpu" else {}))
  assert np.isfinite(np.asarray(out)).all()
  assert_close(out, want, jnp.float32)


# --- The CPU kernel (kernel_cpu.cc): reads only each row's keys.
ON_CPU = jax.default_backend() == "cpu" and kernel_cpu.available()
needs_cpu_kernel = pytest.mark.skipif(not ON_CPU, reason="the C++ kernel runs on XLA:CPU only")

# (B, T, G, KVH, S, Dh, lengths, tree): decode, chain and tree verify, ragged rows, a row at
# length 0 and one at a full cache, new keys past the end, prefill-sized blocks (several query
# tiles), long prefixes (keys split over threads), every head_dim the kernel instantiates.
CPU_CASES = [
    (2, 1, 3, 3, 80, 64, [0, 79], False),
    (3, 4, 3, 3, 300, 64, [290, 0, 300], False),    # row 0: slots 300..; row 2: full cache
    (2, 5, 4, 2, 200, 32, [150, 7], True),
    (1, 8, 8, 1, 1500, 128, [1400], True),          # one KV head: splits carry the work
    (2, 37, 3, 3, 120, 64, [0, 50], False),         # 111 rows: four query tiles
    (1, 100, 1, 4, 128, 16, [0], False),            # prefill, MHA
    (1, 3, 2, 2, 64, 96, [40], False),
    (1, 2, 1, 1, 40, 256, [30], True),
    (1, 1, 3, 3, 2100, 64, [2048], False),          # decode at a long context
]


@needs_cpu_kernel
@pytest.mark.parametrize("b,t,g,kvh,s,dh,lengths,tree", CPU_CASES)
def test_cpu_kernel_matches_the_oracle(b, t, g, kvh, s, dh, lengths, tree):
  q, k, v, lengths, tm = make_inputs(b, t, g * kvh, kvh, s, dh, lengths, tree=tree)
  out = jax.jit(functools.partial(verify_attention, impl="cpu"))(q, k, v, lengths, tm)
  assert out.shape == q.shape and out.dtype == q.dtype
  np.testing.assert_allclose(np.asarray(out), oracle(q, k, v, lengths, tm), atol=2e-5)


@needs_cpu_kernel
@pytest.mark.parametrize("b,t,g,kvh,s,dh,lengths,tree", [CPU_CASES[i] for i in (0, 1, 2, 3, 4, 8)])
def test_cpu_kernel_reads_a_bf16_cache_as_its_float32_values(b, t, g, kvh, s, dh, lengths, tree):
  """A bf16 cache (half the bytes) gives what the fp32 oracle gives on the same values: the
  kernel widens each key exactly and keeps the arithmetic in fp32."""
  q, k, v, lengths, tm = make_inputs(b, t, g * kvh, kvh, s, dh, lengths, tree=tree, seed=5)
  k16, v16 = k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)
  out = jax.jit(functools.partial(verify_attention, impl="cpu"))(q, k16, v16, lengths, tm)
  assert out.dtype == q.dtype
  widen = lambda x: x.astype(jnp.float32)
  np.testing.assert_allclose(np.asarray(out), oracle(q, widen(k16), widen(v16), lengths, tm),
                             atol=2e-5)
  assert choose_impl("auto", head_dim=dh, dtype=jnp.bfloat16, group=g) == "cpu"


@needs_cpu_kernel
def test_cpu_kernel_reads_no_key_past_a_rows_length():
  """Slots a row does not hold are NaN: the reference masks them after the product (NaN * 0 is
  NaN, so its output is NaN), the kernel never touches them and stays equal to the clean run."""
  q, k, v, lengths, tm = make_inputs(3, 4, 12, 3, 512, 64, [0, 100, 400], tree=True, seed=3)
  held = np.arange(512)[None, :] < (np.asarray(lengths) + 4)[:, None]        # [B, S]
  poison = lambda x: jnp.where(jnp.asarray(held)[:, :, None, None], x, jnp.nan)
  clean = verify_attention(q, k, v, lengths, tm, impl="cpu")
  dirty = verify_attention(q, poison(k), poison(v), lengths, tm, impl="cpu")
  np.testing.assert_array_equal(np.asarray(dirty), np.asarray(clean))
  assert np.isnan(np.asarray(verify_attention(q, poison(k), poison(v), lengths, tm,
                                              impl="reference"))).any()


@needs_cpu_kernel
@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("cache", ["f32", "bf16", "bf16 bits"])
def test_cpu_kernel_unwritten_block_matches_the_reference(tree, cache):
  """The block's fp32 keys beside a cache held in fp32, bf16, or bf16's uint16 bits (as
  models.kv_cache holds a target's bf16 cache on CPU): the reference on the cache's values."""
  q, k, v, lengths, tm = make_inputs(2, 5, 9, 3, 96, 64, [90, 13], tree=tree, seed=2)
  rng = np.random.default_rng(7)
  k_new, v_new = (jnp.asarray(rng.standard_normal((2, 5, 3, 64)), jnp.float32) for _ in range(2))
  if cache != "f32":
    k, v = k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)
  held = {"bf16 bits": lambda x: jax.lax.bitcast_convert_type(x, jnp.uint16)}.get(cache,
                                                                               lambda x: x)
  out = attend_unwritten(q, held(k), held(v), lengths, k_new, v_new, tm, impl="cpu")
  k, v = k.astype(jnp.float32), v.astype(jnp.float32)
  want = attend_unwritten_reference(q, k, v, lengths, k_new, v_new, tm)
  np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-5)


@needs_cpu_kernel
def test_cpu_kernel_zeros_for_a_query_that_sees_nothing_and_its_gradient():
  q, k, v, _, _ = make_inputs(1, 2, 2, 1, 16, 16, [0])
  tm = jnp.asarray([[[False, False], [True, True]]])
  out = verify_attention(q, k, v, jnp.asarray([0]), tm, impl="cpu")
  np.testing.assert_array_equal(np.asarray(out[0, 0]), 0.0)
  # Gradients are the reference's (inference never needs them; training code may call through).
  q, k, v, lengths, tm = make_inputs(2, 3, 4, 2, 32, 16, [10, 20], tree=True)
  loss = lambda impl: lambda a, b, c: jnp.sum(jnp.sin(verify_attention(a, b, c, lengths, tm,
                                                                       impl=impl)))
  got = jax.grad(loss("cpu"), argnums=(0, 1, 2))(q, k, v)
  want = jax.grad(loss("reference"), argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(got, want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@needs_cpu_kernel
def test_cpu_kernel_under_vmap():
  q, k, v, lengths, _ = make_inputs(2, 2, 6, 3, 40, 32, [5, 30])
  stack = lambda x: jnp.stack([x, x[::-1]])
  got = jax.vmap(lambda a, b, c, d: verify_attention(a, b, c, d, impl="cpu"))(
      stack(q), stack(k), stack(v), stack(lengths))
  for i, flip in enumerate((lambda x: x, lambda x: x[::-1])):
    want = reference(flip(q), flip(k), flip(v), flip(lengths), None)
    np.testing.assert_allclose(np.asarray(got[i]), np.asarray(want), atol=2e-5)


def test_cpu_impl_choice(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  monkeypatch.setattr(kernel_cpu, "available", lambda: True)
  assert choose_impl("auto", head_dim=64, dtype=jnp.float32, group=3) == "cpu"
  assert choose_impl("auto", head_dim=64, dtype=jnp.bfloat16, group=3) == "cpu"
  assert choose_impl("auto", head_dim=64, dtype=jnp.float16, group=3) == "reference"
  assert choose_impl("auto", head_dim=80, dtype=jnp.float32) == "reference"
  with pytest.raises(ValueError, match="float16.*impl='auto'"):
    choose_impl("cpu", head_dim=64, dtype=jnp.float16)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("data",))
  with jax.set_mesh(mesh):
    assert choose_impl("auto", head_dim=64, dtype=jnp.float32) == "reference"
  monkeypatch.setattr(kernel_cpu, "available", lambda: False)
  monkeypatch.setattr(kernel_cpu, "why_unavailable", lambda: "no compiler")
  assert choose_impl("auto", head_dim=64, dtype=jnp.float32) == "reference"
  with pytest.raises(ValueError, match="no compiler"):
    choose_impl("cpu", head_dim=64, dtype=jnp.float32)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  with pytest.raises(ValueError, match="another backend"):
    choose_impl("cpu", head_dim=64, dtype=jnp.float32)
