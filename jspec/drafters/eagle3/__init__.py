"""EAGLE-3: the head (module.py), its drafter (drafter.py), its speculators-format folder
(checkpoint.py); options, build and registration here."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jspec.drafters import eagle_tree, heads, registry
from jspec.drafters.eagle3.checkpoint import load_eagle3, read_config, save_eagle3
from jspec.drafters.eagle3.drafter import Eagle3Drafter, Eagle3State
from jspec.drafters.eagle3.module import Eagle3Config, Eagle3Head, attach_target_rows
from jspec.drafters.shared import LM_HEADS
from models.hf_loader import stored_dtype
from models.llama import Llama
from models.stored_layers import store_weights

__all__ = ["LM_HEADS", "Eagle3Config", "Eagle3Drafter", "Eagle3Head", "Eagle3Options",
           "Eagle3State", "attach_target_rows", "load_eagle3", "read_config", "save_eagle3"]


@dataclasses.dataclass(frozen=True)
class Eagle3Options:
  head: str | None = None        # a speculators-format folder (default: the head shipped for
                                 # the target, if there is one)
  draft_sampling: bool = True    # sample from the processed q (recorded) vs argmax; with a tree,
                                 # sampled rows draft the sampled chain, greedy rows the tree
  tree_top_k: int = 0            # > 0: EAGLE-2 dynamic trees: top-k children per node, the
  tree_depth: int = 0            # tree's depth; num_speculative_tokens is then the node budget

  def __post_init__(self):
    eagle_tree.check_options(self.tree_top_k, self.tree_depth)


def keep_stored_bf16(folder: str, dtype) -> bool:
  """A head folder stored in bf16, loaded for float32 drafting on CPU: its linear layers can keep
  the bf16 values as stored (read by `cpu_gemm.qmatmul`; the same values, half the bytes)."""
  return (jax.default_backend() == "cpu" and jnp.dtype(dtype) == jnp.float32
          and stored_dtype(folder) == "bf16")


def _build(opts: Eagle3Options, num_draft: int, target: Llama, draft_model=None):
  if isinstance(draft_model, Eagle3Head):
    head = draft_model
  else:
    path, sha = opts.head, None
    if path is None:
      path, sha = heads.shipped_head("eagle3", target.config)
    dtype = target.activation_dtype
    head = load_eagle3(path, dtype=dtype, expected_sha256=sha)
    if keep_stored_bf16(path, dtype):   # the file's bf16 as stored: half the bytes per draft step
      store_weights(head, fmt="bf16")
  return Eagle3Drafter.from_head(head, target, num_draft, sample=opts.draft_sampling,
                                 tree_top_k=opts.tree_top_k, tree_depth=opts.tree_depth)


registry.register(registry.Method(
    "eagle3", Eagle3Options, _build,
    help="EAGLE-3 head over the target's hidden states (chain)",
    cli_flags=(registry.CliFlag("--head", "head", str,
                                "EAGLE-3 head folder (speculators format; default: the shipped "
                                "head for the default model)"),
               registry.CliFlag("--tree-top-k", "tree_top_k", int,
                                "EAGLE-2 dynamic tree: children per node (0 = chain); "
                                "--num-draft is then the node budget"),
               registry.CliFlag("--tree-depth", "tree_depth", int,
                                "EAGLE-2 dynamic tree: depth"))))
