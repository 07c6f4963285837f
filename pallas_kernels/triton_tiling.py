"""Block sizes of the Triton-style Pallas GPU kernels (`moe_gemm`, `weight_matmul`): the tiling
with the checks the Triton lowering and the shared-memory budget impose (interpret mode checks
neither), and the padding of operands to whole blocks."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


# Opt-in shared memory per thread block on sm90 (H100/H200); Ampere A100 has 163 KiB.
SMEM_BYTES = 227 * 1024


@dataclasses.dataclass(frozen=True)
class Tiling:
  """Block sizes and Triton launch parameters. Blocks: powers of two, >= 16 (tl.dot's minimum)."""
  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  num_warps: int = 4
  num_stages: int = 3

  def check(self, itemsize: int, tile_elems: int) -> None:
    """Raises ValueError for a tiling the Triton lowering would reject or that overflows SMEM.

    tile_elems: elements of the two operand tiles loaded per pipeline stage.
    """
    for name in ("block_m", "block_n", "block_k"):
      b = getattr(self, name)
      if b < 16 or b & (b - 1):
        raise ValueError(f"Tiling.{name}={b}: GPU blocks must be powers of two >= 16 "
                         "(Triton needs power-of-two tiles; tl.dot needs >= 16).")
    if self.num_warps < 1 or self.num_warps & (self.num_warps - 1):
      raise ValueError(f"Tiling.num_warps={self.num_warps} must be a power of two.")
    if self.num_stages < 1:
      raise ValueError(f"Tiling.num_stages={self.num_stages} must be >= 1.")
    smem = self.num_stages * tile_elems * itemsize
    if smem > SMEM_BYTES:
      raise ValueError(f"{self} needs {smem // 1024} KiB of shared memory (num_stages x operand "
                       f"tiles), over the {SMEM_BYTES // 1024} KiB budget: lower num_stages or "
                       "a block size.")

  def fit_stages(self, itemsize: int, tile_elems: int) -> Tiling:
    """This tiling with num_stages lowered (to >= 1) until tiles of tile_elems fit in SMEM."""
    stages = max(1, min(self.num_stages, SMEM_BYTES // (tile_elems * itemsize)))
    return dataclasses.replace(self, num_stages=stages)


def pad_to_multiple(x: jax.Array, axis: int, multiple: int) -> jax.Array:
  """x zero-padded at the end of `axis` to a multiple of `multiple`."""
  extra = -x.shape[axis] % multiple
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths)
