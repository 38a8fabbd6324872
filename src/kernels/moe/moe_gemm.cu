// The MoE layer's expert projections (include/kvvm/kernels/moe_kernels.h): gate|up with the
// SiLU-mul, down with the routing weight, and the combine of a token's k rows in choice order.
// The grouped GEMM itself is moe_gemm.cuh; the FP8 instantiations are moe_gemm_fp8.cu.
#include "kernels/moe/moe_gemm.cuh"

namespace kvvm {

bool moe_kernels_built() { return true; }

Status moe_expert_gate_up_cuda(const MoeGateUpParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_moe_gate_up(p));
  if (p.tokens == 0) return Status::Ok();
  auto* s = static_cast<cudaStream_t>(stream);
  if (p.format == MoeWeightFormat::kFp8Block128) return kernels::moe::launch_gate_up_fp8(p, s);
  return kernels::moe::launch_gemm<true, false>(p, s);
}

Status moe_expert_down_cuda(const MoeDownParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_moe_down(p));
  if (p.tokens == 0) return Status::Ok();
  auto* s = static_cast<cudaStream_t>(stream);
  const Status projected = p.format == MoeWeightFormat::kFp8Block128
                               ? kernels::moe::launch_down_fp8(p, s)
                               : kernels::moe::launch_gemm<false, false>(p, s);
  if (!projected.ok()) return projected;
  const std::uint64_t vectors = std::uint64_t{p.tokens} * (p.hidden / 8);
  constexpr unsigned kThreads = 256;
  const auto combine = p.element == DType::kFp16 ? kernels::moe::moe_combine_kernel<__half>
                                                 : kernels::moe::moe_combine_kernel<__nv_bfloat16>;
  return kernels::cuda_status(
      "cudaLaunchKernelEx(moe_combine_kernel)",
      kernels::launch_overlapping(combine,
                                  dim3(static_cast<unsigned>((vectors + kThreads - 1) / kThreads)),
                                  kThreads, 0, s, p));
}

}  // namespace kvvm
