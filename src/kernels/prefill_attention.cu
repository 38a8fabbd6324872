// The causal prefill kernel's host launcher.
#include <string>

#include "kernels/common.cuh"
#include "kernels/launch_support.cuh"
#include "kernels/prefill.cuh"
#include "kvvm/attention.h"

namespace kvvm {

using kernels::check_cuda_view;
using kernels::check_pointers;
using kernels::cuda_status;
using kernels::last_launch;
using kernels::scale_log2;

Status prefill_attention_cuda(const PrefillParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_prefill(p));
  KVVM_RETURN_IF_ERROR(check_cuda_view(p.view, "prefill"));
  KVVM_RETURN_IF_ERROR(check_pointers({{p.q, "q"}, {p.out, "out"}}, "prefill"));
  if (p.tokens == 0) return Status::Ok();
  const std::uint32_t group = p.qo_heads / p.kv_heads;
  kernels::PrefillKernelParams kp(p);
  kp.group = group;
  kp.scale_log2 = scale_log2(p.sm_scale, p.view.head_dim);
  auto* cuda_stream = static_cast<cudaStream_t>(stream);
  KVVM_DISPATCH_ELEMENT(
      p.view.element, T,
      {KVVM_DISPATCH_HEAD_DIM(
          p.view.head_dim, D, {KVVM_DISPATCH_GROUP_TILE(group, G, {
            kp.group_tiles = (group + G - 1) / G;
            constexpr std::uint32_t kQ = kernels::kPrefillRows / G;
            constexpr std::uint32_t kBytes = kernels::prefill_shared_bytes<D>();
            auto* kernel = &kernels::prefill_kernel<T, D, G>;
            KVVM_RETURN_IF_ERROR(cuda_status(
                "cudaFuncSetAttribute",
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes)));
            const dim3 grid((p.tokens + kQ - 1) / kQ, p.kv_heads * kp.group_tiles);
            kernel<<<grid, kernels::kPrefillThreads, kBytes, cuda_stream>>>(kp);
            KVVM_RETURN_IF_ERROR(last_launch("prefill_kernel<<<>>>"));
          })})})
  return Status::Ok();
}

}  // namespace kvvm
