// The causal prefill kernel's host launcher.
#include <cstdint>
#include <string>

#include "kernels/attention/prefill.cuh"
#include "kernels/common.cuh"
#include "kernels/launch_support.cuh"
#include "kvvm/kernels/attention.h"

namespace kvvm {

using kernels::check_cuda_activations;
using kernels::check_cuda_view;
using kernels::check_pointers;
using kernels::last_launch;
using kernels::scale_log2;

Status prefill_attention_cuda(const PrefillParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_prefill(p));
  KVVM_RETURN_IF_ERROR(check_cuda_view(p.view, "prefill"));
  KVVM_RETURN_IF_ERROR(check_cuda_activations(p.view, p.activations, "prefill"));
  KVVM_RETURN_IF_ERROR(check_pointers({{p.q, "q"}, {p.out, "out"}}, "prefill"));
  if (p.tokens == 0) return Status::Ok();
  const std::uint32_t group = p.qo_heads / p.kv_heads;
  // Rows of one KV head (position x group head) are counted in 32 bits by the kernel, and
  // the 1-D grid holds at most 2^31 - 1 blocks.
  const std::uint64_t rows = std::uint64_t{p.tokens} * group;
  const std::uint64_t query_tiles = (rows + kernels::kPrefillRows - 1) / kernels::kPrefillRows;
  if (rows + kernels::kPrefillRows > UINT32_MAX || query_tiles * p.kv_heads > INT32_MAX) {
    return Status::InvalidArgument("prefill: " + str(p.tokens) + " tokens x " + str(group) +
                                   " query heads per KV head exceed 2^32 - 128 rows");
  }
  kernels::PrefillKernelParams kp(p);
  kp.group = group;
  kp.query_tiles = static_cast<std::uint32_t>(query_tiles);
  // An e4m3 cache's K scale multiplies every score (the stored K is read as it is); per-head
  // scales are multiplied in by the kernel.
  const bool layer_scale = p.view.element == DType::kFp8 && p.head_scales.k == nullptr;
  kp.scale_log2 = scale_log2(p.sm_scale, p.view.head_dim) * (layer_scale ? p.k_scale : 1.0f);
  auto* cuda_stream = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<std::uint32_t>(query_tiles * p.kv_heads));
  KVVM_DISPATCH_ACCESS(
      p.view.element, p.activations, T, FP8, {KVVM_DISPATCH_HEAD_DIM(p.view.head_dim, D, {
        constexpr std::uint32_t kBytes = kernels::prefill_shared_bytes<D>();
        auto* kernel = &kernels::prefill_kernel<T, D, FP8>;
        auto residency = kernels::prepare_kernel(reinterpret_cast<const void*>(kernel),
                                                 kernels::kPrefillThreads, kBytes);
        KVVM_RETURN_IF_ERROR(residency.status());
        kernel<<<grid, kernels::kPrefillThreads, kBytes, cuda_stream>>>(kp);
        KVVM_RETURN_IF_ERROR(last_launch("prefill_kernel<<<>>>"));
      })})
  return Status::Ok();
}

}  // namespace kvvm
