"""Pallas kernels (multi-token verification attention, MoE grouped GEMM) beside pure-jnp references.

Imports only jax and numpy. One folder per op: a jnp reference, the Pallas kernel(s) and an `api.py`
choosing by backend; `models/llama.py` attends through `verify_attention.verify_attention`.
"""
