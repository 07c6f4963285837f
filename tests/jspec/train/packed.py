"""The check shared by the packed-row training tests of each head that packs."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def check_packed_equals_apart(task, packed) -> None:
  """task.loss over packed row 0 (`jspec.train.shards.PackedRows`) equals task.loss over its
  pieces as separate rows: the same labels, loss, accuracies and AL estimate (attention, RoPE
  positions and labels kept apart); without the segments the pieces would see each other and the
  loss differs."""
  row = packed[0]
  apart = [packed.source.window(*piece) for piece in packed.rows[0]]
  stack = lambda items: {k: jnp.asarray(np.stack([it[k] for it in items])) for k in items[0]}
  one, many = stack([row]), stack(apart)
  (l1, m1), (l2, m2) = (task.loss(task.params, task.aux, b) for b in (one, many))
  np.testing.assert_allclose(m1["step_count"], m2["step_count"])
  assert float(m1["step_count"][0]) > 20
  np.testing.assert_allclose(l1, l2, rtol=1e-4)
  for key in ("step_loss", "step_acc", "accept_at"):
    np.testing.assert_allclose(m1[key], m2[key], rtol=1e-4, atol=1e-6)
  blind = {k: v for k, v in one.items() if k not in ("segments", "positions")}
  assert abs(float(task.loss(task.params, task.aux, blind)[0]) - float(l2)) > 1e-3
