"""Static draft trees from per-depth candidate ranks (Medusa's "choices"), and the choice of such a
tree from measured rank accuracies.

A choice is a path of ranks: (0, 2) is the top-1 candidate at depth 1 followed by the third-best
candidate at depth 2. A tree is a prefix-closed set of choices; its nodes are ordered by depth,
then by path, so parents come before children and siblings are tried best rank first.
"""

from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np


def tree_arrays(choices: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Choices -> (parent [N] block indices, 0 = the root; depth [N] from 1; rank [N]), nodes in
  topological order. Raises if the set is not prefix-closed or has duplicates."""
  paths = sorted({tuple(int(r) for r in c) for c in choices}, key=lambda c: (len(c), c))
  if len(paths) != len(choices):
    raise ValueError("tree choices contain duplicates")
  if not paths or any(len(c) == 0 for c in paths):
    raise ValueError("a tree needs at least one non-empty choice (a path of ranks)")
  if any(r < 0 for c in paths for r in c):
    raise ValueError("tree choices are ranks >= 0")
  index = {c: i for i, c in enumerate(paths)}
  parent = []
  for c in paths:
    if len(c) > 1 and c[:-1] not in index:
      raise ValueError(f"tree choice {list(c)} has no parent {list(c[:-1])}: the choices must "
                       "contain every prefix of every path")
    parent.append(0 if len(c) == 1 else index[c[:-1]] + 1)
  return (np.asarray(parent, np.int32), np.asarray([len(c) for c in paths], np.int32),
          np.asarray([c[-1] for c in paths], np.int32))


def best_tree(rank_accuracy, budget: int) -> list[tuple[int, ...]]:
  """rank_accuracy[d, r]: the measured probability that depth d+1's rank-r candidate is the right
  token. Returns the `budget` paths with the highest expected acceptance (the product of their
  ranks' accuracies), best first; a path never outscores its prefix, so the set is a tree."""
  acc = np.asarray(rank_accuracy, np.float64)
  if acc.ndim != 2 or acc.size == 0:
    raise ValueError(f"rank_accuracy must be [depth, ranks], got shape {acc.shape}")
  depth, ranks = acc.shape
  if not 1 <= budget <= sum(ranks ** (d + 1) for d in range(depth)):
    raise ValueError(f"a tree of {depth} depths x {ranks} ranks cannot hold {budget} nodes")
  heap = [(-acc[0, r], (r,)) for r in range(ranks)]
  heapq.heapify(heap)
  out = []
  while heap and len(out) < budget:
    score, path = heapq.heappop(heap)
    out.append(path)
    if len(path) < depth:
      for r in range(ranks):
        heapq.heappush(heap, (score * acc[len(path), r], path + (r,)))
  return out
