"""Static trees from rank choices (Medusa): arrays, prefix closure, and the best tree for measured
rank accuracies against brute force."""

import itertools

import numpy as np
import pytest

from jspec import tree
from jspec.drafters.static_tree import best_tree, tree_arrays


def test_tree_arrays():
  parent, depth, rank = tree_arrays([(1,), (0,), (0, 0), (0, 1), (1, 0), (0, 0, 2)])
  # order: (0,), (1,), (0,0), (0,1), (1,0), (0,0,2)
  np.testing.assert_array_equal(parent, [0, 0, 1, 1, 2, 3])
  np.testing.assert_array_equal(depth, [1, 1, 2, 2, 2, 3])
  np.testing.assert_array_equal(rank, [0, 1, 0, 1, 0, 2])
  tree.check_parents(parent)
  mask = tree.ancestor_mask(parent[None])
  np.testing.assert_array_equal(np.asarray(tree.depths(mask))[0, 1:], depth)
  with pytest.raises(ValueError, match="prefix"):
    tree_arrays([(0,), (1, 0)])
  with pytest.raises(ValueError, match="duplicates"):
    tree_arrays([(0,), (0,)])


def test_best_tree_is_the_brute_force_optimum():
  rng = np.random.default_rng(0)
  acc = np.sort(rng.uniform(0.05, 0.9, (3, 3)), axis=1)[:, ::-1]
  paths = [p for n in (1, 2, 3) for p in itertools.product(range(3), repeat=n)]
  value = lambda p: np.prod([acc[i, r] for i, r in enumerate(p)])
  for budget in (1, 4, 9, 20):
    got = best_tree(acc, budget)
    tree_arrays(got)                                   # prefix-closed
    best = sorted(paths, key=value, reverse=True)[:budget]
    assert abs(sum(map(value, got)) - sum(map(value, best))) < 1e-12
  with pytest.raises(ValueError, match="cannot hold"):
    best_tree(acc, 40)
