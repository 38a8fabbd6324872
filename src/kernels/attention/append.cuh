// Append: copies the K and V rows of new tokens into their slots through a KvView.
//
// Why one thread per 16-byte vector: a row of one head (D * 2 bytes) is contiguous in every
// layout, so D / 8 adjacent threads move it with one 16-byte load and one 16-byte store each;
// where rows of different heads or tokens land depends on the layout, and only the view's
// strides know. Per-row slot and position arrays are read on the device, so a captured decode
// step appends at positions the host updates between replays. An fp8 cache: a thread writes
// 16 e4m3 bytes from 16 activations (32 bytes read), each divided by the scale (IEEE
// division, as the host path) and rounded to nearest even, saturating.
#pragma once

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/fp8.cuh"
#include "kvvm/kernels/attention.h"

namespace kvvm::kernels {

constexpr std::uint32_t kAppendThreads = 256;

// The caller's parameters as given, and what the launcher derives from them.
struct AppendKernelParams : AppendParams {
  explicit AppendKernelParams(const AppendParams& params) : AppendParams(params) {}
  std::uint32_t vectors_per_row = 0;  // head_dim * element_bytes / 16 (16-byte stores per row)
};

// Sixteen activations of type T from `from` as 16 e4m3 bytes of value / scale.
template <typename T>
__device__ __forceinline__ uint4 quantize16(const unsigned char* from, float scale) {
  const uint4 raw[2] = {reinterpret_cast<const uint4*>(from)[0],
                        reinterpret_cast<const uint4*>(from)[1]};
  const T* values = reinterpret_cast<const T*>(raw);
  std::uint32_t words[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    std::uint32_t word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const float value = __fdiv_rn(static_cast<float>(values[4 * w + b]), scale);
      word |= static_cast<std::uint32_t>(float_to_e4m3(value)) << (8 * b);
    }
    words[w] = word;
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// T: the activations' type (read only when kFp8; a 16-bit cache copies bytes).
template <typename T, bool kFp8>
__global__ void __launch_bounds__(kAppendThreads) append_kernel(const AppendKernelParams p) {
  // index = ((token * kv_heads + head) * 2 + kv) * vectors_per_row + part
  const std::uint64_t index = static_cast<std::uint64_t>(blockIdx.x) * kAppendThreads + threadIdx.x;
  const std::uint64_t total =
      static_cast<std::uint64_t>(p.tokens) * p.kv_heads * 2 * p.vectors_per_row;
  if (index >= total) return;
  const std::uint32_t part = index % p.vectors_per_row;
  const std::uint64_t head_row = index / p.vectors_per_row;  // (token * kv_heads + head) * 2 + kv
  const std::uint32_t kv = head_row % 2;
  const std::uint64_t source_row = head_row / 2;  // token * kv_heads + head
  const std::uint32_t head = source_row % p.kv_heads;
  const std::uint32_t token = static_cast<std::uint32_t>(source_row / p.kv_heads);
  const std::uint32_t slot = p.row_slots != nullptr ? p.row_slots[token] : p.slot;
  const std::uint64_t position =
      p.row_positions != nullptr ? p.row_positions[token] : std::uint64_t{p.start} + token;
  unsigned char* to =
      reinterpret_cast<unsigned char*>(p.view.address(slot, p.layer, kv, head, position)) +
      part * 16;
  if constexpr (kFp8) {
    const unsigned char* from = static_cast<const unsigned char*>(kv == 0 ? p.k : p.v) +
                                (source_row * p.vectors_per_row + part) * 16 * sizeof(T);
    const float* heads = kv == 0 ? p.head_scales.k : p.head_scales.v;
    const float scale = heads != nullptr ? heads[head] : (kv == 0 ? p.k_scale : p.v_scale);
    *reinterpret_cast<uint4*>(to) = quantize16<T>(from, scale);
  } else {
    const unsigned char* from = static_cast<const unsigned char*>(kv == 0 ? p.k : p.v) +
                                (source_row * p.vectors_per_row + part) * 16;
    *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
  }
}

}  // namespace kvvm::kernels
