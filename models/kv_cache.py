"""KV cache as a plain pytree: per-layer K/V buffers plus per-row committed lengths.

Rows advance independently; rolling back a row is setting its length (slots past it are garbage that
the next write overwrites). Layers are a tuple of arrays rather than one stacked [L, ...] array
because XLA:CPU runs the unrolled per-layer layout markedly faster (design.md, measured).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from models.config import LlamaConfig
from pallas_kernels.verify_attention.kernel_cpu import BF16_BITS, value_dtype


# On XLA:CPU a bf16 cache is stored as its uint16 bits: XLA:CPU widens a bf16 scatter's whole
# operand to float32 and back, and a bitcast of the buffer is a copy too (each a copy of the cache
# per layer per step), while an integer scatter writes in place. The CPU attention kernel reads the
# bits as bf16; `logical` gives the values. Targets' caches (`Llama.init_cache`) are held so.
def storage_dtype(dtype) -> jnp.dtype:
  """The dtype a cache of `dtype` is held in on this backend."""
  dtype = jnp.dtype(dtype)
  if dtype == jnp.bfloat16 and jax.default_backend() == "cpu":
    return BF16_BITS
  return dtype


def set_rows(buf: jax.Array, rows: jax.Array, slots: jax.Array, new: jax.Array) -> jax.Array:
  """buf.at[rows, slots].set(new) (new rounded to the cache's values), slots past the buffer
  dropped; in place for bf16 caches held as bits too."""
  if new.dtype != buf.dtype:   # values (a buffer's own entries, bits included, move as they are)
    new = new.astype(value_dtype(buf.dtype))
    if buf.dtype == BF16_BITS:
      new = jax.lax.bitcast_convert_type(new, BF16_BITS)
  return buf.at[rows, slots].set(new, mode="drop")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  k: tuple[jax.Array, ...]   # L x [B, S, KVH, Dh]
  v: tuple[jax.Array, ...]   # L x [B, S, KVH, Dh]
  lengths: jax.Array         # [B] int32, committed tokens per row

  @classmethod
  def init(cls, config: LlamaConfig, batch_size: int, max_len: int,
           dtype=jnp.float32) -> "KVCache":
    if batch_size <= 0 or max_len <= 0:
      raise ValueError(f"KVCache needs batch_size > 0 and max_len > 0, got {batch_size}, {max_len}")
    shape = (batch_size, max_len, config.num_kv_heads, config.head_dim)
    zeros = tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))
    cache = cls(k=zeros, v=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
                lengths=jnp.zeros((batch_size,), jnp.int32))
    return cache.placed()

  def placed(self) -> "KVCache":
    """Under a mesh (`jax.set_mesh`, see `jspec.sharding`): rows over the "data" axis and KV heads
    over "model" (each where it divides), so that the cache sits beside the heads that write it.
    Without a mesh: unchanged."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
      return self
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    split = lambda name, dim: name if sizes.get(name, 1) > 1 and dim % sizes[name] == 0 else None
    b, _, kvh, _ = self.k[0].shape
    rows = split("data", b)
    kv_spec = jax.sharding.PartitionSpec(rows, None, split("model", kvh), None)
    put = lambda x, spec: jax.lax.with_sharding_constraint(x, spec)
    return KVCache(k=tuple(put(x, kv_spec) for x in self.k),
                   v=tuple(put(x, kv_spec) for x in self.v),
                   lengths=put(self.lengths, jax.sharding.PartitionSpec(rows)))

  @property
  def dtype(self) -> jnp.dtype:
    """The dtype of the values the cache holds (bf16 for a cache kept as bf16 bits)."""
    return value_dtype(self.k[0].dtype)

  @property
  def batch_size(self) -> int:
    return self.lengths.shape[0]

  @property
  def max_len(self) -> int:
    return self.k[0].shape[1]

  def with_lengths(self, lengths: jax.Array) -> "KVCache":
    return dataclasses.replace(self, lengths=jnp.asarray(lengths, jnp.int32))

  def write(self, layer: int, k_new: jax.Array, v_new: jax.Array) -> "KVCache":
    """Writes [B, T, KVH, Dh] at slots lengths[b] + t; slots past max_len are dropped, never clamped."""
    b, t = k_new.shape[:2]
    rows = jnp.arange(b)[:, None]
    slots = self.lengths[:, None] + jnp.arange(t)[None, :]
    k = list(self.k)
    v = list(self.v)
    k[layer] = set_rows(k[layer], rows, slots, k_new)
    v[layer] = set_rows(v[layer], rows, slots, v_new)
    return dataclasses.replace(self, k=tuple(k), v=tuple(v))

  def write_block(self, k_new: tuple[jax.Array, ...], v_new: tuple[jax.Array, ...]) -> "KVCache":
    """`write` for every layer (L x [B, T, KVH, Dh], as `Llama(write_cache=False)` returns them);
    lengths unchanged."""
    if len(k_new) != len(self.k) or len(v_new) != len(self.v):
      raise ValueError(f"write_block needs one k and one v per layer ({len(self.k)}), got "
                       f"{len(k_new)} and {len(v_new)}")
    cache = self
    for layer, (k, v) in enumerate(zip(k_new, v_new)):
      cache = cache.write(layer, k, v)
    return cache
