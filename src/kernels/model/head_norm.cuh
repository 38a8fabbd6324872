// Per-head RMSNorm of q and k (include/kvvm/kernels/model_kernels.h, HeadRmsNormParams): Qwen3's
// q_norm / k_norm, applied to each head's row before RoPE.
//
// Why one warp per row: a head row is at most 256 elements, so 32 lanes hold it in registers
// (8 elements each) and reduce its sum of squares with shuffles alone, no shared memory and
// no block barrier; a block of 8 warps covers 8 rows. The kernel moves each layer's q and k once,
// a few KiB per token, so plain element loads are enough: the launch, not the bytes, is its cost.
//
// The rounding is Hugging Face's Qwen3RMSNorm in the element type: the sum of squares and the
// scaling in float32, the normalised value rounded to the element type, then multiplied by the
// weight and rounded again, as the layer norms of model_kernels.cuh round.
#pragma once

#include <cstdint>

#include "kernels/common.cuh"
#include "kvvm/kernels/model_kernels.h"

namespace kvvm::kernels {

constexpr std::uint32_t kHeadNormWarps = 8;  // rows per block
constexpr std::uint32_t kHeadNormPerLane = kMaxHeadNormDim / 32;

// Normalises `row` (head_dim elements) in place with `weight`, by the 32 lanes of the calling
// warp. REQUIRES: head_dim <= kMaxHeadNormDim; every lane of the warp calls it.
template <typename T>
__device__ __forceinline__ void head_rms_norm_row(T* row, const T* weight, std::uint32_t head_dim,
                                                  float eps) {
  const unsigned lane = threadIdx.x % 32;
  float values[kHeadNormPerLane];
  float squares = 0.0f;
#pragma unroll
  for (std::uint32_t j = 0; j < kHeadNormPerLane; ++j) {
    const std::uint32_t i = lane + 32 * j;
    values[j] = i < head_dim ? to_float<T>(row[i]) : 0.0f;
    squares += values[j] * values[j];
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    squares += __shfl_xor_sync(0xffffffffu, squares, offset);
  }
  const float scale = rsqrtf(squares / static_cast<float>(head_dim) + eps);
#pragma unroll
  for (std::uint32_t j = 0; j < kHeadNormPerLane; ++j) {
    const std::uint32_t i = lane + 32 * j;
    if (i < head_dim) {
      row[i] = from_float<T>(to_float<T>(weight[i]) * rounded<T>(values[j] * scale));
    }
  }
}

// Row r = token * (q_heads + kv_heads) + head; a warp past the last row returns whole.
template <typename T>
__global__ void __launch_bounds__(kHeadNormWarps * 32)
    head_rms_norm_kernel(const HeadRmsNormParams p) {
  const std::uint32_t heads = p.q_heads + p.kv_heads;
  const std::uint64_t r =
      static_cast<std::uint64_t>(blockIdx.x) * kHeadNormWarps + threadIdx.x / 32;
  if (r >= static_cast<std::uint64_t>(p.tokens) * heads) return;
  const std::uint64_t token = r / heads;
  const std::uint32_t head = static_cast<std::uint32_t>(r % heads);
  T* row = static_cast<T*>(p.x) + token * p.token_stride + std::uint64_t{head} * p.head_dim;
  const T* weight = static_cast<const T*>(head < p.q_heads ? p.q_weight : p.k_weight);
  head_rms_norm_row<T>(row, weight, p.head_dim, p.eps);
}

}  // namespace kvvm::kernels
