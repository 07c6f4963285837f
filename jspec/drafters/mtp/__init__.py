"""MTP (DeepSeek-V3 multi-token prediction): the module (module.py), its drafter (drafter.py,
chain or EAGLE-2 tree), its head folder and checkpoint layers (checkpoint.py); options, build
and registration here."""

from __future__ import annotations

import dataclasses


from jspec.drafters import eagle_tree, heads, registry
from jspec.drafters.mtp.checkpoint import (load_checkpoint_mtp, load_mtp, read_config, save_mtp,
                                           to_tensors)
from jspec.drafters.mtp.drafter import MTPDrafter, MTPState
from jspec.drafters.mtp.module import MTPConfig, MTPModule, rms_norm
from models.llama import Llama

__all__ = ["MTPConfig", "MTPDrafter", "MTPModule", "MTPOptions", "MTPState", "load_checkpoint_mtp",
           "load_mtp", "read_config", "rms_norm", "save_mtp", "to_tensors"]


@dataclasses.dataclass(frozen=True)
class MTPOptions:
  head: str | None = None        # an MTP head folder (`jspec train mtp`; default: the module
                                 # shipped for the target, if there is one)
  checkpoint: str | None = None  # or a model folder whose safetensors carry MTP layers
                                 # (`num_nextn_predict_layers`), read from layer L
  draft_sampling: bool = True    # sample from the processed q (recorded) vs argmax; with a tree,
                                 # sampled rows draft the sampled chain, greedy rows the tree
  tree_top_k: int = 0            # > 0: EAGLE-2 dynamic trees: top-k children per node, the
  tree_depth: int = 0            # tree's depth; num_speculative_tokens is then the node budget

  def __post_init__(self):
    eagle_tree.check_options(self.tree_top_k, self.tree_depth)
    if self.head is not None and self.checkpoint is not None:
      raise ValueError("pass either an MTP head folder (head) or a checkpoint with MTP layers "
                       "(checkpoint), not both")


def _build(opts: MTPOptions, num_draft: int, target: Llama, draft_model=None):
  if isinstance(draft_model, MTPModule):
    module = draft_model
  else:
    dtype = target.activation_dtype
    if opts.checkpoint is not None:
      module = load_checkpoint_mtp(opts.checkpoint, target.config, dtype=dtype)
    else:
      path, sha = opts.head, None
      if path is None:
        path, sha = heads.shipped_head("mtp", target.config)
      module = load_mtp(path, dtype=dtype, expected_sha256=sha)
  return MTPDrafter.from_module(module, target, num_draft, sample=opts.draft_sampling,
                                tree_top_k=opts.tree_top_k, tree_depth=opts.tree_depth)


registry.register(registry.Method(
    "mtp", MTPOptions, _build,
    help="MTP module (DeepSeek-V3 layout) over the target's final hidden state (chain or "
         "EAGLE-2 tree)",
    cli_flags=(registry.CliFlag("--mtp-head", "head", str,
                                "MTP head folder (default: the shipped module for the default "
                                "model)"),
               registry.CliFlag("--mtp-checkpoint", "checkpoint", str,
                                "a model folder whose safetensors carry MTP layers "
                                "(num_nextn_predict_layers)"),
               registry.CliFlag("--tree-top-k", "tree_top_k", int,
                                "EAGLE-2 dynamic tree: children per node (0 = chain); "
                                "--num-draft is then the node budget"),
               registry.CliFlag("--tree-depth", "tree_depth", int,
                                "EAGLE-2 dynamic tree: depth"))))
