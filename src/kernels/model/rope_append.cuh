// RoPE fused with the KV append (attention.h, rope_append_kv_cuda): a thread per rotation pair,
// blocks (token, pairs / kRopeAppendThreads). A token's blocks read its row of the fused q|k|v
// projection, write q rotated to a dense buffer, and store k rotated and v into the cache where
// append_kernel would, with the same rounding (rope.cuh) and, for an fp8 cache, the same
// quantization (value / scale, IEEE division, then e4m3).
//
// Why pairs, not 16-byte vectors: a thread owns one rotation pair (x[i], x[i + d/2]), so the
// rotation needs no exchange between threads; the bytes per token (a few KiB) are small next to
// the weights the step reads, and the fusion's gain is the launch and the round trip through
// memory of the rotated k that it removes. Why not one block per token looping over its pairs:
// the loop's stores may alias its next loads, so a batch-1 step's one block ran its ten rounds
// of loads one after another (11 us a layer on the 8B shape).
//
// Launched overlapping the projection before it (launch_overlapping): it waits for that kernel
// before its first load.
#pragma once

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/model/rope.cuh"
#include "kvvm/kernels/attention.h"

namespace kvvm::kernels {

constexpr std::uint32_t kRopeAppendThreads = 256;

// T: the activations' type (and a 16-bit cache's); kFp8: the cache holds e4m3.
template <typename T, bool kFp8>
__global__ void __launch_bounds__(kRopeAppendThreads) rope_append_kernel(const RopeAppendParams p) {
  allow_next_kernel_to_start();  // the decode kernel's set-up does not depend on this
  wait_for_previous_kernel();
  const AppendParams& a = p.append;
  const std::uint32_t token = blockIdx.x;
  const std::uint32_t d = a.view.head_dim, half = d / 2;
  const std::uint32_t heads = p.qo_heads + 2 * a.kv_heads;  // q heads, k heads, v heads
  const std::uint32_t slot = a.row_slots != nullptr ? a.row_slots[token] : a.slot;
  const std::uint32_t position =
      a.row_positions != nullptr ? a.row_positions[token] : a.start + token;
  const T* row = static_cast<const T*>(p.qkv) + static_cast<std::uint64_t>(token) * heads * d;
  const std::uint32_t j = blockIdx.y * blockDim.x + threadIdx.x;
  if (j >= heads * half) return;
  const std::uint32_t head = j / half, i = j % half;
  T low = row[head * d + i], high = row[head * d + i + half];
  if (head < p.qo_heads + a.kv_heads) {
    const RotatedPair<T> rotated =
        rotate_pair<T>(low, high, static_cast<float>(position), p.inv_freq[i]);
    low = rotated.low;
    high = rotated.high;
  }
  if (head < p.qo_heads) {
    T* q = static_cast<T*>(p.q_out) + (static_cast<std::uint64_t>(token) * p.qo_heads + head) * d;
    q[i] = low;
    q[i + half] = high;
    return;
  }
  const std::uint32_t kv = head < p.qo_heads + a.kv_heads ? 0 : 1;
  const std::uint32_t kv_head = head - p.qo_heads - kv * a.kv_heads;
  void* dense = kv == 0 ? p.k_out : p.v_out;
  if (dense != nullptr) {
    T* to = static_cast<T*>(dense) + (static_cast<std::uint64_t>(token) * a.kv_heads + kv_head) * d;
    to[i] = low;
    to[i + half] = high;
  }
  if (!p.cache) return;
  void* to = reinterpret_cast<void*>(a.view.address(slot, a.layer, kv, kv_head, position));
  if constexpr (kFp8) {
    const float* scales = kv == 0 ? a.head_scales.k : a.head_scales.v;
    const float scale = scales != nullptr ? scales[kv_head] : (kv == 0 ? a.k_scale : a.v_scale);
    auto* bytes = static_cast<std::uint8_t*>(to);
    bytes[i] = float_to_e4m3(__fdiv_rn(to_float<T>(low), scale));
    bytes[i + half] = float_to_e4m3(__fdiv_rn(to_float<T>(high), scale));
  } else {
    static_cast<T*>(to)[i] = low;
    static_cast<T*>(to)[i + half] = high;
  }
}

}  // namespace kvvm::kernels
