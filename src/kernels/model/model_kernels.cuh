// The device code of the model kernels (include/kvvm/kernels/model_kernels.h): one block per row
// for the row reductions (RMSNorm, argmax) and the per-token rotation, grid-stride loops for the
// elementwise ones. Every value is computed in float32 and rounded to the element type exactly
// where the header says, which is where Hugging Face's eager torch ops round.
//
// Why 16-byte vectors only in the RMSNorm: it runs twice a layer on the decode step's critical
// path (a batch-1 step is a chain of one-block kernels), so its latency counts; the others move
// a few activations' worth of bytes per layer, and clarity of the rounding order wins.
//
// The RMSNorms, SiLU-muls and argmax kernels launch overlapping the kernel before them
// (common.cuh, launch_overlapping): each waits for it first thing, and the ones a projection
// follows let it start at once (its weights do not depend on them).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/dummy_value.h"
#include "kernels/fp8.cuh"
#include "kernels/model/rope.cuh"
#include "kvvm/kernels/model_kernels.h"

namespace kvvm::kernels {

constexpr std::uint32_t kRowThreads = 256;   // RMSNorm, rope, argmax, embedding: one block a row
constexpr std::uint32_t kFlatThreads = 256;  // elementwise kernels
constexpr std::uint32_t kMaxFlatBlocks = 65535;

// The sum over the block, in every thread. REQUIRES: blockDim.x a multiple of 32, at most 1024;
// called once per kernel (the shared partials are not reused).
__device__ __forceinline__ float block_sum(float value) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  value = lane < blockDim.x / 32 ? partial[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) embedding_kernel(const EmbeddingParams p) {
  const std::uint32_t token = blockIdx.x;
  const std::int32_t id = p.ids[token];
  T* out = static_cast<T*>(p.out) + static_cast<std::uint64_t>(token) * p.hidden;
  if (id < 0 || static_cast<std::uint32_t>(id) >= p.vocab) {
    for (std::uint32_t i = threadIdx.x; i < p.hidden; i += blockDim.x) out[i] = from_float<T>(0.0f);
    return;
  }
  const T* row = static_cast<const T*>(p.table) + static_cast<std::uint64_t>(id) * p.hidden;
  for (std::uint32_t i = threadIdx.x; i < p.hidden; i += blockDim.x) out[i] = row[i];
}

// The residual add and the sum of squares of one element (the add rounded and written back,
// as torch's in-place add does).
template <typename T>
__device__ __forceinline__ float add_and_square(T& x, const T* add, float& squares) {
  float value = to_float<T>(x);
  if (add != nullptr) {
    x = from_float<T>(value + to_float<T>(*add));
    value = to_float<T>(x);
  }
  squares += value * value;
  return value;
}

template <typename T>
__device__ __forceinline__ T normed_times_weight(float x, float scale, T weight) {
  return from_float<T>(to_float<T>(weight) * rounded<T>(x * scale));
}

// Any width and alignment: a block-stride loop over the row.
template <typename T>
__global__ void __launch_bounds__(kRowThreads) rmsnorm_kernel(const RmsNormParams p) {
  allow_next_kernel_to_start();  // a GEMV's weights do not depend on this row
  wait_for_previous_kernel();
  const std::uint32_t r = blockIdx.x;
  const std::uint64_t source = p.row_index != nullptr ? p.row_index[r] : r;
  T* x = static_cast<T*>(p.x) + source * p.hidden;
  const T* add = p.add != nullptr ? static_cast<const T*>(p.add) + source * p.hidden : nullptr;
  float squares = 0;
  for (std::uint32_t i = threadIdx.x; i < p.hidden; i += blockDim.x) {
    add_and_square<T>(x[i], add != nullptr ? add + i : nullptr, squares);
  }
  const float total = block_sum(squares);
  const float scale = rsqrtf(total / static_cast<float>(p.hidden) + p.eps);
  const T* weight = static_cast<const T*>(p.weight);
  T* out = static_cast<T*>(p.out) + static_cast<std::uint64_t>(r) * p.hidden;
  for (std::uint32_t i = threadIdx.x; i < p.hidden; i += blockDim.x) {
    out[i] = normed_times_weight<T>(to_float<T>(x[i]), scale, weight[i]);
  }
}

// 16-byte vectors a thread of rmsnorm_vector_kernel keeps in registers: rows up to
// kRowThreads * 8 * kNormVectors = 16,384 elements.
constexpr std::uint32_t kNormVectors = 8;

// A width that is a multiple of 8 elements, 16-byte aligned rows, at most 16,384 wide. Why not
// the loop above: its stores to x may alias the next iteration's loads, so each thread's loads
// ran one after another (a 4,096-wide row took ~16 us, one DRAM latency per element pair);
// here every thread issues all its loads (x, add, weight) before the first arithmetic, and the
// row stays in registers between the sum and the scaling.
// The largest value over the block, in every thread; as block_sum (its own shared partials).
__device__ __forceinline__ float block_max(float value) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  value = lane < blockDim.x / 32 ? partial[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// The largest magnitude of a 16-byte vector's 8 elements.
template <typename T>
__device__ __forceinline__ float vector_amax(const uint4& v) {
  const T* e = reinterpret_cast<const T*>(&v);
  float amax = 0.0f;
#pragma unroll
  for (std::uint32_t j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(to_float<T>(e[j])));
  return amax;
}

// A vector's 8 elements over `scale` in e4m3, in element order (the first in the low byte), as
// fp8_quantize_cuda writes them.
template <typename T>
__device__ __forceinline__ uint2 vector_to_e4m3(const uint4& v, float scale) {
  const T* e = reinterpret_cast<const T*>(&v);
  std::uint32_t word[2] = {0, 0};
#pragma unroll
  for (std::uint32_t j = 0; j < 8; j += 2) {
    word[j / 4] |= static_cast<std::uint32_t>(
                       floats_to_e4m3x2(to_float<T>(e[j]) / scale, to_float<T>(e[j + 1]) / scale))
                   << (8 * (j % 4));
  }
  return make_uint2(word[0], word[1]);
}

// The largest magnitude of the 128-element group a vector lies in, in each of the 16 threads
// that hold the group's vectors (consecutive lanes from a multiple of 16). Every lane of the
// warp calls it (amax 0 for a vector past the row).
__device__ __forceinline__ float group_amax(float amax) {
  for (int offset = 8; offset > 0; offset >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  return amax;
}

// Row r of a QuantizedRows past the real rows: zeros, scale 1 (a block's threads share it).
__device__ __forceinline__ void quantized_padding_row(const QuantizedRows& q, std::uint32_t r,
                                                      std::uint32_t width) {
  auto* out = reinterpret_cast<uint2*>(static_cast<std::uint8_t*>(q.out) +
                                       static_cast<std::uint64_t>(r) * width);
  for (std::uint32_t v = threadIdx.x; v < width / 8; v += blockDim.x) out[v] = make_uint2(0, 0);
  if (q.kind == Fp8Scales::kChannel) {
    if (threadIdx.x == 0) q.scales[r] = 1.0f;
    return;
  }
  for (std::uint32_t g = threadIdx.x; g < width / kFp8Block; g += blockDim.x) {
    q.scales[static_cast<std::uint64_t>(g) * q.stride + r] = 1.0f;
  }
}

// Vector v (8 elements) of row r, quantized with `scale`; the group's scale by its first thread.
template <typename T>
__device__ __forceinline__ void store_quantized(const QuantizedRows& q, std::uint32_t r,
                                                std::uint32_t width, std::uint32_t v,
                                                const uint4& value, float scale) {
  auto* out = reinterpret_cast<uint2*>(static_cast<std::uint8_t*>(q.out) +
                                       static_cast<std::uint64_t>(r) * width);
  out[v] = vector_to_e4m3<T>(value, scale);
  if (q.kind == Fp8Scales::kBlock128 && v % (kFp8Block / 8) == 0) {
    q.scales[static_cast<std::uint64_t>(v / (kFp8Block / 8)) * q.stride + r] = scale;
  } else if (q.kind == Fp8Scales::kChannel && v == 0) {
    q.scales[r] = scale;
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) rmsnorm_vector_kernel(const RmsNormParams p) {
  allow_next_kernel_to_start();  // a GEMV's weights do not depend on this row
  wait_for_previous_kernel();
  constexpr std::uint32_t kPer = 16 / sizeof(T);
  const std::uint32_t r = blockIdx.x;
  if (r >= p.rows) {  // a quantized copy's padding rows (the grid covers its stride)
    quantized_padding_row(p.quantized, r, p.hidden);
    return;
  }
  const std::uint64_t source = p.row_index != nullptr ? p.row_index[r] : r;
  const std::uint32_t vectors = p.hidden / kPer;
  auto* x = reinterpret_cast<uint4*>(static_cast<T*>(p.x) + source * p.hidden);
  const auto* add =
      p.add != nullptr
          ? reinterpret_cast<const uint4*>(static_cast<const T*>(p.add) + source * p.hidden)
          : nullptr;
  const auto* weight = static_cast<const uint4*>(p.weight);
  uint4 xs[kNormVectors], adds[kNormVectors], weights[kNormVectors];
#pragma unroll
  for (std::uint32_t k = 0; k < kNormVectors; ++k) {
    const std::uint32_t v = threadIdx.x + k * kRowThreads;
    if (v < vectors) {
      xs[k] = x[v];
      weights[k] = weight[v];
      if (add != nullptr) adds[k] = add[v];
    }
  }
  float squares = 0;
#pragma unroll
  for (std::uint32_t k = 0; k < kNormVectors; ++k) {
    const std::uint32_t v = threadIdx.x + k * kRowThreads;
    if (v >= vectors) continue;
    T* e = reinterpret_cast<T*>(&xs[k]);
    const T* a = reinterpret_cast<const T*>(&adds[k]);
#pragma unroll
    for (std::uint32_t j = 0; j < kPer; ++j) {
      add_and_square<T>(e[j], add != nullptr ? a + j : nullptr, squares);
    }
    if (add != nullptr) x[v] = xs[k];
  }
  const float total = block_sum(squares);
  const float scale = rsqrtf(total / static_cast<float>(p.hidden) + p.eps);
  auto* out =
      reinterpret_cast<uint4*>(static_cast<T*>(p.out) + static_cast<std::uint64_t>(r) * p.hidden);
#pragma unroll
  for (std::uint32_t k = 0; k < kNormVectors; ++k) {
    const std::uint32_t v = threadIdx.x + k * kRowThreads;
    if (v >= vectors) continue;
    const T* e = reinterpret_cast<const T*>(&xs[k]);
    const T* w = reinterpret_cast<const T*>(&weights[k]);
    uint4 result;
    T* o = reinterpret_cast<T*>(&result);
#pragma unroll
    for (std::uint32_t j = 0; j < kPer; ++j)
      o[j] = normed_times_weight<T>(to_float<T>(e[j]), scale, w[j]);
    out[v] = result;
    xs[k] = result;  // kept for the quantized copy
  }
  const QuantizedRows& q = p.quantized;
  if (q.out == nullptr) return;
  if (q.kind == Fp8Scales::kBlock128) {
    // A group of 128 is 16 vectors held by 16 consecutive threads (kRowThreads is a multiple
    // of 16 and the width of 128); every lane shuffles, those past the row with amax 0.
    // A pass whose first vector is past the row has none in it, for every thread alike.
#pragma unroll
    for (std::uint32_t k = 0; k < kNormVectors; ++k) {
      if (k * kRowThreads >= vectors) break;
      const std::uint32_t v = threadIdx.x + k * kRowThreads;
      const float amax = group_amax(v < vectors ? vector_amax<T>(xs[k]) : 0.0f);
      if (v < vectors) store_quantized<T>(q, r, p.hidden, v, xs[k], e4m3_scale_of(amax));
    }
    return;
  }
  float amax = 0.0f;
#pragma unroll
  for (std::uint32_t k = 0; k < kNormVectors; ++k) {
    const std::uint32_t v = threadIdx.x + k * kRowThreads;
    if (v < vectors) amax = fmaxf(amax, vector_amax<T>(xs[k]));
  }
  const float row_scale = e4m3_scale_of(block_max(amax));
#pragma unroll
  for (std::uint32_t k = 0; k < kNormVectors; ++k) {
    if (k * kRowThreads >= vectors) break;
    const std::uint32_t v = threadIdx.x + k * kRowThreads;
    if (v < vectors) store_quantized<T>(q, r, p.hidden, v, xs[k], row_scale);
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) rope_kernel(const RopeParams p) {
  const std::uint32_t token = blockIdx.x;
  const std::uint32_t half = p.head_dim / 2;
  const float position = static_cast<float>(p.positions[token]);
  const std::uint32_t heads = p.q_heads + (p.k != nullptr ? p.k_heads : 0);
  for (std::uint32_t j = threadIdx.x; j < heads * half; j += blockDim.x) {
    const std::uint32_t head = j / half, i = j % half;
    T* row =
        head < p.q_heads
            ? static_cast<T*>(p.q) +
                  (static_cast<std::uint64_t>(token) * p.q_heads + head) * p.head_dim
            : static_cast<T*>(p.k) +
                  (static_cast<std::uint64_t>(token) * p.k_heads + (head - p.q_heads)) * p.head_dim;
    const RotatedPair<T> rotated = rotate_pair<T>(row[i], row[i + half], position, p.inv_freq[i]);
    row[i] = rotated.low;
    row[i + half] = rotated.high;
  }
}

template <typename T>
__global__ void __launch_bounds__(kFlatThreads) silu_mul_kernel(const SiluMulParams p) {
  allow_next_kernel_to_start();  // the down projection's weights do not depend on this
  wait_for_previous_kernel();
  const std::uint64_t total = static_cast<std::uint64_t>(p.rows) * p.inter;
  const T* gate_up = static_cast<const T*>(p.gate_up);
  T* out = static_cast<T*>(p.out);
  for (std::uint64_t index = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       index < total; index += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t row = index / p.inter, i = index % p.inter;
    const float gate = to_float<T>(gate_up[row * 2 * p.inter + i]);
    const float up = to_float<T>(gate_up[row * 2 * p.inter + p.inter + i]);
    const float act = rounded<T>(gate / (1.0f + expf(-gate)));
    out[index] = from_float<T>(act * up);
  }
}

// 8 outputs of silu_mul_kernel from a 16-byte vector of gates and one of ups, rounded as it
// rounds them.
template <typename T>
__device__ __forceinline__ uint4 silu_mul_vector(const uint4& gates, const uint4& ups) {
  const T* g = reinterpret_cast<const T*>(&gates);
  const T* u = reinterpret_cast<const T*>(&ups);
  uint4 result;
  T* o = reinterpret_cast<T*>(&result);
#pragma unroll
  for (std::uint32_t j = 0; j < 8; ++j) {
    const float gate = to_float<T>(g[j]);
    const float act = rounded<T>(gate / (1.0f + expf(-gate)));
    o[j] = from_float<T>(act * to_float<T>(u[j]));
  }
  return result;
}

// silu_mul_kernel's rows with their quantized copy (QuantizedRows), in two shapes. Why not one
// block a row looping over it: a 14,336-wide row was 7 dependent rounds of loads and stores in
// one block while the other SMs idled (18 us a call at 2 rows on an H200, 3 us unquantized).
//
// Block-scaled: block (row, part) computes kSiluGroupThreads vectors of the row, one 16-byte
// vector a thread, and quantizes each 128-element group (16 threads' vectors); a grid of
// (stride, vectors / kSiluGroupThreads) blocks, the padding rows' blocks writing zeros of scale
// 1. REQUIRES: inter a multiple of 128, the rows 16-byte aligned.
constexpr std::uint32_t kSiluGroupThreads = 128;
template <typename T>
__global__ void __launch_bounds__(kSiluGroupThreads) silu_mul_groups_kernel(const SiluMulParams p) {
  allow_next_kernel_to_start();  // the down projection's weights do not depend on this
  wait_for_previous_kernel();
  const QuantizedRows& q = p.quantized;
  const std::uint32_t r = blockIdx.x;
  const std::uint32_t vectors = p.inter / 8;
  const std::uint32_t v = blockIdx.y * kSiluGroupThreads + threadIdx.x;
  if (r >= p.rows) {
    if (v < vectors) store_quantized<T>(q, r, p.inter, v, make_uint4(0, 0, 0, 0), 1.0f);
    return;
  }
  const auto* gates = reinterpret_cast<const uint4*>(static_cast<const T*>(p.gate_up) +
                                                     static_cast<std::uint64_t>(r) * 2 * p.inter);
  auto* out =
      reinterpret_cast<uint4*>(static_cast<T*>(p.out) + static_cast<std::uint64_t>(r) * p.inter);
  // Every lane shuffles; a group's 16 vectors are all in the row or all past it.
  uint4 result = make_uint4(0, 0, 0, 0);
  if (v < vectors) {
    result = silu_mul_vector<T>(gates[v], gates[vectors + v]);
    out[v] = result;
  }
  const float amax = group_amax(v < vectors ? vector_amax<T>(result) : 0.0f);
  if (v < vectors) store_quantized<T>(q, r, p.inter, v, result, e4m3_scale_of(amax));
}

// Per channel (a scale a row): one block of kSiluRowThreads a row, every thread loading all its
// vectors (up to kSiluRowVectors) before computing any, the results kept in registers between
// the row's largest magnitude and the quantized writes. REQUIRES: inter a multiple of 8, at
// most kSiluRowThreads * kSiluRowVectors * 8 (wider rows quantize separately), 16-byte aligned.
constexpr std::uint32_t kSiluRowThreads = 1024;
constexpr std::uint32_t kSiluRowVectors = 4;
template <typename T>
__global__ void __launch_bounds__(kSiluRowThreads) silu_mul_row_kernel(const SiluMulParams p) {
  allow_next_kernel_to_start();  // the down projection's weights do not depend on this
  wait_for_previous_kernel();
  const QuantizedRows& q = p.quantized;
  const std::uint32_t r = blockIdx.x;
  if (r >= p.rows) {
    quantized_padding_row(q, r, p.inter);
    return;
  }
  const std::uint32_t vectors = p.inter / 8;
  const auto* gates = reinterpret_cast<const uint4*>(static_cast<const T*>(p.gate_up) +
                                                     static_cast<std::uint64_t>(r) * 2 * p.inter);
  auto* out =
      reinterpret_cast<uint4*>(static_cast<T*>(p.out) + static_cast<std::uint64_t>(r) * p.inter);
  uint4 values[kSiluRowVectors], ups[kSiluRowVectors];
#pragma unroll
  for (std::uint32_t k = 0; k < kSiluRowVectors; ++k) {
    const std::uint32_t v = threadIdx.x + k * kSiluRowThreads;
    if (v < vectors) {
      values[k] = gates[v];
      ups[k] = gates[vectors + v];
    }
  }
  float amax = 0.0f;
#pragma unroll
  for (std::uint32_t k = 0; k < kSiluRowVectors; ++k) {
    const std::uint32_t v = threadIdx.x + k * kSiluRowThreads;
    if (v >= vectors) continue;
    values[k] = silu_mul_vector<T>(values[k], ups[k]);
    out[v] = values[k];
    amax = fmaxf(amax, vector_amax<T>(values[k]));
  }
  const float scale = e4m3_scale_of(block_max(amax));
#pragma unroll
  for (std::uint32_t k = 0; k < kSiluRowVectors; ++k) {
    const std::uint32_t v = threadIdx.x + k * kSiluRowThreads;
    if (v < vectors) store_quantized<T>(q, r, p.inter, v, values[k], scale);
  }
}

template <typename T>
__global__ void __launch_bounds__(kFlatThreads) broadcast_rows_kernel(const BroadcastRowsParams p) {
  const std::uint64_t total = static_cast<std::uint64_t>(p.rows) * p.cols;
  const T* row = static_cast<const T*>(p.row);
  T* out = static_cast<T*>(p.out);
  for (std::uint64_t index = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       index < total; index += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    out[index] = row[index % p.cols];
  }
}

// Magnitudes as float bits: for non-negative floats (and a NaN of sign 0, above +inf) the
// unsigned order is the float order, so atomicMax on the bits is a float max that keeps NaN.
template <typename T>
__global__ void __launch_bounds__(kFlatThreads) absmax_kernel(const AbsMaxParams p) {
  const T* x = static_cast<const T*>(p.x);
  std::uint32_t most = 0;
  for (std::uint64_t index = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       index < p.count; index += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    most = max(most, __float_as_uint(fabsf(to_float<T>(x[index]))));
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    most = max(most, __shfl_xor_sync(0xffffffffu, most, offset));
  }
  if (threadIdx.x % 32 == 0 && most != 0) {
    atomicMax(reinterpret_cast<unsigned int*>(p.out), most);
  }
}

// T: __half, __nv_bfloat16, float, or std::uint8_t (e4m3 bytes, rounded as the append does).
template <typename T>
__global__ void __launch_bounds__(kFlatThreads) dummy_fill_kernel(const DummyFillParams p) {
  T* out = static_cast<T*>(p.out);
  for (std::uint64_t index = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       index < p.count; index += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const float value =
        p.scale == 0.0f ? p.constant : dummy_value(p.seed, p.tensor, index, p.scale);
    if constexpr (std::is_same_v<T, float>) {
      out[index] = value;
    } else if constexpr (std::is_same_v<T, std::uint8_t>) {
      out[index] = float_to_e4m3(value);
    } else {
      out[index] = from_float<T>(value);
    }
  }
}

// (value, index) with the larger value winning and the lower index among equals; a lane that
// saw nothing holds (-inf, UINT32_MAX) and loses to any real candidate.
__device__ __forceinline__ void keep_better(float& value, std::uint32_t& index, float other_value,
                                            std::uint32_t other_index) {
  if (other_value > value || (other_value == value && other_index < index)) {
    value = other_value;
    index = other_index;
  }
}

// The best (value, index) of row[begin, end) over the block, in thread 0 (the lowest index
// among equals; (-inf, UINT32_MAX) when every entry is NaN).
__device__ __forceinline__ void block_argmax(const float* row, std::uint32_t begin,
                                             std::uint32_t end, float& best,
                                             std::uint32_t& best_index) {
  best = kNegInf;
  best_index = 0xffffffffu;
  for (std::uint32_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float value = row[i];
    // Ascending i: strictly greater keeps this thread's lowest index; NaN compares false.
    if (value > best || (value == best && best_index == 0xffffffffu)) {
      best = value;
      best_index = i;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const std::uint32_t other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
    keep_better(best, best_index, other, other_index);
  }
  __shared__ float values[32];
  __shared__ std::uint32_t indices[32];
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    values[warp] = best;
    indices[warp] = best_index;
  }
  __syncthreads();
  if (warp != 0) return;
  best = lane < blockDim.x / 32 ? values[lane] : kNegInf;
  best_index = lane < blockDim.x / 32 ? indices[lane] : 0xffffffffu;
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const std::uint32_t other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
    keep_better(best, best_index, other, other_index);
  }
}

__device__ __forceinline__ std::int32_t argmax_answer(std::uint32_t best_index) {
  return best_index == 0xffffffffu ? 0 : static_cast<std::int32_t>(best_index);
}

// One block a row.
__global__ void __launch_bounds__(kRowThreads) argmax_kernel(const ArgmaxParams p) {
  wait_for_previous_kernel();
  float best;
  std::uint32_t best_index;
  block_argmax(p.logits + static_cast<std::uint64_t>(blockIdx.x) * p.vocab, 0, p.vocab, best,
               best_index);
  if (threadIdx.x == 0) p.out[blockIdx.x] = argmax_answer(best_index);
}

// Block (split, row): the best of the row's split-th stretch of `stretch` entries.
__global__ void __launch_bounds__(kRowThreads)
    argmax_split_kernel(const ArgmaxParams p, std::uint32_t stretch) {
  wait_for_previous_kernel();
  const std::uint32_t begin = blockIdx.x * stretch;
  const std::uint32_t end = begin + stretch < p.vocab ? begin + stretch : p.vocab;
  float best;
  std::uint32_t best_index;
  block_argmax(p.logits + static_cast<std::uint64_t>(blockIdx.y) * p.vocab, begin, end, best,
               best_index);
  if (threadIdx.x == 0) {
    p.workspace[static_cast<std::uint64_t>(blockIdx.y) * kArgmaxSplits + blockIdx.x] = {best,
                                                                                        best_index};
  }
}

// One warp a row: the best of its `splits` stretches' bests.
__global__ void __launch_bounds__(32)
    argmax_merge_kernel(const ArgmaxParams p, std::uint32_t splits) {
  wait_for_previous_kernel();
  const ArgmaxPartial* partial =
      p.workspace + static_cast<std::uint64_t>(blockIdx.x) * kArgmaxSplits;
  float best = kNegInf;
  std::uint32_t best_index = 0xffffffffu;
  for (std::uint32_t i = threadIdx.x; i < splits; i += 32) {
    keep_better(best, best_index, partial[i].value, partial[i].index);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const std::uint32_t other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
    keep_better(best, best_index, other, other_index);
  }
  if (threadIdx.x == 0) p.out[blockIdx.x] = argmax_answer(best_index);
}

}  // namespace kvvm::kernels
