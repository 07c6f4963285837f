"""Weight formats kept as stored: bf16, int8 per output channel, and GGUF's Q8_0 / Q4_0 / Q4_1
blocks. A `QuantTensor` holds a linear weight as rows [N, K] (output channels x contraction, the
layout of GGUF and of Hugging Face checkpoints) in its stored bytes; `dequantize` is the pure-JAX
reference every kernel is checked against, and `quantize` makes each format from float weights.

Formats (`w` is the float weight the stored bytes stand for):
- bf16:  q bf16 [N, K]; w = q.
- int8:  q int8 [N, K], d f32 [N]: one symmetric scale per output channel; w = d q.
- q8_0:  q int8 [N, K], d f16 [N, K/32]: a scale per block of 32 weights along K; w = d q.
- q4_0:  q uint8 [N, K/2], d f16 [N, K/32]; w = d (q - 8) with q in 0..15.
- q4_1:  q uint8 [N, K/2], d, m f16 [N, K/32]; w = d q + m.
In a 4-bit block (16 bytes), byte j holds weight j in its low nibble and weight j + 16 in its high
nibble, as GGUF stores it, so a GGUF tensor's blocks are split into q/d/m without touching a bit.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

FORMATS = ("f32", "bf16", "int8", "q8_0", "q4_0", "q4_1")
CODES = {"bf16": 1, "int8": 2, "q8_0": 3, "q4_0": 4, "q4_1": 5}   # models/cpu_gemm/kernel.cc
BLOCK = 32
GGUF_TYPES = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1", "BF16": "bf16"}
_BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}   # GGUF bytes per 32 weights


class WeightFormatError(ValueError):
  """A weight cannot be held in the asked format."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantTensor:
  """A weight [N, K] in `fmt`'s stored arrays (see the module docstring); d and m are empty
  [0] arrays where the format has none."""
  q: jax.Array
  d: jax.Array
  m: jax.Array
  fmt: str = dataclasses.field(metadata=dict(static=True))
  shape: tuple[int, int] = dataclasses.field(metadata=dict(static=True))

  @property
  def nbytes(self) -> int:
    return int(sum(a.size * a.dtype.itemsize for a in (self.q, self.d, self.m)))


def check_shape(fmt: str, n: int, k: int) -> None:
  """Raises WeightFormatError unless a [n, k] weight fits fmt's blocks."""
  if fmt not in FORMATS or fmt == "f32":
    raise WeightFormatError(f"unknown stored weight format {fmt!r}; one of {FORMATS[1:]}")
  unit = BLOCK if fmt in _BLOCK_BYTES else 16
  if k % unit:
    raise WeightFormatError(f"a {fmt} weight needs its contraction size K to be a multiple of "
                            f"{unit}, got [{n}, {k}]; keep this model in f32 (--weights f32)")


def _empty() -> np.ndarray:
  return np.zeros((0,), np.float32)


def quantize(w: np.ndarray, fmt: str) -> QuantTensor:
  """w [N, K] float -> fmt (round to nearest; q4_0/q4_1/q8_0 as llama.cpp's reference quantizers:
  scale from the block's extreme, values rounded to the nearest step)."""
  w = np.asarray(w, np.float32)
  n, k = w.shape
  check_shape(fmt, n, k)
  if fmt == "bf16":
    return QuantTensor(jnp.asarray(w, jnp.bfloat16), _empty(), _empty(), fmt, (n, k))
  if fmt == "int8":
    amax = np.abs(w).max(axis=1)
    d = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / d[:, None]), -127, 127).astype(np.int8)
    return QuantTensor(q, d, _empty(), fmt, (n, k))
  blocks = w.reshape(n, k // BLOCK, BLOCK)
  if fmt == "q8_0":
    d = (np.abs(blocks).max(axis=2) / 127.0).astype(np.float16)
    inv = _inverse(d)
    q = np.clip(np.rint(blocks * inv[..., None]), -127, 127).astype(np.int8).reshape(n, k)
    return QuantTensor(q, d, _empty(), fmt, (n, k))
  if fmt == "q4_0":   # the signed extreme maps to -8
    idx = np.abs(blocks).argmax(axis=2)
    ext = np.take_along_axis(blocks, idx[..., None], axis=2)[..., 0]
    d = (ext / -8.0).astype(np.float16)
    inv = _inverse(d)
    q = np.clip(np.rint(blocks * inv[..., None]) + 8, 0, 15).astype(np.uint8)
    return QuantTensor(_pack_nibbles(q, n, k), d, _empty(), fmt, (n, k))
  lo, hi = blocks.min(axis=2), blocks.max(axis=2)          # q4_1
  d = ((hi - lo) / 15.0).astype(np.float16)
  m = lo.astype(np.float16)
  inv = _inverse(d)
  q = np.clip(np.rint((blocks - m.astype(np.float32)[..., None]) * inv[..., None]), 0, 15)
  return QuantTensor(_pack_nibbles(q.astype(np.uint8), n, k), d, m, fmt, (n, k))


def _inverse(d: np.ndarray) -> np.ndarray:
  """1 / d as float32, 0 where d is 0 (an all-zero block)."""
  d = d.astype(np.float32)
  return np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)


def _pack_nibbles(q: np.ndarray, n: int, k: int) -> np.ndarray:
  """q [N, K/32, 32] in 0..15 -> GGUF nibble order [N, K/2]."""
  return (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8).reshape(n, k // 2)


def from_gguf(raw: np.ndarray, fmt: str, n: int, k: int) -> QuantTensor:
  """A GGUF tensor's raw blocks (uint8 [N, K/32 * block bytes], as `gguf.GGUFReader` maps them)
  -> QuantTensor; the bytes are split into q, d and m, none changed."""
  check_shape(fmt, n, k)
  raw = np.ascontiguousarray(raw, np.uint8).reshape(n, -1)
  if fmt == "bf16":
    return QuantTensor(jnp.asarray(raw.view(np.uint16).view(jnp.bfloat16).reshape(n, k)),
                       _empty(), _empty(), fmt, (n, k))
  size = _BLOCK_BYTES[fmt]
  if raw.shape[1] != k // BLOCK * size:
    raise WeightFormatError(f"a {fmt} tensor [{n}, {k}] needs {k // BLOCK * size} bytes per row, "
                            f"the file holds {raw.shape[1]}")
  blocks = raw.reshape(n, k // BLOCK, size)
  d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0]
  if fmt == "q8_0":
    return QuantTensor(np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(n, k), d,
                       _empty(), fmt, (n, k))
  if fmt == "q4_0":
    return QuantTensor(np.ascontiguousarray(blocks[..., 2:]).reshape(n, k // 2), d, _empty(),
                       fmt, (n, k))
  m = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0]
  return QuantTensor(np.ascontiguousarray(blocks[..., 4:]).reshape(n, k // 2), d, m, fmt, (n, k))


def permute_rows(t: QuantTensor, order: np.ndarray) -> QuantTensor:
  """Rows (output channels) of t in `order`: every stored array is per row."""
  pick = lambda a: a if a.size == 0 else np.asarray(a)[order]
  return QuantTensor(pick(t.q), pick(t.d), pick(t.m), t.fmt, t.shape)


def dequantize(t: QuantTensor, rows: jax.Array | None = None) -> jax.Array:
  """The reference: t's weights [N, K] (or rows `rows` [...] -> [..., K]) in float32."""
  n, k = t.shape
  take = (lambda a: a) if rows is None else (lambda a: jnp.asarray(a)[rows])
  q = take(t.q)
  lead = q.shape[:-1]
  if t.fmt == "bf16":
    return q.astype(jnp.float32)
  if t.fmt == "int8":
    return q.astype(jnp.float32) * take(t.d).astype(jnp.float32)[..., None]
  d = take(t.d).astype(jnp.float32)[..., None]                          # [..., K/32, 1]
  if t.fmt == "q8_0":
    vals = q.astype(jnp.float32).reshape(*lead, k // BLOCK, BLOCK)
    return (vals * d).reshape(*lead, k)
  b = q.reshape(*lead, k // BLOCK, 16).astype(jnp.int32)
  vals = jnp.concatenate([b & 15, b >> 4], axis=-1).astype(jnp.float32)  # [..., K/32, 32]
  if t.fmt == "q4_0":
    return ((vals - 8.0) * d).reshape(*lead, k)
  return (vals * d + take(t.m).astype(jnp.float32)[..., None]).reshape(*lead, k)


def reference_matmul(x: jax.Array, t: QuantTensor) -> jax.Array:
  """x [..., K] @ dequantize(t)^T -> [..., N] in float32."""
  return jnp.matmul(x.astype(jnp.float32), dequantize(t).T)
