// The decode kernel's shape, parameters and places (where a block and a lane sit), shared by
// its tile phases (decode.cuh) and its merges (decode_merge.cuh); the kernel's design is in
// decode.cuh.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/bulk_copy.cuh"
#include "kernels/common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/mma.cuh"
#include "kvvm/kernels/attention.h"

namespace kvvm::kernels {

constexpr std::uint32_t kDecodeHeads = 8;  // query heads of one group tile (the MMA's N)

// The caller's parameters (chunk_tokens replaced by the planned one), and what the launcher
// derives from them.
struct DecodeKernelParams : DecodeParams {
  explicit DecodeKernelParams(const DecodeParams& params) : DecodeParams(params) {}
  std::uint32_t group = 0;        // qo_heads / kv_heads
  std::uint32_t group_tiles = 0;  // ceil(group / kDecodeHeads)
  float scale_log2 = 0;           // sm_scale * log2(e)
  std::uint32_t chunks = 0;
  float* partial_out = nullptr;       // [batch][qo_heads][chunks][D] when chunks > 1
  float* partial_lse = nullptr;       // [batch][qo_heads][chunks]
  std::uint32_t* counters = nullptr;  // one per (sequence, KV head, tile), counted backwards
                                      // from the workspace's end; zero between calls
};

// Head dim, bytes per cached element (2, or 1 for e4m3), warps per block, bytes of one warp's
// stage (K and V of kTile keys) and stages. The defaults are the measured best
// (docs/PERFORMANCE.md, "Decode: bulk row copies"): at D = 128 eight warps, one block per SM
// (fewer, longer chunks); at D = 64 four warps, two blocks per SM, so a batch of short
// sequences (many blocks of little work) fits one wave. An e4m3 stage holds as many keys as a
// 16-bit one, in half the bytes (twice the keys measured no faster: docs/PERFORMANCE.md, "fp8
// KV cache").
template <std::uint32_t D, std::uint32_t ElementBytes = 2, std::uint32_t Warps = (D >= 128 ? 8 : 4),
          std::uint32_t StageBytes = 4096 * ElementBytes, std::uint32_t Stages = 3>
struct DecodeShape {
  static constexpr std::uint32_t kHeadDim = D;
  static constexpr bool kFp8 = ElementBytes == 1;
  static constexpr std::uint32_t kWarps = Warps;
  static constexpr std::uint32_t kThreads = 32 * Warps;
  static constexpr std::uint32_t kStages = Stages;
  static constexpr std::uint32_t kRowBytes = D * ElementBytes;  // one key's K (or V) row
  static constexpr std::uint32_t kChunks = kRowBytes / 16;      // 16-byte chunks per row
  // A row in shared memory: padded by 16 bytes (16-bit), or unpadded and swizzled (e4m3).
  static constexpr std::uint32_t kPitch = kFp8 ? kRowBytes : kRowBytes + 16;
  static constexpr std::uint32_t kTile = StageBytes / 2 / kRowBytes;  // keys per stage
  static constexpr std::uint32_t kHalf = kTile * kPitch;              // K tile, then V tile
  static constexpr std::uint32_t kStagePitch = 2 * kHalf;
  static constexpr std::uint32_t kStep = kTile * Warps;  // keys per block per round
  static constexpr std::uint32_t kKTiles = kTile / 8;    // n8 tiles of scores
  static constexpr std::uint32_t kSharedBytes = Warps * Stages * kStagePitch;
  static constexpr std::uint32_t kOutPitch = D + 4;  // floats; spreads heads over banks
  // Bulk row copies where they measured faster (rows of 256 bytes, not 128; an e4m3 tile is
  // swizzled, which a bulk copy cannot write).
  static constexpr bool kBulkRows = !kFp8 && kRowBytes >= 256;
  // Float4 outputs of one block's group tile per thread, for the merge.
  static constexpr std::uint32_t kMergeVectors = (kDecodeHeads * D / 4 + kThreads - 1) / kThreads;
  static_assert(kTile % 16 == 0, "a stage holds whole k16 steps of P V");
  static_assert(!kFp8 || kHalf % 128 == 0, "an e4m3 tile is whole 128-byte lines");
  static_assert(Warps * kDecodeHeads * kOutPitch * 4 <= kSharedBytes,
                "the warps' outputs reuse the stage memory");
};

// Byte offset of (row, 16-byte chunk) in a stage's K or V tile: rows padded by 16 bytes, so
// the eight rows of an ldmatrix start in eight different bank groups.
template <typename Shape>
__device__ __forceinline__ std::uint32_t decode_tile_offset(std::uint32_t row,
                                                            std::uint32_t chunk) {
  return row * Shape::kPitch + (chunk << 4);
}

// Byte offset of byte `byte` of row `row` in an e4m3 stage's K or V tile: 32-byte units
// numbered row-major, four to a 128-byte line, the unit's place in its line XORed with
// (line % 4) ^ ((line / 4) % 2). Then the 8-byte K loads of a half-warp (4 rows x 4 quads) and
// the 4-byte V loads of a warp (rows 2 quad + e, 8 dims groups) each touch 32 distinct banks,
// at D = 64 (two rows a line) and D = 128 alike.
template <typename Shape>
__device__ __forceinline__ std::uint32_t fp8_tile_offset(std::uint32_t row, std::uint32_t byte) {
  const std::uint32_t unit = row * (Shape::kRowBytes / 32) + byte / 32;
  const std::uint32_t line = unit / 4;
  const std::uint32_t place = (unit % 4) ^ ((line % 4) ^ ((line / 4) % 2));
  return line * 128 + place * 32 + byte % 32;
}

// A pair of activations rounded to fp16, saturating (the e4m3 path's products run in fp16).
template <typename T>
__device__ __forceinline__ std::uint32_t half2_saturated(T lo, T hi) {
  constexpr float kMax = 65504.0f;
  const float a = fminf(fmaxf(static_cast<float>(lo), -kMax), kMax);
  const float b = fminf(fmaxf(static_cast<float>(hi), -kMax), kMax);
  return pack_float2<__half>(a, b);
}

// O^T's row `half` (0: group_row, 1: group_row + 8) of m16 tile mt as a head dim: the identity
// for a 16-bit cache, the e4m3 path's permutation (dims 4 group_row..+3 of 32-dim block mt / 2)
// otherwise.
template <bool kFp8>
__device__ __forceinline__ std::uint32_t output_dim(std::uint32_t mt, std::uint32_t group_row,
                                                    std::uint32_t half) {
  if constexpr (kFp8) return 32 * (mt / 2) + 4 * group_row + 2 * (mt % 2) + half;
  return 16 * mt + group_row + 8 * half;
}

// Where a block and a lane sit: the block's (chunk, KV head, group tile, sequence) and its
// query heads, the lane's warp and MMA fragment place.
struct DecodePlace {
  std::uint32_t chunk;
  std::uint32_t kv_head;
  std::uint32_t tile;
  std::uint32_t b;
  std::uint32_t warp;
  std::uint32_t lane;
  std::uint32_t group_row;  // MMA fragment row / column group
  std::uint32_t quad;
  std::uint32_t first_head;
  std::uint32_t heads_here;
};

__device__ __forceinline__ DecodePlace decode_place(const DecodeKernelParams& p) {
  DecodePlace at;
  at.chunk = blockIdx.x;
  at.kv_head = blockIdx.y / p.group_tiles;
  at.tile = blockIdx.y % p.group_tiles;
  at.b = blockIdx.z;
  at.warp = threadIdx.x / 32;
  at.lane = threadIdx.x % 32;
  at.group_row = at.lane / 4;
  at.quad = at.lane % 4;
  at.first_head = at.kv_head * p.group + at.tile * kDecodeHeads;
  at.heads_here = min(kDecodeHeads, p.group - at.tile * kDecodeHeads);
  return at;
}

template <std::uint32_t N>
__device__ __forceinline__ void clear_fragments(float (&x)[N][4]) {
#pragma unroll
  for (std::uint32_t i = 0; i < N; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) x[i][e] = 0.0f;
  }
}

}  // namespace kvvm::kernels
