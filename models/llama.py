"""Llama-family decoder (Llama, SmolLM2, Qwen2, Qwen3) in Flax NNX over an explicit KV cache.

One forward handles prefill, single-token decode, multi-token verification and tree verification:
T >= 1 new tokens per row at per-row cache lengths, RoPE positions given per token, and an optional
[B, T, T] mask among the new tokens (None = causal). A packed forward (`pack`) runs the projections
and MLPs over only the listed tokens of the [B, T] block (rows verifying different numbers of
drafts), attention keeping the padded layout.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from models import cpu_gemm
from models.config import LlamaConfig
from models.kv_cache import KVCache, storage_dtype
from models.moe import MoE
from models.stored_layers import StoredEmbed, StoredLinear
from models.weight_formats import dequantize
from pallas_kernels.verify_attention import (IMPLS, attend_unwritten, attention_mask, choose_impl,
                                             verify_attention)


PREFILL_ROWS = 1024   # token rows per prefill chunk (over the batch): GEMMs this tall run near peak
PREFILL_CHUNK_RANGE = (64, 512)


CACHE_DTYPES = ("float32", "bfloat16")


def check_cache_dtype(cache_dtype, dtype) -> jnp.dtype:
  """The KV cache dtype a model keeps: `cache_dtype` (float32 or bfloat16), else `dtype`."""
  if cache_dtype is None:
    return jnp.dtype(dtype)
  try:
    chosen = jnp.dtype(cache_dtype)
  except TypeError:
    chosen = None
  if chosen is None or chosen.name not in CACHE_DTYPES:
    raise ValueError(f"cache_dtype must be one of {', '.join(CACHE_DTYPES)}, got {cache_dtype!r}")
  return chosen


def prefill_chunk(batch_size: int) -> int:
  """Prompt tokens per prefill chunk for a batch: PREFILL_ROWS rows in all, within
  PREFILL_CHUNK_RANGE, a power of two (prompt widths are bucketed to powers of two)."""
  lo, hi = PREFILL_CHUNK_RANGE
  want = max(1, PREFILL_ROWS // max(batch_size, 1))
  return min(hi, max(lo, 1 << (want.bit_length() - 1)))


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float, *, dtype=jnp.float32):
    self.scale = nnx.Param(jnp.ones((dim,), dtype))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (normed * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotate-half RoPE (the HF convention). x: [B, T, H, Dh], positions: [B, T]."""
  dh = x.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh))   # [Dh/2]
  angles = positions.astype(jnp.float32)[..., None] * inv_freq                   # [B, T, Dh/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


class Attention(nnx.Module):

  def __init__(self, cfg: LlamaConfig, *, dtype, rngs: nnx.Rngs, attention_impl: str = "auto",
               matmul_impl: str = "auto"):
    h, dh = cfg.hidden_size, cfg.head_dim
    dot = cpu_gemm.DotGeneral(matmul_impl)
    lin = lambda i, o, bias: nnx.Linear(i, o, use_bias=bias, param_dtype=dtype, dtype=dtype,
                                        dot_general=dot, rngs=rngs)
    self.q_proj = lin(h, cfg.num_heads * dh, cfg.qkv_bias)
    self.k_proj = lin(h, cfg.num_kv_heads * dh, cfg.qkv_bias)
    self.v_proj = lin(h, cfg.num_kv_heads * dh, cfg.qkv_bias)
    self.o_proj = lin(cfg.num_heads * dh, h, False)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(dh, cfg.rms_eps, dtype=dtype)
      self.k_norm = RMSNorm(dh, cfg.rms_eps, dtype=dtype)
    self.cfg = cfg
    self.attention_impl = attention_impl

  def __call__(self, x, positions, cache: KVCache, layer: int, mask, tree_mask=None,
               write: bool = True, pack=None):
    """mask: [B, T, S] `attention_mask` for the reference path (None: the api builds it); the
    kernel path reads cache.lengths and tree_mask [B, T, T] instead.
    write=False leaves the cache as it is and returns the block's (k, v) in its place.
    pack: a `Packing`: x is [1, N, H], N tokens of the [B, T] block (positions' shape); the
    output is packed the same way."""
    cfg = self.cfg
    b, t = positions.shape
    unpack = (lambda y: y) if pack is None else (lambda y: pack.unpack(y, b, t))
    q = unpack(self.q_proj(x)).reshape(b, t, cfg.num_heads, cfg.head_dim)      # [B, T, Hq, Dh]
    k = unpack(self.k_proj(x)).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)   # [B, T, KVH, Dh]
    v = unpack(self.v_proj(x)).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)   # [B, T, KVH, Dh]
    repack = (lambda y: y) if pack is None else pack.pack
    if cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    q = rope(q, positions, cfg.rope_theta)
    k = rope(k, positions, cfg.rope_theta)
    if not write:   # the block's K/V as the cache will hold them, so both paths read the same
      k, v = k.astype(cache.dtype), v.astype(cache.dtype)
      out = attend_unwritten(q, cache.k[layer], cache.v[layer], cache.lengths, k, v, tree_mask,
                             impl=self.attention_impl)
      return self.o_proj(repack(out.reshape(b, t, -1))), (k, v)
    cache = cache.write(layer, k, v)
    out = verify_attention(q, cache.k[layer], cache.v[layer], cache.lengths, tree_mask,
                           impl=self.attention_impl, mask=mask)             # [B, T, Hq, Dh]
    return self.o_proj(repack(out.reshape(b, t, -1))), cache


@dataclasses.dataclass(frozen=True)
class Packing:
  """N of the tokens of a [B, T] block, in both directions as gathers (a scatter per layer cost
  more on XLA:CPU)."""
  index: jax.Array       # [N] distinct indices into the flattened [B, T] block
  inverse: jax.Array     # [B * T] each token's place among the N, N for a token left out

  @classmethod
  def of(cls, index: jax.Array, b: int, t: int) -> "Packing":
    n = index.shape[0]
    inverse = jnp.full((b * t,), n, jnp.int32).at[index].set(jnp.arange(n, dtype=jnp.int32))
    return cls(index, inverse)

  def pack(self, x: jax.Array) -> jax.Array:
    """[B, T, ...] -> [1, N, ...]."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])[self.index][None]

  def unpack(self, x: jax.Array, b: int, t: int) -> jax.Array:
    """[1, N, ...] -> [B, T, ...], zeros at the tokens left out."""
    padded = jnp.concatenate([x[0], jnp.zeros((1, *x.shape[2:]), x.dtype)], axis=0)
    return padded[self.inverse].reshape(b, t, *x.shape[2:])


class MLP(nnx.Module):

  def __init__(self, cfg: LlamaConfig, *, dtype, rngs: nnx.Rngs, matmul_impl: str = "auto"):
    dot = cpu_gemm.DotGeneral(matmul_impl)
    lin = lambda i, o: nnx.Linear(i, o, use_bias=False, param_dtype=dtype, dtype=dtype,
                                  dot_general=dot, rngs=rngs)
    self.gate_proj = lin(cfg.hidden_size, cfg.intermediate_size)
    self.up_proj = lin(cfg.hidden_size, cfg.intermediate_size)
    self.down_proj = lin(cfg.intermediate_size, cfg.hidden_size)

  def __call__(self, x):
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nnx.Module):

  def __init__(self, cfg: LlamaConfig, *, dtype, rngs: nnx.Rngs, attention_impl: str = "auto",
               matmul_impl: str = "auto", moe: bool = False, moe_impl: str = "auto"):
    self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, dtype=dtype)
    self.attn = Attention(cfg, dtype=dtype, rngs=rngs, attention_impl=attention_impl,
                          matmul_impl=matmul_impl)
    self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, dtype=dtype)
    self.mlp = (MoE(cfg, dtype=dtype, rngs=rngs, moe_impl=moe_impl) if moe else
                MLP(cfg, dtype=dtype, rngs=rngs, matmul_impl=matmul_impl))

  def __call__(self, x, positions, cache, layer, mask, tree_mask=None, write: bool = True,
               pack=None):
    a, aux = self.attn(self.input_norm(x), positions, cache, layer, mask, tree_mask, write, pack)
    x = x + a
    return x + self.mlp(self.post_attn_norm(x)), aux


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ForwardOutput:
  logits: jax.Array                 # [B, T, V], or [B, K, V] when logit_indices is given
  cache: KVCache                    # lengths advanced by num_new (default T)
  hidden: tuple[jax.Array, ...]     # one [B, T, H] per requested tap
  new_kv: tuple | None = None       # write_cache=False: (L x k, L x v) [B, T, KVH, Dh] of the
                                    # block, for `KVCache.write_block`; the cache is unchanged


class Llama(nnx.Module):
  """Decoder-only LM. Hidden-state tap convention: tap i is the residual stream *entering* layer i
  (EAGLE-3, vLLM); tap i therefore equals the *output* of layer i-1 (DFlash's convention is tap i+1),
  and tap L is the last layer's output before the final norm.

  attention_impl: "auto" (Pallas kernel on GPU and TPU, the C++ kernel on CPU, which reads only the
  keys each row holds), "pallas", "cpu" or "reference"; static, see `pallas_kernels.verify_attention`.
  matmul_impl: "auto" (on CPU, fp32 products of <= 16 rows through `models.cpu_gemm`, which reads
  each weight once for a whole verify block; XLA's dot otherwise), "ffi" or "xla"; static.
  moe_impl: the expert GEMMs of MoE layers (`models.moe.MoE`, `pallas_kernels.moe_gemm.gmm`).
  cache_dtype: the KV cache's dtype (default: `dtype`); bfloat16 halves the bytes a step reads
  at long context, the attention math stays in fp32 (`init_cache`; static)."""

  def __init__(self, cfg: LlamaConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None,
               attention_impl: str = "auto", matmul_impl: str = "auto", moe_impl: str = "auto",
               cache_dtype=None):
    if attention_impl not in IMPLS:
      raise ValueError(f"attention_impl must be one of {IMPLS}, got {attention_impl!r}")
    if matmul_impl not in cpu_gemm.IMPLS:
      raise ValueError(f"matmul_impl must be one of {cpu_gemm.IMPLS}, got {matmul_impl!r}")
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    self.config = cfg
    self.activation_dtype = jnp.dtype(dtype)
    self.cache_dtype = check_cache_dtype(cache_dtype, dtype)
    self.attention_impl = attention_impl
    self.matmul_impl = matmul_impl
    self.embed = nnx.Embed(cfg.vocab_size, cfg.hidden_size, param_dtype=dtype, dtype=dtype,
                           rngs=rngs)
    self.moe_impl = moe_impl
    self.layers = nnx.List([Block(cfg, dtype=dtype, rngs=rngs, attention_impl=attention_impl,
                                  matmul_impl=matmul_impl, moe=cfg.is_moe_layer(i),
                                  moe_impl=moe_impl) for i in range(cfg.num_layers)])
    self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, dtype=dtype)
    if not cfg.tie_embeddings:
      self.lm_head = nnx.Linear(cfg.hidden_size, cfg.vocab_size, use_bias=False,
                                param_dtype=dtype, dtype=dtype,
                                dot_general=cpu_gemm.DotGeneral(matmul_impl), rngs=rngs)

  def __call__(self, tokens: jax.Array, cache: KVCache, *, positions: jax.Array | None = None,
               tree_mask: jax.Array | None = None, num_new: jax.Array | None = None,
               logit_indices: jax.Array | None = None, taps: Sequence[int] = (),
               write_cache: bool = True, pack: jax.Array | None = None) -> ForwardOutput:
    """tokens [B, T] go to cache slots lengths[b] + t.

    positions: [B, T] RoPE positions (default: the slots; a tree passes prefix length + depth).
    tree_mask: [B, T, T] bool, which new tokens each new token attends to (default causal).
    num_new:   [B] how far each row's length advances (default T; prefill of ragged prompts).
    logit_indices: [B, K] which of the T positions to project to logits (default all).
    write_cache: False reads the cache without writing it (jnp attention over [prefix, block]) and
      returns the block's K/V in `new_kv` with the cache unchanged, for callers that branch on the
      block (a `lax.switch` returning a written cache copies all of it) and write once after.
    pack: [N] distinct indices into the flattened [B, T] block: only those tokens go through the
      embedding, projections, MLPs and LM head (a verify whose rows hold different numbers of
      drafts pays for N tokens, not B x T); attention keeps the [B, T] layout. The outputs are in
      the [B, T] layout, with zero logits and taps at the tokens left out (the cache gets garbage
      K/V there, past what the caller keeps).
    """
    b, t = tokens.shape
    if pack is not None and logit_indices is not None:
      raise ValueError("pack and logit_indices cannot be combined")
    for tap in taps:
      if not 0 <= tap <= self.config.num_layers:
        raise ValueError(f"tap {tap} out of range [0, {self.config.num_layers}]")
    if positions is None:
      positions = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    # The reference path shares one [B, T, S] mask across layers; the kernels build their own.
    impl = choose_impl(self.attention_impl, head_dim=self.config.head_dim, dtype=cache.dtype,
                       group=self.config.num_heads // self.config.num_kv_heads)
    mask = None
    if impl == "reference" and write_cache:
      mask = attention_mask(cache.lengths, t, cache.max_len, tree_mask)    # [B, T, S]
    if pack is not None:
      pack = Packing.of(pack, b, t)
    unpack = (lambda y: y) if pack is None else (lambda y: pack.unpack(y, b, t))
    x = self.embed(tokens if pack is None else pack.pack(tokens))          # [B, T, H] / [1, N, H]
    hidden = {}
    new_kv = []
    for i, block in enumerate(self.layers):
      if i in taps:
        hidden[i] = unpack(x)
      x, aux = block(x, positions, cache, i, mask, tree_mask, write_cache, pack)
      if write_cache:
        cache = aux
      else:
        new_kv.append(aux)
    if self.config.num_layers in taps:
      hidden[self.config.num_layers] = unpack(x)
    if logit_indices is not None:
      x = jnp.take_along_axis(x, logit_indices[:, :, None], axis=1)        # [B, K, H]
    logits = unpack(self.logits(self.norm(x)))
    taps_out = tuple(hidden[i] for i in taps)
    if not write_cache:
      kv = (tuple(k for k, _ in new_kv), tuple(v for _, v in new_kv))
      return ForwardOutput(logits=logits, cache=cache, hidden=taps_out, new_kv=kv)
    advance = jnp.full((b,), t, jnp.int32) if num_new is None else num_new.astype(jnp.int32)
    cache = cache.with_lengths(cache.lengths + advance)
    return ForwardOutput(logits=logits, cache=cache, hidden=taps_out)

  def init_cache(self, batch_size: int, max_len: int) -> KVCache:
    """An empty KV cache for this model in its `cache_dtype`."""
    return KVCache.init(self.config, batch_size, max_len, dtype=storage_dtype(self.cache_dtype))

  def prefill(self, tokens: jax.Array, cache: KVCache, prompt_lens: jax.Array, *,
              taps: Sequence[int] = (), chunk: int | None = None) -> ForwardOutput:
    """Prefill of right-padded prompts tokens [B, P] (row b holds prompt_lens[b] tokens) in chunks
    of `chunk` tokens (default `prefill_chunk(B)`): activations stay [B, chunk, ...] whatever P
    is, each chunk's attention reads only the keys written so far, and chunks past the longest
    prompt are not run (a prompt width padded far past the prompts costs nothing). Returns the
    logits at each row's last prompt token [B, 1, V], the cache with lengths advanced by
    prompt_lens, and the taps [B, P, H] (zero past the last chunk run); equal to the one-shot
    forward (`__call__` with num_new and logit_indices) up to rounding."""
    b, p = tokens.shape
    chunk = prefill_chunk(b) if chunk is None else chunk
    if chunk < 1:
      raise ValueError(f"prefill chunk must be >= 1, got {chunk}")
    prompt_lens = prompt_lens.astype(jnp.int32)
    if p <= chunk:
      return self(tokens, cache, num_new=prompt_lens, logit_indices=(prompt_lens - 1)[:, None],
                  taps=taps)
    n = -(-p // chunk)
    padded = jnp.pad(tokens, ((0, 0), (0, n * chunk - p)))                     # [B, n * chunk]
    last = prompt_lens - 1
    needed = (jnp.max(prompt_lens) + chunk - 1) // chunk                      # chunks to run

    def body(carry):
      i, cache, logits, hidden = carry
      start = i * chunk
      block = jax.lax.dynamic_slice_in_dim(padded, start, chunk, axis=1)      # [B, chunk]
      out = self(block, cache, num_new=jnp.clip(prompt_lens - start, 0, chunk),
                 logit_indices=jnp.clip(last - start, 0, chunk - 1)[:, None], taps=taps)
      mine = (last >= start) & (last < start + chunk)                        # [B]
      logits = jnp.where(mine[:, None, None], out.logits, logits)
      hidden = tuple(jax.lax.dynamic_update_slice_in_dim(buf, h.astype(buf.dtype), start, axis=1)
                     for buf, h in zip(hidden, out.hidden))
      return i + 1, out.cache, logits, hidden

    hidden = tuple(jnp.zeros((b, n * chunk, self.config.hidden_size), self.activation_dtype)
                   for _ in taps)
    logits = jnp.zeros((b, 1, self.config.vocab_size), jnp.float32)
    _, cache, logits, hidden = jax.lax.while_loop(lambda c: c[0] < needed, body,
                                                  (jnp.int32(0), cache, logits, hidden))
    return ForwardOutput(logits=logits, cache=cache, hidden=tuple(h[:, :p] for h in hidden))

  def embed_table(self) -> jax.Array:
    """The token embedding [V, H] as a float array (dequantised when held in a stored format)."""
    if isinstance(self.embed, StoredEmbed):
      return self.embed.rows()
    return self.embed.embedding[...]

  def head_rows(self, ids: jax.Array | None = None) -> jax.Array:
    """The LM head's rows [V, H] (the embedding when tied), or those of token ids [K]: [K, H]."""
    head = self.embed if self.config.tie_embeddings else self.lm_head
    if isinstance(head, (StoredEmbed, StoredLinear)):
      return dequantize(head.tensor(), rows=ids)
    table = (self.embed.embedding[...] if self.config.tie_embeddings
             else self.lm_head.kernel[...].T)
    return table if ids is None else table[ids]

  def logits(self, x: jax.Array) -> jax.Array:
    if isinstance(self.embed, StoredEmbed) and self.config.tie_embeddings:
      return self.embed.attend(x)
    if self.config.tie_embeddings:
      table = self.embed.embedding[...]
      return cpu_gemm.matmul(x.astype(table.dtype), table, transpose_w=True,
                             impl=self.matmul_impl).astype(jnp.float32)
    return self.lm_head(x).astype(jnp.float32)
