"""Drafters: one algorithm per file, all behind the interface in `base.py`; each module registers
its method in `registry.py` on import."""

from jspec.drafters import (dflash, draft_model, dspark, eagle3, lookahead,  # noqa: F401
                            medusa, mtp, ngram, prediction, suffix)  # (registration)
