"""Medusa: the heads (module.py), their drafter (drafter.py, chain or static tree), their folder
(checkpoint.py, FasterDecoding/Medusa names); options, build and registration here."""

from __future__ import annotations

import dataclasses
from typing import Any


from jspec.drafters import heads, registry, static_tree
from jspec.drafters.medusa.checkpoint import (load_medusa, read_config, read_rank_accuracy,
                                              save_medusa, save_rank_accuracy)
from jspec.drafters.medusa.drafter import MedusaDrafter, MedusaState
from jspec.drafters.medusa.module import MedusaConfig, MedusaHead, attach_target_rows, final_norm
from models.llama import Llama

__all__ = ["MedusaConfig", "MedusaDrafter", "MedusaHead", "MedusaOptions", "MedusaState",
           "attach_target_rows", "final_norm", "load_medusa", "read_config", "read_rank_accuracy", "save_medusa",
           "save_rank_accuracy"]


@dataclasses.dataclass(frozen=True)
class MedusaOptions:
  head: str | None = None        # a Medusa head folder (default: the head shipped for the
                                 # target, if there is one)
  draft_sampling: bool = True    # sample from the processed q (recorded) vs argmax (chains)
  tree_choices: Any = None       # a static tree: rank paths ([[0], [1], [0, 0], ...]) of
                                 # num_speculative_tokens nodes, or "auto": the best tree of that
                                 # many nodes for the head's measured rank accuracies
                                 # (rank_accuracy.json in its folder); None = a chain

  def __post_init__(self):
    c = self.tree_choices
    if c is not None and c != "auto":
      if isinstance(c, str) or not all(isinstance(p, (list, tuple)) for p in c):
        raise ValueError(f"tree_choices must be 'auto' or a list of rank paths such as "
                         f"[[0], [1], [0, 0]], got {c!r}")
      object.__setattr__(self, "tree_choices", tuple(tuple(int(r) for r in p) for p in c))


def _build(opts: MedusaOptions, num_draft: int, target: Llama, draft_model=None):
  if isinstance(draft_model, MedusaHead):
    head = draft_model
  else:
    path, sha = opts.head, None
    if path is None:
      path, sha = heads.shipped_head("medusa", target.config)
    dtype = target.activation_dtype
    head = load_medusa(path, dtype=dtype, expected_sha256=sha)
  choices = opts.tree_choices
  if choices == "auto":
    if isinstance(draft_model, MedusaHead):
      raise ValueError("tree_choices='auto' reads the rank accuracies saved beside a head "
                       "folder; with a head object, give explicit tree_choices")
    choices = static_tree.best_tree(read_rank_accuracy(path), num_draft)
  return MedusaDrafter.from_head(head, target, num_draft, sample=opts.draft_sampling,
                                 tree_choices=choices)


registry.register(registry.Method(
    "medusa", MedusaOptions, _build,
    help="Medusa heads over the target's final hidden state (chain, D <= heads, or a static "
         "tree of D nodes)",
    cli_flags=(registry.CliFlag("--medusa-head", "head", str,
                                "Medusa head folder (default: the shipped head for the default "
                                "model)"),
               registry.CliFlag("--medusa-tree", "tree_choices", str,
                                "'auto': a static tree of --num-draft nodes chosen from the "
                                "head's measured rank accuracies"))))
