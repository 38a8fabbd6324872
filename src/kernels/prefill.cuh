// Causal prefill attention over a KvView: a tiled flash-attention (online softmax over key
// tiles) on the CUDA cores, correct first; its speed is recorded in docs/PERFORMANCE.md.
//
// Why this shape: a block takes 64 query rows that share one KV head: kQ = 64 / G query
// positions times the G query heads of a group tile, so every K and V tile it stages in shared
// memory serves the whole group. 256 threads; thread (ty, tx) owns rows 4ty..4ty+3 and, for
// scores, key columns tx + 16c; for the output, dims tx + 16c. Rows of one thread group of 16
// lanes form half a warp, so row reductions are four xor-shuffles.
//
// Causality and length: the block reads keys [0, start + last query position of the block]
// only; a key past a row's own position is masked to -inf (and never loaded past the block's
// last position), and rows past the chunk are neither computed into nor written.
#pragma once

#include <cstdint>

#include "kernels/common.cuh"
#include "kvvm/attention.h"

namespace kvvm::kernels {

constexpr std::uint32_t kPrefillThreads = 256;
constexpr std::uint32_t kPrefillRows = 64;  // query rows (position x head) per block
constexpr std::uint32_t kPrefillKeys = 64;  // keys per tile

// The caller's parameters as given, and what the launcher derives from them.
struct PrefillKernelParams : PrefillParams {
  explicit PrefillKernelParams(const PrefillParams& params) : PrefillParams(params) {}
  std::uint32_t group = 0;
  std::uint32_t group_tiles = 0;
  float scale_log2 = 0;
};

template <std::uint32_t D>
__host__ __device__ constexpr std::uint32_t prefill_shared_bytes() {
  // Qt[D][64], Kt[D][64 + 1], V[64][D], Pt[64][64 + 4] floats.
  return (D * kPrefillRows + D * (kPrefillKeys + 1) + kPrefillKeys * D +
          kPrefillKeys * (kPrefillRows + 4)) *
         4;
}

template <typename T, std::uint32_t D, std::uint32_t G>
__global__ void __launch_bounds__(kPrefillThreads) prefill_kernel(const PrefillKernelParams p) {
  constexpr std::uint32_t kQ = kPrefillRows / G;  // query positions per block
  constexpr std::uint32_t kKeyPitch = kPrefillKeys + 1;
  constexpr std::uint32_t kPPitch = kPrefillRows + 4;
  constexpr std::uint32_t kCols = D / 16;  // output dims per thread

  extern __shared__ float4 shared_raw[];
  float* q_t = reinterpret_cast<float*>(shared_raw);  // [D][64]
  float* k_t = q_t + D * kPrefillRows;                // [D][65]
  float* v_s = k_t + D * kKeyPitch;                   // [64][D]
  float* p_t = v_s + kPrefillKeys * D;                // [64 keys][68]

  const std::uint32_t kv_head = blockIdx.y / p.group_tiles;
  const std::uint32_t tile = blockIdx.y % p.group_tiles;
  const std::uint32_t heads_here = min(G, p.group - tile * G);
  const std::uint32_t q_first = blockIdx.x * kQ;  // first query row of the chunk
  const std::uint32_t q_count = min(kQ, p.tokens - q_first);
  const std::uint32_t tid = threadIdx.x;
  const std::uint32_t tx = tid % 16, ty = tid / 16;

  // Stage q (pre-scaled) transposed: row r = query (r / G), head (r % G).
  for (std::uint32_t i = tid; i < kPrefillRows * (D / 8); i += kPrefillThreads) {
    const std::uint32_t r = i / (D / 8), part = i % (D / 8);
    const std::uint32_t qi = r / G, j = r % G;
    float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (qi < q_count && j < heads_here) {
      const std::uint64_t q_row =
          static_cast<std::uint64_t>(q_first + qi) * p.qo_heads + kv_head * p.group + tile * G + j;
      vec_to_float<T>(
          load_vec(reinterpret_cast<const unsigned char*>(static_cast<const T*>(p.q) + q_row * D) +
                   part * 16),
          f);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) q_t[(part * 8 + e) * kPrefillRows + r] = f[e] * p.scale_log2;
  }

  float o[4][kCols];
  float m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = kNegInf;
    l[i] = 0.0f;
#pragma unroll
    for (std::uint32_t c = 0; c < kCols; ++c) o[i][c] = 0.0f;
  }
  // Query position of each of my rows (rows past the chunk get none: masked everywhere).
  std::uint32_t my_pos[4];
  bool my_valid[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::uint32_t r = ty * 4 + i;
    my_valid[i] = r / G < q_count && r % G < heads_here;
    my_pos[i] = p.start + q_first + r / G;
  }

  const KvView& v = p.view;
  const unsigned char* k_base = reinterpret_cast<const unsigned char*>(v.base) +
                                p.slot * v.slot_stride + p.layer * v.layer_stride +
                                kv_head * v.head_stride;
  const unsigned char* v_base = k_base + v.kv_stride;
  const std::uint32_t key_end = p.start + q_first + q_count;  // keys [0, key_end)

  for (std::uint32_t key0 = 0; key0 < key_end; key0 += kPrefillKeys) {
    __syncthreads();  // the previous tile's readers are done
    for (std::uint32_t i = tid; i < kPrefillKeys * (D / 8); i += kPrefillThreads) {
      const std::uint32_t t = i / (D / 8), part = i % (D / 8);
      float kf[8] = {0, 0, 0, 0, 0, 0, 0, 0}, vf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (key0 + t < key_end) {
        const std::uint64_t offset = (key0 + t) * v.token_stride + part * 16;
        vec_to_float<T>(load_vec(k_base + offset), kf);
        vec_to_float<T>(load_vec(v_base + offset), vf);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        k_t[(part * 8 + e) * kKeyPitch + t] = kf[e];
        v_s[t * D + part * 8 + e] = vf[e];
      }
    }
    __syncthreads();

    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int c = 0; c < 4; ++c) s[i][c] = 0.0f;
    }
    for (std::uint32_t dd = 0; dd < D; ++dd) {
      const float4 qv = *reinterpret_cast<const float4*>(&q_t[dd * kPrefillRows + ty * 4]);
      float kv[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) kv[c] = k_t[dd * kKeyPitch + tx + 16 * c];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[0][c] = fmaf(qv.x, kv[c], s[0][c]);
        s[1][c] = fmaf(qv.y, kv[c], s[1][c]);
        s[2][c] = fmaf(qv.z, kv[c], s[2][c]);
        s[3][c] = fmaf(qv.w, kv[c], s[3][c]);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float tile_max = kNegInf;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const std::uint32_t key = key0 + tx + 16 * c;
        if (!my_valid[i] || key > my_pos[i]) s[i][c] = kNegInf;
        tile_max = fmaxf(tile_max, s[i][c]);
      }
#pragma unroll
      for (std::uint32_t offset = 8; offset > 0; offset /= 2) {
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
      }
      const float new_max = fmaxf(m[i], tile_max);
      const float correction = new_max == kNegInf ? 1.0f : exp2f(m[i] - new_max);
      float added = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float w = s[i][c] == kNegInf ? 0.0f : exp2f(s[i][c] - new_max);
        p_t[(tx + 16 * c) * kPPitch + ty * 4 + i] = w;
        added += w;
      }
#pragma unroll
      for (std::uint32_t offset = 8; offset > 0; offset /= 2) {
        added += __shfl_xor_sync(0xffffffffu, added, offset);
      }
      m[i] = new_max;
      l[i] = l[i] * correction + added;
#pragma unroll
      for (std::uint32_t c = 0; c < kCols; ++c) o[i][c] *= correction;
    }
    __syncthreads();
    for (std::uint32_t t = 0; t < kPrefillKeys; ++t) {
      const float4 w = *reinterpret_cast<const float4*>(&p_t[t * kPPitch + ty * 4]);
#pragma unroll
      for (std::uint32_t c = 0; c < kCols; ++c) {
        const float vv = v_s[t * D + tx + 16 * c];
        o[0][c] = fmaf(w.x, vv, o[0][c]);
        o[1][c] = fmaf(w.y, vv, o[1][c]);
        o[2][c] = fmaf(w.z, vv, o[2][c]);
        o[3][c] = fmaf(w.w, vv, o[3][c]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (!my_valid[i]) continue;
    const std::uint32_t r = ty * 4 + i;
    const std::uint64_t out_row = static_cast<std::uint64_t>(q_first + r / G) * p.qo_heads +
                                  kv_head * p.group + tile * G + r % G;
    const float inverse = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
    for (std::uint32_t c = 0; c < kCols; ++c) {
      static_cast<T*>(p.out)[out_row * D + tx + 16 * c] = from_float<T>(o[i][c] * inverse);
    }
  }
}

}  // namespace kvvm::kernels
