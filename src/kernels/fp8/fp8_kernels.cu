// The FP8 projections' kernels (include/kvvm/kernels/fp8_kernels.h).
//
// The GEMV of activations as they are (the tensor-core form, with quantized activations, is
// fp8_mma_gemv.cuh): as gemv_kernel.cu, a block of 8 warps covers 8 / kSplit outputs and the kSplit
// warps of one output share its row of weights, each taking every kSplit-th 512-byte stretch
// (a lane: one 16-byte vector of 16 e4m3 weights per stretch, against the two 16-byte vectors
// of x of each row), streamed as weight_stream.cuh says. Weights are widened exactly (e4m3 -> fp16
// pairs, one instruction per pair), multiplied in float32 and summed per vector; a block-scaled
// vector (16 of one 128 x 128 block) is scaled after its sum, a per-channel output once at the end.
// The order of every sum is fixed by (in, out), so a row's result does not depend on the rows
// beside it.
//
// The quantization: block-scaled, one warp per (row, group of 128): each lane four elements, the
// group's amax by a butterfly; per channel, one block per row, the amax by the block, then the
// row quantized in a second pass (it is in L1 / L2).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "kernels/common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/fp8/fp8_checks.h"
#include "kernels/fp8/fp8_mma_gemv.cuh"
#include "kernels/model/weight_stream.cuh"
#include "kvvm/kernels/fp8_kernels.h"

namespace kvvm {
namespace kernels {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kWarps = kThreads / 32;
// Warps the GEMV's split aims to put on the GPU: about what one wave holds (132 SMs x 32).
constexpr std::uint64_t kWantWarps = 4096;

template <typename T>
struct PairOf;
template <>
struct PairOf<__half> {
  using type = __half2;
  static __device__ __forceinline__ float2 widen(__half2 v) { return __half22float2(v); }
};
template <>
struct PairOf<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ float2 widen(__nv_bfloat162 v) { return __bfloat1622float2(v); }
};

// 16 weights (a vector of e4m3) widened to float pairs once, then used by every row.
struct Widened16 {
  float2 pair[8];
};
__device__ __forceinline__ Widened16 widen16(const uint4& w) {
  Widened16 out;
  const std::uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    std::uint32_t low, high;
    e4m3x4_to_half2x2(words[i], low, high);
    out.pair[2 * i] = __half22float2(*reinterpret_cast<const __half2*>(&low));
    out.pair[2 * i + 1] = __half22float2(*reinterpret_cast<const __half2*>(&high));
  }
  return out;
}

// The widened vector against row r's matching 16 activations, in element order.
template <typename T>
__device__ __forceinline__ float dot16(const Widened16& w, const uint4* x_row, std::uint32_t v) {
  using Pair = typename PairOf<T>::type;
  float sum = 0.0f;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint4 x = load_previous_output(x_row + 2 * v + half);
    const Pair* xp = reinterpret_cast<const Pair*>(&x);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 a = w.pair[4 * half + i];
      const float2 b = PairOf<T>::widen(xp[i]);
      sum = fmaf(a.x, b.x, sum);
      sum = fmaf(a.y, b.y, sum);
    }
  }
  return sum;
}

template <typename T, unsigned kRows, unsigned kSplit, unsigned kUnroll, bool kBlock>
__global__ void __launch_bounds__(kThreads) fp8_gemv_kernel(const Fp8GemvArgs p) {
  constexpr unsigned kOutputs = kWarps / kSplit;
  constexpr unsigned kStride = kSplit * 32;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::uint32_t output = blockIdx.x * kOutputs + warp / kSplit;
  const unsigned part = warp % kSplit;
  const std::uint32_t vectors = p.in / 16;
  float acc[kRows];
#pragma unroll
  for (unsigned r = 0; r < kRows; ++r) acc[r] = 0.0f;
  if (output < p.out) {
    const uint4* w =
        static_cast<const uint4*>(p.weight) + static_cast<std::uint64_t>(output) * vectors;
    const uint4* x = static_cast<const uint4*>(p.x);
    const std::uint32_t blocks_in = (p.in + kFp8Block - 1) / kFp8Block;
    const std::uint32_t scale_row = (blocks_in + 3) / 4 * 4;  // the store's padded row
    const float* scales = p.scales + static_cast<std::uint64_t>(output / kFp8Block) * scale_row;
    stream_weights<kUnroll>(
        w, part * 32 + lane, kStride, vectors, [&](const uint4& weights, std::uint32_t at) {
          const float scale = kBlock ? __ldg(scales + at / (kFp8Block / 16)) : 1.0f;
          const Widened16 widened = widen16(weights);
#pragma unroll
          for (unsigned r = 0; r < kRows; ++r) {
            if (r < p.rows) {
              const float d =
                  dot16<T>(widened, x + static_cast<std::uint64_t>(r) * vectors * 2, at);
              acc[r] = kBlock ? fmaf(scale, d, acc[r]) : acc[r] + d;
            }
          }
        });
  }
  if (!sum_output_partials<kRows, kSplit, kWarps>(acc, warp, part, lane)) return;
  if (lane != 0 || output >= p.out) return;
  const float channel = kBlock ? 1.0f : __ldg(p.scales + output);
#pragma unroll
  for (unsigned r = 0; r < kRows; ++r) {
    if (r >= p.rows) break;
    const std::uint64_t at = static_cast<std::uint64_t>(r) * p.out + output;
    float value = acc[r] * channel;
    if (p.bias != nullptr) {
      value += to_float<T>(static_cast<const T*>(p.bias)[output]);
    } else if (p.beta != 0.0f) {
      value += p.beta * to_float<T>(static_cast<const T*>(p.y)[at]);
    }
    static_cast<T*>(p.y)[at] = from_float<T>(value);
  }
}

template <typename T, bool kBlock>
cudaError_t launch_scaled(const Fp8GemvArgs& p, cudaStream_t stream) {
  return dispatch_weight_stream(
      p.rows, weight_stream_split(p.out, p.in / 16, p.split, 0, kWantWarps),
      weight_stream_unroll(p.unroll), [&](auto rows, auto split, auto unroll) {
        constexpr unsigned kOutputs = kWarps / decltype(split)::value;
        return launch_overlapping(fp8_gemv_kernel<T, decltype(rows)::value, decltype(split)::value,
                                                  decltype(unroll)::value, kBlock>,
                                  dim3((p.out + kOutputs - 1) / kOutputs), kThreads, 0, stream, p);
      });
}

// The tensor-core form: tiles of 16 outputs, kSplit warps a tile from the shape (about one
// wave of warps, as the widening form), 2 steps (4 vectors) a lane in flight, or 4 forced.
// Launched overlapping the kernel before it; its activations come through
// load_previous_output. Read through __ldg, ptxas moved their first loads above the wait, and
// a Qwen3 FP8 fixture's first forward differed from transformers by 0.06-0.28 relative.
template <typename T, bool kBlock>
cudaError_t launch_mma(const Fp8GemvArgs& p, cudaStream_t stream) {
  const std::uint32_t tiles = (p.out + kMmaTileOutputs - 1) / kMmaTileOutputs;
  const unsigned split = weight_stream_split(tiles, p.in / 16, p.split, 0, kWantWarps);
  const auto launch = [&](auto split_c, auto steps_c) {
    constexpr unsigned kSplit = decltype(split_c)::value;
    constexpr unsigned kTiles = kMmaGemvWarps / kSplit;
    return launch_overlapping(fp8_mma_gemv_kernel<T, kSplit, decltype(steps_c)::value, kBlock>,
                              dim3((tiles + kTiles - 1) / kTiles), kMmaGemvThreads, 0, stream, p);
  };
  const auto with_steps = [&](auto steps_c) {
    switch (split) {
      case 1:
        return launch(std::integral_constant<unsigned, 1>{}, steps_c);
      case 2:
        return launch(std::integral_constant<unsigned, 2>{}, steps_c);
      case 4:
        return launch(std::integral_constant<unsigned, 4>{}, steps_c);
      default:
        return launch(std::integral_constant<unsigned, 8>{}, steps_c);
    }
  };
  return weight_stream_unroll(p.unroll) == 8 ? with_steps(std::integral_constant<unsigned, 4>{})
                                             : with_steps(std::integral_constant<unsigned, 2>{});
}

template <typename T>
cudaError_t launch_typed(const Fp8GemvArgs& p, cudaStream_t stream) {
  const bool block = p.scales_kind == Fp8Scales::kBlock128;
  if (p.xq != nullptr)
    return block ? launch_mma<T, true>(p, stream) : launch_mma<T, false>(p, stream);
  return block ? launch_scaled<T, true>(p, stream) : launch_scaled<T, false>(p, stream);
}

// Four e4m3 bytes of x[i..i+3] / scale, the lower in the low byte.
template <typename T>
__device__ __forceinline__ std::uint32_t quantize4(const T* x, float scale) {
  return static_cast<std::uint32_t>(
             floats_to_e4m3x2(to_float<T>(x[0]) / scale, to_float<T>(x[1]) / scale)) |
         static_cast<std::uint32_t>(
             floats_to_e4m3x2(to_float<T>(x[2]) / scale, to_float<T>(x[3]) / scale))
             << 16;
}

// Block-scaled: warp w of the grid quantizes (row, group) = (w / groups, w % groups).
template <typename T>
__global__ void __launch_bounds__(kThreads) fp8_quantize_groups_kernel(const Fp8QuantizeArgs p) {
  const std::uint32_t groups = p.in / kFp8Block;
  const std::uint64_t item = (static_cast<std::uint64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  if (item >= static_cast<std::uint64_t>(p.stride) * groups) return;
  const auto row = static_cast<std::uint32_t>(item / groups);
  const auto group = static_cast<std::uint32_t>(item % groups);
  const std::uint64_t first = static_cast<std::uint64_t>(row) * p.in + group * kFp8Block + lane * 4;
  auto* out = static_cast<std::uint32_t*>(p.out) + first / 4;
  wait_for_previous_kernel();
  if (row >= p.rows) {
    *out = 0;
    if (lane == 0) p.scales[static_cast<std::uint64_t>(group) * p.stride + row] = 1.0f;
    return;
  }
  const T* x = static_cast<const T*>(p.x) + first;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(to_float<T>(x[i])));
  for (int offset = 16; offset > 0; offset >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  const float scale = e4m3_scale_of(amax);
  *out = quantize4(x, scale);
  if (lane == 0) p.scales[static_cast<std::uint64_t>(group) * p.stride + row] = scale;
}

// Per channel (per token): block b quantizes row b.
template <typename T>
__global__ void __launch_bounds__(kThreads) fp8_quantize_rows_kernel(const Fp8QuantizeArgs p) {
  const std::uint32_t row = blockIdx.x;
  const std::uint64_t first = static_cast<std::uint64_t>(row) * p.in;
  auto* out = static_cast<std::uint32_t*>(p.out) + first / 4;
  const std::uint32_t words = p.in / 4;
  wait_for_previous_kernel();
  if (row >= p.rows) {
    for (std::uint32_t i = threadIdx.x; i < words; i += kThreads) out[i] = 0;
    if (threadIdx.x == 0) p.scales[row] = 1.0f;
    return;
  }
  const T* x = static_cast<const T*>(p.x) + first;
  float amax = 0.0f;
  for (std::uint32_t i = threadIdx.x; i < p.in; i += kThreads) {
    amax = fmaxf(amax, fabsf(to_float<T>(x[i])));
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  __shared__ float warp_max[kWarps];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.0f;
#pragma unroll
  for (unsigned w = 0; w < kWarps; ++w) amax = fmaxf(amax, warp_max[w]);
  const float scale = e4m3_scale_of(amax);
  for (std::uint32_t i = threadIdx.x; i < words; i += kThreads)
    out[i] = quantize4(x + 4 * i, scale);
  if (threadIdx.x == 0) p.scales[row] = scale;
}

template <typename T>
cudaError_t launch_quantize(const Fp8QuantizeArgs& p, cudaStream_t stream) {
  if (p.scales_kind == Fp8Scales::kBlock128) {
    const std::uint64_t warps = static_cast<std::uint64_t>(p.stride) * (p.in / kFp8Block);
    return launch_overlapping(fp8_quantize_groups_kernel<T>,
                              dim3(static_cast<unsigned>((warps + kWarps - 1) / kWarps)), kThreads,
                              0, stream, p);
  }
  return launch_overlapping(fp8_quantize_rows_kernel<T>, dim3(p.stride), kThreads, 0, stream, p);
}

}  // namespace
}  // namespace kernels

bool fp8_kernels_built() { return true; }

Status fp8_gemv_cuda(const Fp8GemvArgs& p, void* stream) {
  KVVM_RETURN_IF_ERROR(kernels::check_fp8_gemv(p));
  if (p.rows == 0) return Status::Ok();
  auto* s = static_cast<cudaStream_t>(stream);
  const cudaError_t launched = p.element == DType::kFp16
                                   ? kernels::launch_typed<__half>(p, s)
                                   : kernels::launch_typed<__nv_bfloat16>(p, s);
  return kernels::cuda_status("cudaLaunchKernelEx(fp8_gemv_kernel)", launched);
}

Status fp8_quantize_cuda(const Fp8QuantizeArgs& p, void* stream) {
  KVVM_RETURN_IF_ERROR(kernels::check_fp8_quantize(p));
  if (p.stride == 0) return Status::Ok();
  auto* s = static_cast<cudaStream_t>(stream);
  const cudaError_t launched = p.element == DType::kFp16
                                   ? kernels::launch_quantize<__half>(p, s)
                                   : kernels::launch_quantize<__nv_bfloat16>(p, s);
  return kernels::cuda_status("cudaLaunchKernelEx(fp8_quantize)", launched);
}

}  // namespace kvvm
