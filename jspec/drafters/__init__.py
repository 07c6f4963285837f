"""Drafters: one algorithm per file, all behind the interface in `base.py`; each module registers
its method in `registry.py` on import."""

from jspec.drafters import (draft_model, eagle3, lookahead, medusa, mtp, ngram,  # noqa: F401
                            prediction, suffix)  # (registration)
