// Split-K decode attention over a KvView (FlashInfer-style: one parameter struct, a kernel
// template over compile-time sizes, a merge kernel for the split).
//
// Why this shape:
//   - One block per (chunk of the sequence, KV head, group tile, sequence): the block loads
//     each K and V row of its chunk once, with 16-byte loads, and uses it for every query
//     head of the group tile (grouped-query attention reads the KV once per KV head).
//   - A head row of D elements is read by D / 8 lanes (16 for D = 128); a block of 128
//     threads holds 128 / (D / 8) rows in flight, each lane group kUnroll tokens deep, and
//     the next step's loads are issued before the current step's arithmetic.
//   - Scores live in the log2 domain (q is pre-scaled by sm_scale * log2 e) so the softmax
//     uses exp2f. The online-softmax state (max m, sum d, accumulator) starts at
//     (-inf, 0, 0); every rescale guards m == -inf, so a lane group, block or chunk that saw
//     no token contributes nothing and never makes a NaN.
//   - A token at or beyond min(length, max_length) is never loaded: the loads are predicated
//     on the position, not masked after the fact, so unmapped windows and an earlier
//     occupant's bytes (NaN included) are never touched.
//   - Split over the sequence (chunks > 1): each block writes its normalized partial output
//     and log2-sum-exp to a workspace, and decode_merge combines them; a chunk past the length
//     writes lse = -inf and weighs nothing.
#pragma once

#include <cstdint>

#include "kernels/common.cuh"
#include "kvvm/attention.h"

namespace kvvm::kernels {

constexpr std::uint32_t kDecodeThreads = 128;
// Tokens per lane group per step: fewer for the largest group tile, whose query and
// accumulator registers (2 x G x 8 floats) leave less room for the step's scores.
template <std::uint32_t G>
__host__ __device__ constexpr std::uint32_t decode_unroll() {
  return G >= 8 ? 2 : 4;
}

// The caller's parameters (chunk_tokens replaced by the planned one), and what the launcher
// derives from them.
struct DecodeKernelParams : DecodeParams {
  explicit DecodeKernelParams(const DecodeParams& params) : DecodeParams(params) {}
  std::uint32_t group = 0;        // qo_heads / kv_heads
  std::uint32_t group_tiles = 0;  // ceil(group / G)
  float scale_log2 = 0;           // sm_scale * log2(e)
  std::uint32_t chunks = 0;
  float* partial_out = nullptr;  // [batch][qo_heads][chunks][D] when chunks > 1
  float* partial_lse = nullptr;  // [batch][qo_heads][chunks]
};

// Shared-memory pipeline depth: 48 KiB of stages per block (3 of 16 KiB, or 6 of 8 KiB for
// the largest group tile), so a block with few resident neighbours keeps as many bytes in
// flight as one of the smaller tiles.
template <std::uint32_t G>
__host__ __device__ constexpr std::uint32_t decode_stages() {
  return 12 / decode_unroll<G>();
}

template <std::uint32_t D, std::uint32_t G>
struct DecodeShape {
  static constexpr std::uint32_t kLanes = D / kVecElements;           // lanes per head row
  static constexpr std::uint32_t kRows = kDecodeThreads / kLanes;     // rows in flight
  static constexpr std::uint32_t kStep = kRows * decode_unroll<G>();  // tokens per step
  // K and V of kStages steps: kStages x 2 x kU x kDecodeThreads x 16 bytes.
  static constexpr std::uint32_t kSharedBytes =
      decode_stages<G>() * 2 * decode_unroll<G>() * kDecodeThreads * 16;
};

template <typename T, std::uint32_t D, std::uint32_t G>
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(const DecodeKernelParams p) {
  using Shape = DecodeShape<D, G>;
  constexpr std::uint32_t kLanes = Shape::kLanes;
  constexpr std::uint32_t kRows = Shape::kRows;
  constexpr std::uint32_t kStep = Shape::kStep;
  constexpr std::uint32_t kU = decode_unroll<G>();
  constexpr std::uint32_t kStages = decode_stages<G>();

  __shared__ float s_max[kRows][G];
  __shared__ float s_sum[kRows][G];
  __shared__ float s_acc[kRows][D];

  const std::uint32_t chunk = blockIdx.x;
  const std::uint32_t kv_head = blockIdx.y / p.group_tiles;
  const std::uint32_t tile = blockIdx.y % p.group_tiles;
  const std::uint32_t b = blockIdx.z;
  const std::uint32_t lane = threadIdx.x % kLanes;
  const std::uint32_t row = threadIdx.x / kLanes;
  const std::uint32_t first_head = kv_head * p.group + tile * G;
  const std::uint32_t heads_here = min(G, p.group - tile * G);

  const std::uint32_t length = min(p.lengths[b], p.max_length);
  const std::uint32_t begin = chunk * p.chunk_tokens;
  const std::uint32_t end = min(begin + p.chunk_tokens, length);  // <= begin: empty chunk

  float q[G][8];
  {
    const T* q_base = static_cast<const T*>(p.q) +
                      (static_cast<std::uint64_t>(b) * p.qo_heads + first_head) * D +
                      lane * kVecElements;
#pragma unroll
    for (std::uint32_t j = 0; j < G; ++j) {
      if (j < heads_here) {
        vec_to_float<T>(load_vec(reinterpret_cast<const unsigned char*>(q_base + j * D)), q[j]);
#pragma unroll
        for (int e = 0; e < 8; ++e) q[j][e] *= p.scale_log2;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) q[j][e] = 0.0f;
      }
    }
  }

  float m[G], d[G], acc[G][8];
#pragma unroll
  for (std::uint32_t j = 0; j < G; ++j) {
    m[j] = kNegInf;
    d[j] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[j][e] = 0.0f;
  }

  const KvView& v = p.view;
  const std::uint32_t slot = p.slots[b];
  const unsigned char* k_base = reinterpret_cast<const unsigned char*>(v.base) +
                                slot * v.slot_stride + p.layer * v.layer_stride +
                                kv_head * v.head_stride + lane * 16u;
  const unsigned char* v_base = k_base + v.kv_stride;
  const std::uint64_t token_stride = v.token_stride;

  // Stage i of the chunk (kStep tokens of K and V) goes to shared-memory slot i % kStages by
  // cp.async, kStages - 1 stages ahead of the arithmetic. Each thread copies exactly the
  // 16-byte vectors it reads later (token u * kRows + row, part lane), so its own
  // wait_group makes them visible and no barrier is needed inside the loop.
  extern __shared__ uint4 stages[];  // [kStages][K, V][kU][kDecodeThreads]
  const std::uint32_t steps = end > begin ? (end - begin + kStep - 1) / kStep : 0;
  auto issue = [&](std::uint32_t step) {
    uint4* stage = stages + (step % kStages) * 2 * kU * kDecodeThreads;
    const std::uint32_t t0 = begin + step * kStep;
#pragma unroll
    for (std::uint32_t u = 0; u < kU; ++u) {
      const std::uint32_t t = t0 + u * kRows + row;
      const bool live = t < end;
      // A dead position copies nothing (source size 0 zero-fills); its address is the
      // chunk's first token, which is live, so no unmapped address is ever formed either.
      const std::uint64_t offset = static_cast<std::uint64_t>(live ? t : begin) * token_stride;
      copy_async_16(stage + u * kDecodeThreads + threadIdx.x, k_base + offset, live);
      copy_async_16(stage + (kU + u) * kDecodeThreads + threadIdx.x, v_base + offset, live);
    }
  };
#pragma unroll
  for (std::uint32_t i = 0; i + 1 < kStages; ++i) {
    if (i < steps) issue(i);
    copy_async_commit();
  }

  for (std::uint32_t step = 0; step < steps; ++step) {
    if (step + kStages - 1 < steps) issue(step + kStages - 1);
    copy_async_commit();
    copy_async_wait<kStages - 1>();
    const uint4* stage = stages + (step % kStages) * 2 * kU * kDecodeThreads;
    const std::uint32_t t0 = begin + step * kStep;
    uint4 k_cur[kU], v_cur[kU];
#pragma unroll
    for (std::uint32_t u = 0; u < kU; ++u) {
      k_cur[u] = stage[u * kDecodeThreads + threadIdx.x];
      v_cur[u] = stage[(kU + u) * kDecodeThreads + threadIdx.x];
    }

    float s[kU][G];
#pragma unroll
    for (std::uint32_t u = 0; u < kU; ++u) {
      float kf[8];
      vec_to_float<T>(k_cur[u], kf);
#pragma unroll
      for (std::uint32_t j = 0; j < G; ++j) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot = fmaf(q[j][e], kf[e], dot);
        s[u][j] = dot;
      }
    }
    // Sum over the lanes of a row (they are adjacent and aligned: xor stays inside the row).
#pragma unroll
    for (std::uint32_t u = 0; u < kU; ++u) {
#pragma unroll
      for (std::uint32_t j = 0; j < G; ++j) {
#pragma unroll
        for (std::uint32_t offset = kLanes / 2; offset > 0; offset /= 2) {
          s[u][j] += __shfl_xor_sync(0xffffffffu, s[u][j], offset);
        }
      }
    }
    bool valid[kU];
#pragma unroll
    for (std::uint32_t u = 0; u < kU; ++u) valid[u] = t0 + u * kRows + row < end;

    float weight[kU][G];
#pragma unroll
    for (std::uint32_t j = 0; j < G; ++j) {
      float new_max = m[j];
#pragma unroll
      for (std::uint32_t u = 0; u < kU; ++u) {
        if (valid[u]) new_max = fmaxf(new_max, s[u][j]);
      }
      // new_max == -inf only when no token of this step is valid for this row: nothing to add.
      const float correction = new_max == kNegInf ? 1.0f : exp2f(m[j] - new_max);
      float added = 0.0f;
#pragma unroll
      for (std::uint32_t u = 0; u < kU; ++u) {
        weight[u][j] = valid[u] ? exp2f(s[u][j] - new_max) : 0.0f;
        added += weight[u][j];
      }
      m[j] = new_max;
      d[j] = d[j] * correction + added;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[j][e] *= correction;
    }
#pragma unroll
    for (std::uint32_t u = 0; u < kU; ++u) {
      if (!valid[u]) continue;
      float vf[8];
      vec_to_float<T>(v_cur[u], vf);
#pragma unroll
      for (std::uint32_t j = 0; j < G; ++j) {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[j][e] = fmaf(weight[u][j], vf[e], acc[j][e]);
      }
    }
  }

  // Combine the lane groups of the block: one max and sum per head, then the accumulators
  // row by row, head by head (a fixed order: the same inputs give the same bits).
  if (lane == 0) {
#pragma unroll
    for (std::uint32_t j = 0; j < G; ++j) {
      s_max[row][j] = m[j];
      s_sum[row][j] = d[j];
    }
  }
  __syncthreads();
  float block_max[G], block_sum[G];
#pragma unroll
  for (std::uint32_t j = 0; j < G; ++j) {
    block_max[j] = kNegInf;
    for (std::uint32_t r = 0; r < kRows; ++r) block_max[j] = fmaxf(block_max[j], s_max[r][j]);
    block_sum[j] = 0.0f;
    if (block_max[j] != kNegInf) {
      for (std::uint32_t r = 0; r < kRows; ++r) {
        if (s_max[r][j] != kNegInf) block_sum[j] += s_sum[r][j] * exp2f(s_max[r][j] - block_max[j]);
      }
    }
  }
  const std::uint64_t row_base = static_cast<std::uint64_t>(b) * p.qo_heads + first_head;
#pragma unroll
  for (std::uint32_t j = 0; j < G; ++j) {
    if (j >= heads_here) break;  // uniform across the block
    const float own = m[j] == kNegInf ? 0.0f : exp2f(m[j] - block_max[j]);
#pragma unroll
    for (int e = 0; e < 8; ++e) s_acc[row][lane * 8 + e] = acc[j][e] * own;
    __syncthreads();
    const float inverse = block_sum[j] > 0.0f ? 1.0f / block_sum[j] : 0.0f;
    for (std::uint32_t col = threadIdx.x; col < D; col += kDecodeThreads) {
      float total = 0.0f;
      for (std::uint32_t r = 0; r < kRows; ++r) total += s_acc[r][col];
      if (p.chunks == 1) {
        static_cast<T*>(p.out)[(row_base + j) * D + col] = from_float<T>(total * inverse);
      } else {
        p.partial_out[((row_base + j) * p.chunks + chunk) * D + col] = total * inverse;
      }
    }
    __syncthreads();
  }
  if (p.chunks > 1 && threadIdx.x < heads_here) {
    const std::uint32_t j = threadIdx.x;
    float lse = kNegInf;
#pragma unroll
    for (std::uint32_t i = 0; i < G; ++i) {
      if (i == j && block_sum[i] > 0.0f) lse = block_max[i] + __log2f(block_sum[i]);
    }
    p.partial_lse[(row_base + j) * p.chunks + chunk] = lse;
  }
}

// One block per (query head, sequence); thread per output column. The chunks' weights
// exp2(lse_c - max) are computed once into shared memory by the whole block, so the column
// loop is a run of independent loads (unrolled: several in flight) instead of a chain.
template <typename T, std::uint32_t D>
__global__ void __launch_bounds__(D) decode_merge_kernel(const DecodeKernelParams p) {
  extern __shared__ float weight_of_chunk[];  // [chunks]
  __shared__ float warp_max[D / 32];
  const std::uint64_t row = static_cast<std::uint64_t>(blockIdx.y) * p.qo_heads + blockIdx.x;
  const float* lse = p.partial_lse + row * p.chunks;
  float max_lse = kNegInf;
  for (std::uint32_t c = threadIdx.x; c < p.chunks; c += D) max_lse = fmaxf(max_lse, lse[c]);
#pragma unroll
  for (std::uint32_t offset = 16; offset > 0; offset /= 2) {
    max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
  }
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = max_lse;
  __syncthreads();
#pragma unroll
  for (std::uint32_t w = 0; w < D / 32; ++w) max_lse = fmaxf(max_lse, warp_max[w]);
  // An empty chunk (lse -inf) weighs 0; with no token at all every weight is 0.
  for (std::uint32_t c = threadIdx.x; c < p.chunks; c += D) {
    weight_of_chunk[c] = max_lse == kNegInf || lse[c] == kNegInf ? 0.0f : exp2f(lse[c] - max_lse);
  }
  __syncthreads();
  // Every chunk's partial output was written by this launch (0 for an empty chunk).
  const float* partial = p.partial_out + row * p.chunks * D + threadIdx.x;
  float total = 0.0f, weights = 0.0f;
#pragma unroll 8
  for (std::uint32_t c = 0; c < p.chunks; ++c) {
    const float w = weight_of_chunk[c];
    weights += w;
    total = fmaf(w, partial[static_cast<std::uint64_t>(c) * D], total);
  }
  static_cast<T*>(p.out)[row * D + threadIdx.x] =
      from_float<T>(weights > 0.0f ? total / weights : 0.0f);
}

}  // namespace kvvm::kernels
