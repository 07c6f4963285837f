"""Pallas kernels (multi-token verification attention, MoE grouped GEMM) beside pure-jnp references.

Imports only jax and numpy. The kernels land with the kernels issue; until then the models use the
pure-JAX attention in `models/llama.py`.
"""
