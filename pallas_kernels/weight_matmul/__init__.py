"""Weight-only int8 / bf16 matrix products for accelerators: a Pallas GPU kernel (`kernel_gpu`)
beside its reference (`reference`). On CPU the stored-format products run in `models.cpu_gemm`."""

from pallas_kernels.triton_tiling import Tiling
from pallas_kernels.weight_matmul.kernel_gpu import weight_matmul
from pallas_kernels.weight_matmul.reference import weight_matmul as reference

__all__ = ["Tiling", "reference", "weight_matmul"]
