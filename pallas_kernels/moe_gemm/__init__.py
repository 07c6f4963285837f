"""MoE grouped GEMM: `gmm` (Pallas kernel with a custom VJP, or lax.ragged_dot) and an
expert-parallel MoE layer over shard_map + all_to_all (`moe_ep`) beside its reference.
"""

from pallas_kernels.moe_gemm.api import IMPLS, gmm
from pallas_kernels.moe_gemm.ep import (MoEParams, expert_mesh, init_moe_params, moe_ep,
                                        moe_reference)
from pallas_kernels.moe_gemm.kernel_gpu import Tiling, tgmm
from pallas_kernels.moe_gemm.reference import gmm_reference, tgmm_reference

__all__ = ["IMPLS", "MoEParams", "Tiling", "expert_mesh", "gmm", "gmm_reference", "init_moe_params",
           "moe_ep", "moe_reference", "tgmm", "tgmm_reference"]
