// The grouped GEMMs over FP8 block-scaled expert weights (moe_gemm.cuh says how), in a file of
// their own so the 16-bit and FP8 instantiations compile side by side.
#include "kernels/moe/moe_gemm.cuh"

namespace kvvm::kernels::moe {

Status launch_gate_up_fp8(const MoeGateUpParams& p, cudaStream_t stream) {
  return launch_gemm<true, true>(p, stream);
}

Status launch_down_fp8(const MoeDownParams& p, cudaStream_t stream) {
  return launch_gemm<false, true>(p, stream);
}

}  // namespace kvvm::kernels::moe
