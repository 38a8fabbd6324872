// The router's softmax and top-k (moe_route_cuda, include/kvvm/kernels/moe_kernels.h): one warp
// per token, each lane holding every 32nd expert's logit in registers (16 at kMoeMaxExperts).
//
// The softmax as torch computes it in float32: the maximum, exp(x - max) summed, each divided by
// the sum (a butterfly sum, its order fixed by the expert count). The top k by k rounds of a
// warp-wide argmax over (p, lower id first) keys: a chosen expert's key drops below every other,
// a NaN's key sits below every number, a lane past `experts` below both.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/common.cuh"
#include "kvvm/kernels/moe_kernels.h"

namespace kvvm {
namespace kernels {
namespace {

constexpr unsigned kRouteWarps = 4;
constexpr unsigned kPerLane = kMoeMaxExperts / 32;
constexpr float kTakenKey = -2.0f, kNanKey = -1.0f, kAbsentKey = -3.0f;

template <typename T>
__device__ __forceinline__ float logit_at(const T* row, std::uint32_t e) {
  return to_float<T>(row[e]);
}
template <>
__device__ __forceinline__ float logit_at<float>(const float* row, std::uint32_t e) {
  return row[e];
}

// The better of two (key, expert) candidates: the larger key, the lower expert among equals.
__device__ __forceinline__ bool better(float key, std::uint32_t e, float other_key,
                                       std::uint32_t other_e) {
  return key > other_key || (key == other_key && e < other_e);
}

template <typename T>
__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_kernel(const MoeRouteParams p) {
  allow_next_kernel_to_start();  // the permutation is one block; let it be scheduled
  wait_for_previous_kernel();
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::uint32_t token = blockIdx.x * kRouteWarps + warp;
  if (token >= p.tokens) return;
  const T* row = static_cast<const T*>(p.logits) + static_cast<std::uint64_t>(token) * p.experts;

  float value[kPerLane];
  float top = kNegInf;
#pragma unroll
  for (unsigned i = 0; i < kPerLane; ++i) {
    const std::uint32_t e = lane + 32 * i;
    value[i] = e < p.experts ? logit_at<T>(row, e) : kNegInf;
    top = fmaxf(top, value[i]);  // fmaxf passes over a NaN
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
  }
  float sum = 0.0f;
#pragma unroll
  for (unsigned i = 0; i < kPerLane; ++i) {
    value[i] = expf(value[i] - top);  // a NaN stays NaN, a lane past `experts` gives 0
    if (!isnan(value[i])) sum += value[i];
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  float key[kPerLane];
#pragma unroll
  for (unsigned i = 0; i < kPerLane; ++i) {
    value[i] = value[i] / sum;
    key[i] = lane + 32 * i >= p.experts ? kAbsentKey : (isnan(value[i]) ? kNanKey : value[i]);
  }

  std::int32_t my_id = 0;
  float my_weight = 0.0f;
  for (std::uint32_t j = 0; j < p.top_k; ++j) {
    float best_key = kAbsentKey - 1.0f, best_value = 0.0f;
    std::uint32_t best_e = ~0u;
#pragma unroll
    for (unsigned i = 0; i < kPerLane; ++i) {
      if (better(key[i], lane + 32 * i, best_key, best_e)) {
        best_key = key[i];
        best_e = lane + 32 * i;
        best_value = value[i];
      }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other_key = __shfl_xor_sync(0xffffffffu, best_key, offset);
      const std::uint32_t other_e = __shfl_xor_sync(0xffffffffu, best_e, offset);
      const float other_value = __shfl_xor_sync(0xffffffffu, best_value, offset);
      if (better(other_key, other_e, best_key, best_e)) {
        best_key = other_key;
        best_e = other_e;
        best_value = other_value;
      }
    }
#pragma unroll
    for (unsigned i = 0; i < kPerLane; ++i) {
      if (lane + 32 * i == best_e) key[i] = kTakenKey;
    }
    if (lane == j) {
      my_id = static_cast<std::int32_t>(best_e);
      my_weight = best_value;
    }
  }
  if (p.renormalize) {
    float chosen = 0.0f;  // in choice order, the same in every lane
    for (std::uint32_t j = 0; j < p.top_k; ++j) {
      chosen += __shfl_sync(0xffffffffu, my_weight, j);
    }
    my_weight = my_weight / chosen;
  }
  if (lane < p.top_k) {
    const std::uint64_t at = static_cast<std::uint64_t>(token) * p.top_k + lane;
    p.ids[at] = my_id;
    p.weights[at] = my_weight;
  }
}

template <typename T>
cudaError_t launch_route(const MoeRouteParams& p, cudaStream_t stream) {
  return launch_overlapping(moe_route_kernel<T>, dim3((p.tokens + kRouteWarps - 1) / kRouteWarps),
                            kRouteWarps * 32, 0, stream, p);
}

}  // namespace
}  // namespace kernels

Status moe_route_cuda(const MoeRouteParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_moe_route(p));
  if (p.tokens == 0) return Status::Ok();
  auto* s = static_cast<cudaStream_t>(stream);
  cudaError_t launched;
  switch (p.element) {
    case DType::kFp16:
      launched = kernels::launch_route<__half>(p, s);
      break;
    case DType::kBf16:
      launched = kernels::launch_route<__nv_bfloat16>(p, s);
      break;
    default:
      launched = kernels::launch_route<float>(p, s);
      break;
  }
  return kernels::cuda_status("cudaLaunchKernelEx(moe_route_kernel)", launched);
}

}  // namespace kvvm
