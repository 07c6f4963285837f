"""DFlash: the block module (module.py), its drafter (drafter.py), the DFlash / DSpark head folder
(checkpoint.py); options, build and registration here."""

from __future__ import annotations

import dataclasses

from jspec.drafters import registry
from jspec.drafters.dflash.checkpoint import load, load_for_target, read_config, save
from jspec.drafters.dflash.drafter import DFlashDrafter, DFlashState, check_block, drafter_params
from jspec.drafters.dflash.module import DFlashConfig, DFlashModule, LayerAttend
from models.llama import Llama

__all__ = ["DFlashConfig", "DFlashDrafter", "DFlashModule", "DFlashOptions", "DFlashState",
           "LayerAttend", "check_block", "drafter_params", "load", "load_for_target",
           "read_config", "save"]


@dataclasses.dataclass(frozen=True)
class DFlashOptions:
  head: str | None = None        # a DFlash head folder (`jspec train dflash`; default: the head
                                 # shipped for the target, if there is one)


def _build(opts: DFlashOptions, num_draft: int, target: Llama, draft_model=None):
  if isinstance(draft_model, DFlashModule):
    module = draft_model
  else:
    module = load_for_target(opts.head, target, "dflash")
  return DFlashDrafter.from_module(module, target, num_draft)


registry.register(registry.Method(
    "dflash", DFlashOptions, _build,
    help="DFlash block drafter: one parallel pass drafts the block (greedy)",
    cli_flags=(registry.CliFlag("--dflash-head", "head", str,
                                "DFlash head folder (default: the shipped head for the default "
                                "model)"),)))
