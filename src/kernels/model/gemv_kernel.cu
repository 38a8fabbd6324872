// GEMV for a small batch's decode step (include/kvvm/kernels/model_kernels.h, gemv_cuda): a weight
// matrix streamed once from memory for every row of the batch.
//
// How: a block of 8 warps covers 8 / kSplit outputs; the kSplit warps of one output share its
// row of `weight`, each taking every kSplit-th 512-byte stretch of it (a lane: one 16-byte
// vector of 8 weights per stretch, times the matching x vector of each row), streamed as
// weight_stream.cuh says (a round of loads in flight while the last is used; the first before
// waiting for the previous kernel). Each lane accumulates in float32, the warp sums its lanes
// by a butterfly, and the output's first warp adds its kSplit warps' sums in warp order
// (weight_stream.cuh's sum_output_partials, which the FP8 GEMV shares).
// kSplit is chosen from (in, out) alone, so the order of every sum is fixed by the shape and a
// row's result does not depend on the rows beside it.
#include <cstdint>
#include <string>

#include "base/format.h"
#include "kernels/common.cuh"
#include "kernels/model/weight_stream.cuh"
#include "kvvm/kernels/model_kernels.h"

namespace kvvm {
namespace kernels {
namespace {

constexpr unsigned kGemvThreads = 256;
constexpr unsigned kGemvWarps = kGemvThreads / 32;
// Vectors a lane streams at most before the split grows (weight_stream_split).
constexpr std::uint32_t kLaneVectors = 4;

__device__ __forceinline__ float2 pair_to_float2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float2 pair_to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }

template <typename T>
struct PairOf;
template <>
struct PairOf<__half> {
  using type = __half2;
};
template <>
struct PairOf<__nv_bfloat16> {
  using type = __nv_bfloat162;
};

// The dot product of 8 weights and 8 activations, in float32, in element order.
template <typename T>
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x) {
  using Pair = typename PairOf<T>::type;
  const Pair* wp = reinterpret_cast<const Pair*>(&w);
  const Pair* xp = reinterpret_cast<const Pair*>(&x);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = pair_to_float2(wp[i]), b = pair_to_float2(xp[i]);
    sum = fmaf(a.x, b.x, sum);
    sum = fmaf(a.y, b.y, sum);
  }
  return sum;
}

template <typename T, unsigned kRows, unsigned kSplit, unsigned kUnroll>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const GemvParams p) {
  constexpr unsigned kOutputs = kGemvWarps / kSplit;
  constexpr unsigned kStride = kSplit * 32;  // vectors between a lane's consecutive loads
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::uint32_t output = blockIdx.x * kOutputs + warp / kSplit;
  const unsigned part = warp % kSplit;
  const std::uint32_t vectors = p.in / 8;
  float acc[kRows];
#pragma unroll
  for (unsigned r = 0; r < kRows; ++r) acc[r] = 0.0f;
  if (output < p.out) {
    const uint4* w =
        static_cast<const uint4*>(p.weight) + static_cast<std::uint64_t>(output) * vectors;
    const uint4* x = static_cast<const uint4*>(p.x);
    stream_weights<kUnroll>(
        w, part * 32 + lane, kStride, vectors, [&](const uint4& weights, std::uint32_t at) {
#pragma unroll
          for (unsigned r = 0; r < kRows; ++r) {
            if (r < p.rows) {
              acc[r] += dot8<T>(
                  weights, load_previous_output(x + static_cast<std::uint64_t>(r) * vectors + at));
            }
          }
        });
  }
  if (!sum_output_partials<kRows, kSplit, kGemvWarps>(acc, warp, part, lane)) return;
  // Only lane 0 of an output's first warp writes, and it waited for the previous kernel above.
  if (lane != 0 || output >= p.out) return;
#pragma unroll
  for (unsigned r = 0; r < kRows; ++r) {
    if (r >= p.rows) break;
    const std::uint64_t at = static_cast<std::uint64_t>(r) * p.out + output;
    float value = acc[r];
    if (p.bias != nullptr) {
      value += to_float<T>(static_cast<const T*>(p.bias)[output]);
    } else if (p.beta != 0.0f) {
      value += p.beta * (p.y_float ? static_cast<const float*>(p.y)[at]
                                   : to_float<T>(static_cast<const T*>(p.y)[at]));
    }
    if (p.y_float) {
      static_cast<float*>(p.y)[at] = value;
    } else {
      static_cast<T*>(p.y)[at] = from_float<T>(value);
    }
  }
}

// Launched with programmatic stream serialization: the grid may start while the previous
// kernel's last blocks run, and waits for it (wait_for_previous_kernel) before reading x.
template <typename T>
cudaError_t launch(const GemvParams& p, cudaStream_t stream) {
  return dispatch_weight_stream(
      p.rows, weight_stream_split(p.out, p.in / 8, p.split, kLaneVectors, 0),
      weight_stream_unroll(p.unroll), [&](auto rows, auto split, auto unroll) {
        constexpr unsigned kOutputs = kGemvWarps / decltype(split)::value;
        return launch_overlapping(
            gemv_kernel<T, decltype(rows)::value, decltype(split)::value, decltype(unroll)::value>,
            dim3((p.out + kOutputs - 1) / kOutputs), kGemvThreads, 0, stream, p);
      });
}

}  // namespace
}  // namespace kernels

Status gemv_cuda(const GemvParams& p, void* stream) {
  if (p.element != DType::kFp16 && p.element != DType::kBf16) {
    return Status::InvalidArgument("gemv: element type " + std::string(to_string(p.element)) +
                                   " is not supported (fp16, bf16)");
  }
  if (p.rows == 0) return Status::Ok();
  if (p.rows > kGemvMaxRows) {
    return Status::InvalidArgument("gemv: " + str(p.rows) + " rows, more than " +
                                   str(kGemvMaxRows) + " (a GEMM's shape)");
  }
  if (p.split != 0 && p.split != 1 && p.split != 2 && p.split != 4 && p.split != 8) {
    return Status::InvalidArgument("gemv: split " + str(p.split) + " is not 0, 1, 2, 4 or 8");
  }
  if (p.unroll != 0 && p.unroll != 4 && !(p.unroll == 8 && p.rows <= kernels::kWideRows)) {
    return Status::InvalidArgument("gemv: unroll " + str(p.unroll) + " with " + str(p.rows) +
                                   " rows (0, 4, or 8 for at most " + str(kernels::kWideRows) +
                                   " rows)");
  }
  if (p.in == 0 || p.in % 8 != 0 || p.out == 0) {
    return Status::InvalidArgument("gemv: in " + str(p.in) + " x out " + str(p.out) +
                                   ": both positive, in a multiple of 8");
  }
  if (p.x == nullptr || p.weight == nullptr || p.y == nullptr) {
    return Status::InvalidArgument(std::string("gemv: ") +
                                   (p.x == nullptr        ? "x"
                                    : p.weight == nullptr ? "weight"
                                                          : "y") +
                                   " is null");
  }
  const auto misaligned = [](const void* pointer) {
    return reinterpret_cast<std::uintptr_t>(pointer) % 16 != 0;
  };
  if (misaligned(p.x) || misaligned(p.weight)) {
    return Status::InvalidArgument(std::string("gemv: ") + (misaligned(p.x) ? "x" : "weight") +
                                   " is not 16-byte aligned");
  }
  auto* s = static_cast<cudaStream_t>(stream);
  const cudaError_t launched = p.element == DType::kFp16 ? kernels::launch<__half>(p, s)
                                                         : kernels::launch<__nv_bfloat16>(p, s);
  return kernels::cuda_status("cudaLaunchKernelEx(gemv_kernel)", launched);
}

}  // namespace kvvm
