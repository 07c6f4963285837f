"""DSpark: the module (module.py: DFlash backbone, Markov and confidence heads) and its drafter
(drafter.py); its folder format is DFlash's (dflash/checkpoint.py); options, build and
registration here."""

from __future__ import annotations

import dataclasses

from jspec.drafters.dspark.calibration import read_calibration, save_calibration
from jspec.drafters import heads, registry
from jspec.drafters.dflash.checkpoint import load_for_target, register_module
from jspec.drafters.dspark.drafter import DSparkDrafter
from jspec.drafters.dspark.module import DSparkModule
from models.llama import Llama

__all__ = ["DSparkDrafter", "DSparkModule", "DSparkOptions", "read_calibration", "save_calibration"]

register_module("dspark", DSparkModule)


@dataclasses.dataclass(frozen=True)
class DSparkOptions:
  head: str | None = None        # a DSpark head folder (`jspec train dspark`; default: the head
                                 # shipped for the target, if there is one)
  draft_sampling: bool = True    # sample the Markov chain from the processed q (recorded) vs argmax
  confidence_schedule: bool = False   # verify per row the prefix the confidences schedule
                                 # (DSpark Algorithm 1, jspec/confidence.py) from the compiled
                                 # widths draft_lengths (default 0, 1, 2, 3, 4, 6, 8 up to D)


def _build(opts: DSparkOptions, num_draft: int, target: Llama, draft_model=None):
  folder = opts.head
  if isinstance(draft_model, DSparkModule):
    module = draft_model
  else:
    module = load_for_target(opts.head, target, "dspark")
    if folder is None:
      folder = heads.shipped_head("dspark", target.config)[0]
  temps = read_calibration(folder, num_draft) if opts.confidence_schedule else ()
  return DSparkDrafter.from_module(module, target, num_draft, sample=opts.draft_sampling,
                                   confidence_schedule=opts.confidence_schedule,
                                   temperatures=tuple(temps))


registry.register(registry.Method(
    "dspark", DSparkOptions, _build,
    help="DSpark: DFlash backbone + sequential Markov head (sampled, q recorded) + confidence",
    cli_flags=(registry.CliFlag("--dspark-head", "head", str,
                                "DSpark head folder (default: the shipped head for the default "
                                "model)"),)))
