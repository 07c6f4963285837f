"""Verification attention on XLA:CPU through a jax.ffi C++ kernel (kernel_cpu.cc) that reads only
the keys each row holds: a step costs lengths[b] + T keys per row, not the cache's capacity S.

The C++ is compiled on first use and cached (`pallas_kernels.ffi_build`); without a compiler, or
with `JSPEC_CPU_ATTENTION=0`, `available()` is False and the api uses the jnp reference.
Gradients (not needed by inference) are the reference's.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp

from pallas_kernels import ffi_build
from pallas_kernels.verify_attention import reference

SOURCE = Path(__file__).with_name("kernel_cpu.cc")
NAME = "jspec_cpu_attention"
HEAD_DIMS = (16, 32, 64, 96, 128, 256)   # head dims the C++ instantiates (multiples of 8 lanes)
MAX_GROUP = 32                           # query heads per KV head that fit one tile
CACHE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))   # the cache's; math is fp32
BF16_BITS = jnp.dtype(jnp.uint16)   # a bf16 cache held as its bits (models.kv_cache.storage_dtype)


def value_dtype(stored) -> jnp.dtype:
  """The dtype of the values a cache buffer of dtype `stored` holds (bf16 for BF16_BITS)."""
  return jnp.dtype(jnp.bfloat16) if jnp.dtype(stored) == BF16_BITS else jnp.dtype(stored)


def logical(buf: jax.Array) -> jax.Array:
  """A cache buffer as its values: bf16 bits bitcast to bf16 (a copy of the buffer on XLA:CPU, so
  only the paths other than this kernel take it)."""
  if buf.dtype == BF16_BITS:
    return jax.lax.bitcast_convert_type(buf, jnp.bfloat16)
  return buf


def available() -> bool:
  """The kernel is built and registered (compiled on the first call)."""
  if os.environ.get("JSPEC_CPU_ATTENTION", "1") == "0":
    return False
  return ffi_build.register(SOURCE, NAME, (NAME,))[0]


def why_unavailable() -> str:
  if os.environ.get("JSPEC_CPU_ATTENTION", "1") == "0":
    return "disabled by JSPEC_CPU_ATTENTION=0"
  return ffi_build.register(SOURCE, NAME, (NAME,))[1]


def unsupported(head_dim: int, group: int, dtype) -> str | None:
  """Why the kernel cannot serve these shapes (None when it can)."""
  if jnp.dtype(dtype) not in CACHE_DTYPES:
    return f"dtype {jnp.dtype(dtype)} (the CPU kernel reads float32 or bfloat16 caches)"
  if head_dim not in HEAD_DIMS:
    return f"head_dim {head_dim} (the CPU kernel has {HEAD_DIMS})"
  if group > MAX_GROUP:
    return f"{group} query heads per KV head (the CPU kernel takes at most {MAX_GROUP})"
  return None


def _call(q, k, v, lengths, tree_mask, k_new, v_new):
  if not available():
    raise ffi_build.FfiBuildError(f"the CPU attention kernel is unavailable: {why_unavailable()}")
  causal = tree_mask is None
  written = k_new is None
  dummy = jnp.zeros((1,), jnp.float32)
  call = jax.ffi.ffi_call(NAME, jax.ShapeDtypeStruct(q.shape, jnp.float32),
                          vmap_method="sequential")
  if k.dtype != v.dtype:
    raise ValueError(f"k and v must share a dtype, got {k.dtype} and {v.dtype}")
  return call(q.astype(jnp.float32), k, v, lengths.astype(jnp.int32),
              jnp.zeros((1,), jnp.bool_) if causal else tree_mask,
              dummy if written else k_new.astype(jnp.float32),
              dummy if written else v_new.astype(jnp.float32),
              causal=int(causal), written=int(written))


@jax.custom_vjp
def _written(q, k, v, lengths, tree_mask):
  return _call(q, k, v, lengths, tree_mask, None, None)


def _written_fwd(q, k, v, lengths, tree_mask):
  return _written(q, k, v, lengths, tree_mask), (q, k, v, lengths, tree_mask)


def _written_bwd(res, g):
  q, k, v, lengths, tree_mask = res
  _, vjp = jax.vjp(lambda a, b, c: reference.verify_attention_reference(a, b, c, lengths,
                                                                        tree_mask), q, k, v)
  return (*vjp(g), None, None)


_written.defvjp(_written_fwd, _written_bwd)


def verify_attention_kernel(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array,
                            tree_mask: jax.Array | None = None) -> jax.Array:
  """`reference.verify_attention_reference` (block keys already in the cache) -> fp32
  [B, T, Hq, Dh]; a query that sees no key gets zeros."""
  return _written(q, k, v, lengths, tree_mask)


@jax.custom_vjp
def _unwritten(q, k_cache, v_cache, lengths, k_new, v_new, tree_mask):
  return _call(q, k_cache, v_cache, lengths, tree_mask, k_new, v_new)


def _unwritten_fwd(q, k_cache, v_cache, lengths, k_new, v_new, tree_mask):
  out = _unwritten(q, k_cache, v_cache, lengths, k_new, v_new, tree_mask)
  return out, (q, k_cache, v_cache, lengths, k_new, v_new, tree_mask)


def _unwritten_bwd(res, g):
  q, kc, vc, lengths, kn, vn, tree_mask = res
  f = lambda a, b, c, d, e: reference.attend_unwritten_reference(a, b, c, lengths, d, e, tree_mask)
  _, vjp = jax.vjp(f, q, kc, vc, kn, vn)
  dq, dkc, dvc, dkn, dvn = vjp(g)
  return dq, dkc, dvc, None, dkn, dvn, None


_unwritten.defvjp(_unwritten_fwd, _unwritten_bwd)


def attend_unwritten_kernel(q, k_cache, v_cache, lengths, k_new, v_new,
                            tree_mask: jax.Array | None = None) -> jax.Array:
  """`reference.attend_unwritten_reference` (the block's keys k_new/v_new [B, T, KVH, Dh] beside a cache
  that is only read) -> fp32 [B, T, Hq, Dh]."""
  return _unwritten(q, k_cache, v_cache, lengths, k_new, v_new, tree_mask)
