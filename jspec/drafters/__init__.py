"""Drafters, all behind the interface in `base.py`: one package per learned drafter (its module,
drafter and checkpoint files; registration in its `__init__`), the model-free drafters together
in `model_free/`, the draft model in `draft_model.py`, the copy-or-learned hybrid in `hybrid.py`. Importing this package registers every
built-in method in `registry.py`; head folders share `heads.py`."""

from jspec.drafters import (dflash, draft_model, dspark, eagle3, hybrid,  # noqa: F401
                            medusa, model_free, mtp)  # (registration)
