"""Linear and embedding layers whose weights stay in a stored format (`models.weight_formats`):
bf16, int8, or GGUF blocks, read by `cpu_gemm.qmatmul` without a float32 copy.

`store_weights` swaps a float `Llama`'s layers for these (quantising float weights, or taking a
GGUF file's blocks as they are); norms, biases, routers and MoE experts stay float32.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import cpu_gemm
from models.weight_formats import QuantTensor, check_shape, dequantize, quantize

WEIGHTS = ("auto", "f32", "bf16", "int8", "gguf")   # the user's choice (`--weights`)


class StoredWeight(nnx.Variable):
  """An array of a stored-format weight (never trained: not an nnx.Param)."""


class _Stored(nnx.Module):

  def __init__(self, t: QuantTensor):
    self.q = StoredWeight(jnp.asarray(t.q))
    self.d = StoredWeight(jnp.asarray(t.d))
    self.m = StoredWeight(jnp.asarray(t.m))
    self.fmt = t.fmt
    self.shape = tuple(t.shape)

  def tensor(self) -> QuantTensor:
    return QuantTensor(self.q[...], self.d[...], self.m[...], self.fmt, self.shape)


class StoredLinear(_Stored):
  """y = x @ w^T (+ bias) for a stored weight w [out, in]; output float32."""

  def __init__(self, t: QuantTensor, bias: jax.Array | None = None, matmul_impl: str = "auto"):
    super().__init__(t)
    self.bias = nnx.Param(jnp.asarray(bias, jnp.float32)) if bias is not None else None
    self.matmul_impl = matmul_impl

  def __call__(self, x: jax.Array) -> jax.Array:
    y = cpu_gemm.qmatmul(x, self.tensor(), impl=self.matmul_impl)
    return y if self.bias is None else y + self.bias[...]


class StoredEmbed(_Stored):
  """A token table [V, H] in a stored format: rows dequantised on lookup; `attend` is the tied
  LM head (x @ table^T)."""

  def __init__(self, t: QuantTensor, matmul_impl: str = "auto"):
    super().__init__(t)
    self.matmul_impl = matmul_impl

  def rows(self, ids: jax.Array | None = None) -> jax.Array:
    """Rows `ids` [...] -> [..., H] (all rows when None), float32."""
    return dequantize(self.tensor(), rows=ids)

  def __call__(self, ids: jax.Array) -> jax.Array:
    return self.rows(ids)

  def attend(self, x: jax.Array) -> jax.Array:
    return cpu_gemm.qmatmul(x, self.tensor(), impl=self.matmul_impl)


def weight_bytes(model: nnx.Module) -> int:
  """Bytes of every array in the model's state (weights as held in memory)."""
  return int(sum(np.dtype(x.dtype).itemsize * x.size
                 for x in jax.tree.leaves(nnx.state(model)) if hasattr(x, "dtype")))


def store_weights(model: nnx.Module, tensors: Mapping[tuple, object] | None = None,
                  fmt: str | None = None) -> nnx.Module:
  """Swaps `model`'s dense linear layers, embedding and LM head for stored-format layers, in place.

  tensors: path -> QuantTensor ([out, in]) for weights already stored (a GGUF file's blocks);
  fmt: quantise every other dense weight to it ("bf16", "int8", "q8_0", "q4_0", "q4_1"), or None
  to leave them float. Returns the model."""
  tensors = dict(tensors or {})
  impl = getattr(model, "matmul_impl", "auto")
  for path, module in list(nnx.iter_modules(model)):
    for name, child in list(vars(module).items()):
      linear = isinstance(child, nnx.Linear) and isinstance(child.dot_general, cpu_gemm.DotGeneral)
      if not (linear or isinstance(child, nnx.Embed)):
        continue
      key = (*path, name, "kernel" if linear else "embedding")
      if key in tensors:
        t = tensors.pop(key)
      elif fmt is not None:
        w = np.asarray(child.kernel[...]).T if linear else np.asarray(child.embedding[...])
        check_shape(fmt, *w.shape)
        t = quantize(w, fmt)
      else:
        continue
      if linear:
        bias = child.bias[...] if child.bias is not None else None
        setattr(module, name, StoredLinear(t, bias, impl))
      else:
        setattr(module, name, StoredEmbed(t, impl))
  if tensors:
    raise ValueError(f"no layer for stored weights {sorted(tensors)[:3]}")
  return model
