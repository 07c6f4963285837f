"""Drafters: one algorithm per file, all behind the interface in `base.py`."""
