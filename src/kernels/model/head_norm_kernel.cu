// The launcher of the per-head RMSNorm (include/kvvm/kernels/model_kernels.h, head_rmsnorm_cuda):
// the shared checks (head_norm_checks.h, which check_head_rmsnorm runs in every build), the element
// type dispatched, one launch.
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/model/head_norm.cuh"
#include "kernels/model/head_norm_checks.h"
#include "kvvm/kernels/model_kernels.h"

namespace kvvm {

Status head_rmsnorm_cuda(const HeadRmsNormParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(kernels::head_rmsnorm_checks(p));
  if (p.tokens == 0) return Status::Ok();
  const std::uint64_t rows = std::uint64_t{p.tokens} * (p.q_heads + p.kv_heads);
  const auto blocks =
      static_cast<unsigned>((rows + kernels::kHeadNormWarps - 1) / kernels::kHeadNormWarps);
  auto* s = static_cast<cudaStream_t>(stream);
  constexpr unsigned kThreads = kernels::kHeadNormWarps * 32;
  if (p.element == DType::kFp16) {
    kernels::head_rms_norm_kernel<__half><<<blocks, kThreads, 0, s>>>(p);
  } else {
    kernels::head_rms_norm_kernel<__nv_bfloat16><<<blocks, kThreads, 0, s>>>(p);
  }
  return kernels::cuda_status("head_rms_norm_kernel<<<>>>", cudaGetLastError());
}

}  // namespace kvvm
