"""Pure-JAX grouped GEMM (lax.ragged_dot) and its weight gradient (per-group lhs^T . grad): the
CPU/TPU fallback and the test oracle. Group g owns rows [sum(sizes[:g]), sum(sizes[:g+1])).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gmm_reference(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array,
                  preferred_element_type=None) -> jax.Array:
  """lhs [M, K], rhs [E, K, N], group_sizes [E] int32 -> [M, N]; out[r] = lhs[r] @ rhs[group(r)]."""
  return jax.lax.ragged_dot(lhs, rhs, group_sizes.astype(jnp.int32),
                            preferred_element_type=preferred_element_type)


def row_groups(group_sizes: jax.Array, num_rows: int) -> jax.Array:
  """[M] int32 group id of each row; padding rows (past the total) get id E."""
  ends = jnp.cumsum(group_sizes.astype(jnp.int32))                                # [E]
  rows = jnp.arange(num_rows, dtype=jnp.int32)
  return jnp.sum(ends[None, :] <= rows[:, None], axis=1, dtype=jnp.int32)      # [M]


def tgmm_reference(lhs: jax.Array, grad: jax.Array, group_sizes: jax.Array,
                   preferred_element_type=None) -> jax.Array:
  """lhs [M, K], grad [M, N], group_sizes [E] -> [E, K, N]; out[g] = lhs[rows_g]^T @ grad[rows_g].

  The weight gradient of `gmm`: a segment sum of per-row outer products, written as one contraction
  with a one-hot group mask (E times the minimal FLOPs; an oracle, not a fast path).
  """
  num_groups = group_sizes.shape[0]
  groups = row_groups(group_sizes, lhs.shape[0])                                  # [M]
  onehot = jax.nn.one_hot(groups, num_groups, dtype=lhs.dtype)                    # [M, E]
  out_dtype = preferred_element_type or jnp.result_type(lhs, grad)
  return jnp.einsum("me,mk,mn->ekn", onehot, lhs, grad, preferred_element_type=jnp.float32,
                    precision=jax.lax.Precision.HIGHEST).astype(out_dtype)
