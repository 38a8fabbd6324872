// Split-K decode attention over a KvView on the tensor cores, with the split's merge fused
// into the kernel.
//
// Why this shape (the arithmetic is also in docs/ARCHITECTURE.md, "Kernels", Decode):
//   - Decode reads every K and V byte once and does little arithmetic per byte, so the kernel
//     must keep the memory system full and spend few instructions per token. The dot products
//     are mma.m16n8k16: one instruction does a 16x8x16 tile, so a 16-key step of a D = 128
//     head costs 24 MMAs and 16 ldmatrix for the warp (~4 instructions per token), and the
//     thread holds ~110-130 registers.
//   - S = Q K^T with the query heads of a group tile as the M rows (up to 8 of 16 used; the
//     other rows of the A operand are zero registers), keys as N, head dims as K. The scores'
//     C fragment (head = lane / 4, keys 2 (lane % 4) ..+1) is exactly the B operand of
//     O^T = V^T P^T (keys as K, heads as N), so P goes to the second product without shared
//     memory, and O^T's accumulator holds D x 8 floats: 32 per thread for D = 128.
//   - One block per (chunk of the sequence, KV head, group tile of <= 8 heads, sequence): eight
//     warps and one block per SM at D = 128, four warps and two blocks per SM at D = 64. Each
//     warp streams its own tiles (every 8th, or 4th, tile of the chunk) through a private
//     3-stage pipeline (16 keys of K and V per stage at D = 128, 32 at D = 64), so the loop
//     has no block barrier.
//   - The copies: at D = 128 on sm_90, one bulk copy (cp.async.bulk, the copy engine) per head
//     row of K or V, counted in on a per-stage mbarrier, L2 evict-first; otherwise 16-byte
//     cp.async with the L2::128B prefetch hint. Measured (docs/PERFORMANCE.md, "Decode: bulk
//     row copies"): bulk rows reach 4.0-4.1 TB/s where 16-byte copies reach 3.6-3.7 at
//     D = 128; at D = 64 (128-byte rows) they lose, so that size keeps cp.async.
//   - Shared-memory rows are padded by 16 bytes (a bulk copy writes a row as it is, so the
//     tile cannot be swizzled): ldmatrix's eight rows then start in eight different bank
//     groups, with no conflict.
//   - A key at or beyond min(length, max_length) is never loaded: its copy reads the chunk's
//     first key instead (live, so unmapped windows and an earlier occupant's bytes, NaN
//     included, are never touched; cp.async zero-fills instead), and its score is set to -inf,
//     so its V row weighs exactly 0. Scores are in the log2 domain (scaled by
//     sm_scale * log2 e after the fp32 product); every online-softmax rescale guards
//     m == -inf, so a warp, block or chunk that saw no key contributes nothing and never
//     makes a NaN.
//   - Split over the sequence (chunks > 1): each block writes its normalized partial output
//     and log2-sum-exp to the workspace, then counts itself done on a counter of its
//     (sequence, KV head, tile); the last block of the group merges all partials, loading
//     every chunk's partial and log2-sum-exp before using any (one round trip to L2 for up
//     to 16 chunks), and sets the counter back to zero. No second launch. Only the chunks
//     that hold a key of the sequence take part (the plan is for max_length, a graph's bound;
//     the lengths are read on the device): the others exit at once, and a sequence within
//     one chunk writes its output directly, with no partial, counter or merge (a batch-1
//     step at a short context skips a fence, an atomic and an L2 round trip a layer).
//   - An fp8 (e4m3) cache: the stage holds the same keys in half the bytes, copied by 16-byte
//     cp.async (rows are 64 / 128 bytes, where bulk rows lost) into an unpadded tile whose
//     32-byte units are XOR-swizzled per 128-byte line (fp8_tile_offset), and the operands
//     are built in registers, each e4m3 pair widened to fp16 by one instruction (fp8.cuh):
//     the products run in fp16 with fp32 accumulation, Q rounded to fp16 (saturating) once.
//     K: a lane loads 8 bytes (dims 8 quad..+7 of a 32-dim block) of its key and feeds two
//     k16 steps; the dims are a permutation of the head dims, the same for Q (loaded in that
//     order), so every dot product is the same sum. V: ldmatrix.trans has no 8-bit form, so
//     a lane loads 4 bytes (4 dims) of each of its 4 keys and pairs keys with byte permutes;
//     O^T's rows are then a permutation of the dims, undone when the outputs are written.
//     The swizzle makes both access patterns free of bank conflicts. The K scale is folded
//     into the softmax scale and the V scale into the output, so no element is rescaled.
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

// Q as the A operand, rows = heads: registers 1 and 3 (rows 8..15) stay zero, so they are not
// held. A lane past the tile's heads holds zeros.
template <typename T, typename Shape>
__device__ __forceinline__ void load_query_fragments(const DecodeKernelParams& p,
                                                     const DecodePlace& at,
                                                     std::uint32_t (&qa)[Shape::kHeadDim / 16][2]) {
  constexpr std::uint32_t D = Shape::kHeadDim;
  const bool live = at.group_row < at.heads_here;
  const T* q = static_cast<const T*>(p.q);
  const std::uint64_t row =
      static_cast<std::uint64_t>(at.b) * p.qo_heads + at.first_head + (live ? at.group_row : 0);
  const T* q_row = q + row * D;
  if constexpr (Shape::kFp8) {
    // Dims 32 kk + 8 quad ..+7 feed k16 steps 2 kk and 2 kk + 1, as the K loads of
    // score_key_tile.
#pragma unroll
    for (std::uint32_t kk = 0; kk < D / 32; ++kk) {
      uint4 raw = make_uint4(0u, 0u, 0u, 0u);
      if (live)
        raw = load_previous_output(reinterpret_cast<const uint4*>(q_row + 32 * kk + 8 * at.quad));
      const T* e = reinterpret_cast<const T*>(&raw);
      qa[2 * kk][0] = half2_saturated(e[0], e[1]);
      qa[2 * kk][1] = half2_saturated(e[2], e[3]);
      qa[2 * kk + 1][0] = half2_saturated(e[4], e[5]);
      qa[2 * kk + 1][1] = half2_saturated(e[6], e[7]);
    }
  } else {
#pragma unroll
    for (std::uint32_t ks = 0; ks < D / 16; ++ks) {
      const std::uint32_t* pair =
          reinterpret_cast<const std::uint32_t*>(q_row + ks * 16 + 2 * at.quad);
      qa[ks][0] = live ? load_previous_output(pair) : 0u;
      qa[ks][1] = live ? load_previous_output(pair + 4) : 0u;  // 8 elements further
    }
  }
}

// A warp's private pipeline: the keys [begin, end) of its block's chunk in the cache (K rows
// from k_base, V rows kv_stride further), its tiles of them, and its stages and their mbarriers
// in shared memory. The warp's tile i (keys from decode_tile_key) goes to stage i % kStages.
struct DecodeWarpStream {
  const unsigned char* k_base;
  std::uint64_t kv_stride;
  std::uint64_t token_stride;
  std::uint32_t tiles;  // this warp's: w, w + W, ... (W warps) of ceil((end - begin) / kTile)
  unsigned char* stages;
  std::uint32_t barriers;  // shared address of the first of kStages mbarriers, 8 bytes each
  std::uint32_t begin;
  std::uint32_t end;  // <= begin: empty chunk
  std::uint32_t warp;
  std::uint32_t lane;
};

template <typename Shape>
__device__ __forceinline__ DecodeWarpStream decode_warp_stream(
    const DecodeKernelParams& p, const DecodePlace& at, std::uint32_t begin, std::uint32_t end,
    uint4* shared_raw, std::uint64_t (&s_barriers)[Shape::kWarps][Shape::kStages]) {
  const KvView& v = p.view;
  DecodeWarpStream w;
  w.k_base = reinterpret_cast<const unsigned char*>(v.base) + p.slots[at.b] * v.slot_stride +
             p.layer * v.layer_stride + at.kv_head * v.head_stride;
  w.kv_stride = v.kv_stride;
  w.token_stride = v.token_stride;
  const std::uint32_t tiles = end > begin ? (end - begin + Shape::kTile - 1) / Shape::kTile : 0;
  w.tiles = tiles > at.warp ? (tiles - at.warp + Shape::kWarps - 1) / Shape::kWarps : 0;
  w.stages =
      reinterpret_cast<unsigned char*>(shared_raw) + at.warp * Shape::kStages * Shape::kStagePitch;
  w.barriers = shared_address(&s_barriers[at.warp][0]);
  w.begin = begin;
  w.end = end;
  w.warp = at.warp;
  w.lane = at.lane;
  return w;
}

// One mbarrier per stage, for the bulk copies to count their bytes in.
template <typename Shape>
__device__ __forceinline__ void init_stage_barriers(const DecodeWarpStream& w) {
  if (w.lane < Shape::kStages) mbarrier_init(w.barriers + 8 * w.lane);
  mbarrier_init_fence();
  __syncwarp();
}

template <typename Shape>
__device__ __forceinline__ unsigned char* decode_stage(const DecodeWarpStream& w, std::uint32_t i) {
  return w.stages + (i % Shape::kStages) * Shape::kStagePitch;
}

// The first key of the warp's tile i: tiles w, w + W, ... (W warps) of the chunk.
template <typename Shape>
__device__ __forceinline__ std::uint32_t decode_tile_key(const DecodeWarpStream& w,
                                                         std::uint32_t i) {
  return w.begin + (w.warp + i * Shape::kWarps) * Shape::kTile;
}

// Starts the copies of the warp's tile i (K, then V) into its stage.
template <typename Shape, bool kBulk>
__device__ __forceinline__ void issue_key_tile(const DecodeWarpStream& w, std::uint32_t i) {
  constexpr std::uint32_t kTile = Shape::kTile;
  constexpr std::uint32_t kChunks = Shape::kChunks;
  constexpr std::uint32_t kCopies = kTile * kChunks / 32;  // 16-byte copies per lane, K or V
  unsigned char* stage = decode_stage<Shape>(w, i);
  const std::uint32_t key0 = decode_tile_key<Shape>(w, i);
  if constexpr (kBulk) {
    // One row per copy: lane l copies rows l, l + 32, ... of the stage's K rows then V rows.
    const std::uint32_t barrier = w.barriers + 8 * (i % Shape::kStages);
    if (w.lane == 0) mbarrier_arrive_expect(barrier, 2 * kTile * Shape::kRowBytes);
    __syncwarp();  // the bytes are announced before any copy can count them in
#pragma unroll
    for (std::uint32_t c = 0; c < 2 * kTile / 32; ++c) {
      const std::uint32_t flat = c * 32 + w.lane;
      const std::uint32_t row = flat % kTile, kv = flat / kTile;
      const std::uint32_t key = key0 + row < w.end ? key0 + row : w.begin;
      bulk_copy_evict_first(
          shared_address(stage + kv * Shape::kHalf + decode_tile_offset<Shape>(row, 0)),
          w.k_base + static_cast<std::uint64_t>(key) * w.token_stride + kv * w.kv_stride,
          Shape::kRowBytes, barrier);
    }
  } else {
#pragma unroll
    for (std::uint32_t c = 0; c < kCopies; ++c) {
      const std::uint32_t flat = c * 32 + w.lane;
      const std::uint32_t row = flat / kChunks, part = flat % kChunks;
      const bool live = key0 + row < w.end;
      const unsigned char* source =
          w.k_base + static_cast<std::uint64_t>(live ? key0 + row : w.begin) * w.token_stride +
          part * 16;
      const std::uint32_t offset = Shape::kFp8 ? fp8_tile_offset<Shape>(row, part * 16)
                                               : decode_tile_offset<Shape>(row, part);
      copy_async_16<128>(stage + offset, source, live);
      copy_async_16<128>(stage + Shape::kHalf + offset, source + w.kv_stride, live);
    }
  }
}

// Waits until the warp's tile i has landed in its stage.
template <typename Shape, bool kBulk>
__device__ __forceinline__ void wait_for_key_tile(const DecodeWarpStream& w, std::uint32_t i) {
  if constexpr (kBulk) {
    mbarrier_wait(w.barriers + 8 * (i % Shape::kStages), (i / Shape::kStages) & 1);
  } else {
    copy_async_wait<Shape::kStages - 1>();
    __syncwarp();  // every lane's copies of this stage are visible to the whole warp
  }
}

// Scores of a stage's kTile keys (unscaled): n8 tile j holds keys 8 j + 2 quad, +1 for head
// group_row.
template <typename Shape, typename M>
__device__ __forceinline__ void score_key_tile(const unsigned char* stage, std::uint32_t k_tile,
                                               const std::uint32_t (&qa)[Shape::kHeadDim / 16][2],
                                               const DecodePlace& at,
                                               float (&s)[Shape::kKTiles][4]) {
  constexpr std::uint32_t D = Shape::kHeadDim;
  clear_fragments(s);
#pragma unroll
  for (std::uint32_t kk = 0; kk < D / 32; ++kk) {  // two k16 steps per ldmatrix.x4
#pragma unroll
    for (std::uint32_t j = 0; j < Shape::kKTiles; ++j) {
      const std::uint32_t a0[4] = {qa[2 * kk][0], 0u, qa[2 * kk][1], 0u};
      const std::uint32_t a1[4] = {qa[2 * kk + 1][0], 0u, qa[2 * kk + 1][1], 0u};
      std::uint32_t b0[2], b1[2];
      if constexpr (Shape::kFp8) {
        // Key 8 j + group_row, dims 32 kk + 8 quad ..+7: bytes 0-1 / 2-3 are step 2 kk's
        // rows 2 quad.. / 2 quad + 8.., bytes 4-7 step 2 kk + 1's.
        const uint2 w = *reinterpret_cast<const uint2*>(
            stage + fp8_tile_offset<Shape>(8 * j + at.group_row, 32 * kk + 8 * at.quad));
        e4m3x4_to_half2x2(w.x, b0[0], b0[1]);
        e4m3x4_to_half2x2(w.y, b1[0], b1[1]);
      } else {
        // Matrix i = lanes 8i..8i+7: keys 8 j + (lane % 8), chunk 4 kk + i.
        std::uint32_t kb[4];
        ldmatrix_x4(kb,
                    k_tile + decode_tile_offset<Shape>(8 * j + at.lane % 8, 4 * kk + at.lane / 8));
        b0[0] = kb[0];
        b0[1] = kb[1];
        b1[0] = kb[2];
        b1[1] = kb[3];
      }
      mma_m16n8k16<M>(s[j], a0, b0);
      mma_m16n8k16<M>(s[j], a1, b1);
    }
  }
}

// Online softmax of head group_row over a tile of scores (the quad's four lanes share it): keys
// from key0 at or past `end` masked, the running max m and this lane's share l of the sum moved
// on, and the weights packed as P^T, the B operand of P V, one pair per k16 step. Returns the
// factor O^T's column of this head takes.
template <typename Shape, typename M>
__device__ __forceinline__ float softmax_key_tile(float (&s)[Shape::kKTiles][4], std::uint32_t key0,
                                                  std::uint32_t end, float score_scale,
                                                  std::uint32_t quad, float& m, float& l,
                                                  std::uint32_t (&pb)[Shape::kKTiles / 2][2]) {
  float tile_max = kNegInf;
#pragma unroll
  for (std::uint32_t j = 0; j < Shape::kKTiles; ++j) {
#pragma unroll
    for (std::uint32_t e = 0; e < 2; ++e) {
      const bool valid = key0 + 8 * j + 2 * quad + e < end;
      s[j][e] = valid ? s[j][e] * score_scale : kNegInf;
      tile_max = fmaxf(tile_max, s[j][e]);
    }
  }
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
  const float new_max = fmaxf(m, tile_max);
  // new_max == -inf: no valid key so far for this head; nothing to add or rescale.
  const float correction = new_max == kNegInf ? 1.0f : exp2f(m - new_max);
  float added = 0.0f;
#pragma unroll
  for (std::uint32_t j = 0; j < Shape::kKTiles; ++j) {
    const float w0 = s[j][0] == kNegInf ? 0.0f : exp2f(s[j][0] - new_max);
    const float w1 = s[j][1] == kNegInf ? 0.0f : exp2f(s[j][1] - new_max);
    added += w0 + w1;
    pb[j / 2][j % 2] = pack_float2<M>(w0, w1);
  }
  m = new_max;
  l = l * correction + added;
  return correction;
}

// O^T's columns are heads 2 quad and 2 quad + 1: their corrections live in lanes 8 quad and
// 8 quad + 4 (group rows 2 quad, 2 quad + 1).
template <std::uint32_t D>
__device__ __forceinline__ void rescale_output(float (&o)[D / 16][4], float correction,
                                               std::uint32_t quad) {
  const float correction0 = __shfl_sync(0xffffffffu, correction, 8 * quad);
  const float correction1 = __shfl_sync(0xffffffffu, correction, 8 * quad + 4);
#pragma unroll
  for (std::uint32_t mt = 0; mt < D / 16; ++mt) {
    o[mt][0] *= correction0;
    o[mt][1] *= correction1;
    o[mt][2] *= correction0;
    o[mt][3] *= correction1;
  }
}

// O^T += V^T P^T: A = V^T (dims x keys) by ldmatrix.trans of V's [key][dim] rows (an e4m3
// stage: built in registers).
template <typename Shape, typename M>
__device__ __forceinline__ void accumulate_values(const unsigned char* stage, std::uint32_t v_tile,
                                                  const std::uint32_t (&pb)[Shape::kKTiles / 2][2],
                                                  const DecodePlace& at,
                                                  float (&o)[Shape::kHeadDim / 16][4]) {
  constexpr std::uint32_t D = Shape::kHeadDim;
#pragma unroll
  for (std::uint32_t ks = 0; ks < Shape::kTile / 16; ++ks) {
    if constexpr (Shape::kFp8) {
      // Keys 16 ks + 2 quad (+1, +8, +9), dims 32 blk + 4 group_row ..+3: byte permutes pair
      // the keys of one dim; dims +0 / +1 are rows group_row / + 8 of tile 2 blk, +2 / +3
      // those of tile 2 blk + 1 (output_dim).
      const unsigned char* v_stage = stage + Shape::kHalf;
      const std::uint32_t key = 16 * ks + 2 * at.quad;
#pragma unroll
      for (std::uint32_t blk = 0; blk < D / 32; ++blk) {
        const std::uint32_t byte = 32 * blk + 4 * at.group_row;
        const std::uint32_t w0 =
            *reinterpret_cast<const std::uint32_t*>(v_stage + fp8_tile_offset<Shape>(key, byte));
        const std::uint32_t w1 = *reinterpret_cast<const std::uint32_t*>(
            v_stage + fp8_tile_offset<Shape>(key + 1, byte));
        const std::uint32_t w8 = *reinterpret_cast<const std::uint32_t*>(
            v_stage + fp8_tile_offset<Shape>(key + 8, byte));
        const std::uint32_t w9 = *reinterpret_cast<const std::uint32_t*>(
            v_stage + fp8_tile_offset<Shape>(key + 9, byte));
        std::uint32_t low[4], high[4];
        e4m3x4_to_half2x2(byte_perm(w0, w1, 0x5140u), low[0], low[1]);
        e4m3x4_to_half2x2(byte_perm(w8, w9, 0x5140u), low[2], low[3]);
        e4m3x4_to_half2x2(byte_perm(w0, w1, 0x7362u), high[0], high[1]);
        e4m3x4_to_half2x2(byte_perm(w8, w9, 0x7362u), high[2], high[3]);
        mma_m16n8k16<M>(o[2 * blk], low, pb[ks]);
        mma_m16n8k16<M>(o[2 * blk + 1], high, pb[ks]);
      }
    } else {
#pragma unroll
      for (std::uint32_t mt = 0; mt < D / 16; ++mt) {
        // Matrix i: keys 16 ks + 8 (i / 2) + (lane % 8), chunk 2 mt + i % 2.
        const std::uint32_t matrix = at.lane / 8;
        std::uint32_t va[4];
        ldmatrix_x4_trans(
            va, v_tile + decode_tile_offset<Shape>(16 * ks + 8 * (matrix / 2) + at.lane % 8,
                                                   2 * mt + matrix % 2));
        mma_m16n8k16<M>(o[mt], va, pb[ks]);
      }
    }
  }
}

// The warp's max and sum of each head for the block's merge of its warps (the quad's four
// lanes each hold a share of the sum).
template <typename Shape>
__device__ __forceinline__ void publish_warp_softmax(float m, float l, const DecodePlace& at,
                                                     float (&s_max)[Shape::kWarps][kDecodeHeads],
                                                     float (&s_sum)[Shape::kWarps][kDecodeHeads]) {
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (at.quad == 0) {
    s_max[at.warp][at.group_row] = m;
    s_sum[at.warp][at.group_row] = l;
  }
}

// The warp's O^T, weighed against the block's max of each head, as its [head][kOutPitch] floats
// of s_out ([warp][head][kOutPitch]; dims in head order).
template <typename Shape>
__device__ __forceinline__ void stage_warp_output(const float (&o)[Shape::kHeadDim / 16][4],
                                                  const DecodePlace& at,
                                                  const float (&s_max)[Shape::kWarps][kDecodeHeads],
                                                  float* s_out) {
  float factor[2];
#pragma unroll
  for (std::uint32_t h = 0; h < 2; ++h) {
    const std::uint32_t head = 2 * at.quad + h;
    float block_max = kNegInf;
#pragma unroll
    for (std::uint32_t w = 0; w < Shape::kWarps; ++w) block_max = fmaxf(block_max, s_max[w][head]);
    const float own = s_max[at.warp][head];
    factor[h] = own == kNegInf ? 0.0f : exp2f(own - block_max);
  }
  float* mine = s_out + at.warp * kDecodeHeads * Shape::kOutPitch;
#pragma unroll
  for (std::uint32_t mt = 0; mt < Shape::kHeadDim / 16; ++mt) {
    const std::uint32_t dim = output_dim<Shape::kFp8>(mt, at.group_row, 0);
    const std::uint32_t dim8 = output_dim<Shape::kFp8>(mt, at.group_row, 1);
    mine[(2 * at.quad) * Shape::kOutPitch + dim] = o[mt][0] * factor[0];
    mine[(2 * at.quad + 1) * Shape::kOutPitch + dim] = o[mt][1] * factor[1];
    mine[(2 * at.quad) * Shape::kOutPitch + dim8] = o[mt][2] * factor[0];
    mine[(2 * at.quad + 1) * Shape::kOutPitch + dim8] = o[mt][3] * factor[1];
  }
}

// The block's output: the warps' staged outputs summed and normalized, written as the
// sequence's output when its chunk is alone, else as the chunk's partial and log2-sum-exp.
template <typename T, typename Shape>
__device__ __forceinline__ void write_block_output(
    const DecodeKernelParams& p, const DecodePlace& at, std::uint64_t row_base, bool alone,
    float v_scale, const float (&s_max)[Shape::kWarps][kDecodeHeads],
    const float (&s_sum)[Shape::kWarps][kDecodeHeads], const float* s_out) {
  constexpr std::uint32_t D = Shape::kHeadDim;
  for (std::uint32_t index = threadIdx.x; index < kDecodeHeads * D; index += Shape::kThreads) {
    const std::uint32_t head = index / D, dim = index % D;
    float block_max = kNegInf;
#pragma unroll
    for (std::uint32_t w = 0; w < Shape::kWarps; ++w) block_max = fmaxf(block_max, s_max[w][head]);
    float total = 0.0f, sum = 0.0f;
#pragma unroll
    for (std::uint32_t w = 0; w < Shape::kWarps; ++w) {
      total += s_out[(w * kDecodeHeads + head) * Shape::kOutPitch + dim];
      if (s_max[w][head] != kNegInf) sum += s_sum[w][head] * exp2f(s_max[w][head] - block_max);
    }
    if (head >= at.heads_here) continue;
    // The V scale of an e4m3 cache multiplies the output (and so every partial, which the
    // merge only weighs).
    const float value = sum > 0.0f ? (Shape::kFp8 ? total * (v_scale / sum) : total / sum) : 0.0f;
    if (alone) {
      static_cast<T*>(p.out)[(row_base + head) * D + dim] = from_float<T>(value);
    } else {
      p.partial_out[((row_base + head) * p.chunks + at.chunk) * D + dim] = value;
      if (dim == 0) {
        p.partial_lse[(row_base + head) * p.chunks + at.chunk] =
            sum > 0.0f ? block_max + __log2f(sum) : kNegInf;
      }
    }
  }
}

// The counter of this block's (sequence, KV head, tile), counted backwards from the
// workspace's end.
__device__ __forceinline__ std::uint32_t* decode_counter(const DecodeKernelParams& p,
                                                         const DecodePlace& at) {
  return p.counters - 1 -
         ((static_cast<std::uint64_t>(at.b) * p.kv_heads + at.kv_head) * p.group_tiles + at.tile);
}

// Counts the block done on its group's counter (its partials made visible before): true in the
// last of its live_chunks blocks to finish, which then sees every other block's partials.
__device__ __forceinline__ bool finished_last(std::uint32_t* counter, std::uint32_t live_chunks,
                                              bool& s_last) {
  if (threadIdx.x == 0) s_last = atomicAdd(counter, 1u) == live_chunks - 1;
  __syncthreads();
  if (!s_last) return false;
  __threadfence();  // and the others' partials are seen by this one
  return true;
}

// Each thread merges up to kMergeVectors float4s of the output with an online softmax over
// the chunks, kMergeBatch at a time: every log2-sum-exp and partial of a batch is loaded
// before any is used, so up to kMergeBatch chunks cost one round trip to L2 (the merge is
// on the launch's critical path).
template <typename T, typename Shape>
__device__ __forceinline__ void merge_chunk_partials(const DecodeKernelParams& p,
                                                     std::uint64_t row_base,
                                                     std::uint32_t heads_here,
                                                     std::uint32_t live_chunks) {
  constexpr std::uint32_t D = Shape::kHeadDim;
  constexpr std::uint32_t kMergeBatch = 16;
  constexpr std::uint32_t kPerHead = D / 4;
#pragma unroll
  for (std::uint32_t i = 0; i < Shape::kMergeVectors; ++i) {
    const std::uint32_t index = threadIdx.x + i * Shape::kThreads;
    if (index >= heads_here * kPerHead) break;
    const std::uint32_t head = index / kPerHead, part = index % kPerHead;
    const float* lse = p.partial_lse + (row_base + head) * p.chunks;
    const float4* partial =
        reinterpret_cast<const float4*>(p.partial_out + (row_base + head) * p.chunks * D) + part;
    float most = kNegInf, sum = 0.0f;
    float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (std::uint32_t c0 = 0; c0 < live_chunks; c0 += kMergeBatch) {
      float x[kMergeBatch];
      float4 y[kMergeBatch];
#pragma unroll
      for (std::uint32_t u = 0; u < kMergeBatch; ++u) {
        const bool here = c0 + u < live_chunks;
        x[u] = here ? __ldcg(lse + c0 + u) : kNegInf;
        y[u] = here ? __ldcg(partial + static_cast<std::uint64_t>(c0 + u) * kPerHead)
                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      float batch_max = kNegInf;
#pragma unroll
      for (std::uint32_t u = 0; u < kMergeBatch; ++u) batch_max = fmaxf(batch_max, x[u]);
      const float new_max = fmaxf(most, batch_max);
      if (new_max == kNegInf) continue;           // no chunk so far saw a token
      const float scale = exp2f(most - new_max);  // 0 when most is -inf
      sum *= scale;
      total.x *= scale;
      total.y *= scale;
      total.z *= scale;
      total.w *= scale;
#pragma unroll
      for (std::uint32_t u = 0; u < kMergeBatch; ++u) {
        const float w = x[u] == kNegInf ? 0.0f : exp2f(x[u] - new_max);
        sum += w;
        total.x = fmaf(w, y[u].x, total.x);
        total.y = fmaf(w, y[u].y, total.y);
        total.z = fmaf(w, y[u].z, total.z);
        total.w = fmaf(w, y[u].w, total.w);
      }
      most = new_max;
    }
    const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
    T* out = static_cast<T*>(p.out) + (row_base + head) * D + part * 4;
    out[0] = from_float<T>(total.x * inverse);
    out[1] = from_float<T>(total.y * inverse);
    out[2] = from_float<T>(total.z * inverse);
    out[3] = from_float<T>(total.w * inverse);
  }
}

template <typename T, typename Shape>
__global__ void __launch_bounds__(Shape::kThreads) decode_kernel(const DecodeKernelParams p) {
  constexpr bool kFp8 = Shape::kFp8;
  using M = std::conditional_t<kFp8, __half, T>;  // the products' type
  constexpr std::uint32_t D = Shape::kHeadDim;
  constexpr std::uint32_t kDecodeWarps = Shape::kWarps;
  constexpr std::uint32_t kDecodeStages = Shape::kStages;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kBulk = Shape::kBulkRows;
#else
  constexpr bool kBulk = false;  // no bulk copies before sm_90 (compiled, not run: D = 128
                                 // needs Hopper's shared memory, refused by name elsewhere)
#endif

  extern __shared__ uint4 shared_raw[];
  __shared__ float s_max[kDecodeWarps][kDecodeHeads];
  __shared__ float s_sum[kDecodeWarps][kDecodeHeads];
  __shared__ alignas(8) std::uint64_t s_barriers[kDecodeWarps][kDecodeStages];
  __shared__ bool s_last;

  // Launched overlapping the kernel that wrote q and the new keys: the o projection after it
  // may start its weight reads at once, and this kernel reads nothing before the wait.
  allow_next_kernel_to_start();
  wait_for_previous_kernel();
  const DecodePlace at = decode_place(p);
  // An e4m3 cache's scales: per-head ones when given (the layer's K scale is then not in
  // scale_log2).
  const float score_scale = kFp8 && p.head_scales.k != nullptr
                                ? p.scale_log2 * p.head_scales.k[at.kv_head]
                                : p.scale_log2;
  const float v_scale =
      kFp8 ? (p.head_scales.v != nullptr ? p.head_scales.v[at.kv_head] : p.v_scale) : 1.0f;

  const std::uint32_t length = min(p.lengths[at.b], p.max_length);
  // The chunks that hold a key of this sequence (one at least: an empty sequence writes zeros).
  // The plan covers max_length, so in a graph most of a short sequence's chunks are past it:
  // they exit here, and a sequence within one chunk writes its output with no merge.
  const std::uint32_t live_chunks = max(1u, (length + p.chunk_tokens - 1) / p.chunk_tokens);
  if (at.chunk >= live_chunks) return;
  const bool alone = live_chunks == 1;
  const std::uint32_t begin = at.chunk * p.chunk_tokens;
  const std::uint32_t end = min(begin + p.chunk_tokens, length);  // <= begin: empty chunk

  std::uint32_t qa[D / 16][2];
  load_query_fragments<T, Shape>(p, at, qa);

  float m = kNegInf;   // running max of head group_row (log2 domain)
  float l = 0.0f;      // this lane's share of the running sum of that head
  float o[D / 16][4];  // O^T: (dim 16 mt + group_row (+8), heads 2 quad, 2 quad + 1)
  clear_fragments(o);

  const DecodeWarpStream stream =
      decode_warp_stream<Shape>(p, at, begin, end, shared_raw, s_barriers);
  const std::uint32_t my_tiles = stream.tiles;
  if constexpr (kBulk) init_stage_barriers<Shape>(stream);
#pragma unroll
  for (std::uint32_t i = 0; i + 1 < kDecodeStages; ++i) {
    if (i < my_tiles) issue_key_tile<Shape, kBulk>(stream, i);
    copy_async_commit();
  }

  for (std::uint32_t i = 0; i < my_tiles; ++i) {
    if (i + kDecodeStages - 1 < my_tiles)
      issue_key_tile<Shape, kBulk>(stream, i + kDecodeStages - 1);
    copy_async_commit();
    wait_for_key_tile<Shape, kBulk>(stream, i);
    const unsigned char* stage = decode_stage<Shape>(stream, i);
    const std::uint32_t k_tile = shared_address(stage);
    const std::uint32_t v_tile = k_tile + Shape::kHalf;
    const std::uint32_t key0 = decode_tile_key<Shape>(stream, i);
    float s[Shape::kKTiles][4];
    score_key_tile<Shape, M>(stage, k_tile, qa, at, s);
    std::uint32_t pb[Shape::kKTiles / 2][2];  // P^T as the B operand, one pair per k16 step
    const float correction =
        softmax_key_tile<Shape, M>(s, key0, end, score_scale, at.quad, m, l, pb);
    rescale_output<D>(o, correction, at.quad);
    accumulate_values<Shape, M>(stage, v_tile, pb, at, o);
    __syncwarp();  // the stage is read before the next issue overwrites it
  }
  copy_async_wait<0>();

  // Combine the block's warps: one max and sum per head, then the accumulators.
  publish_warp_softmax<Shape>(m, l, at, s_max, s_sum);
  __syncthreads();  // also: every warp is done with its stages, which are reused below
  float* s_out = reinterpret_cast<float*>(shared_raw);  // [warp][head][kOutPitch]
  stage_warp_output<Shape>(o, at, s_max, s_out);
  __syncthreads();
  const std::uint64_t row_base = static_cast<std::uint64_t>(at.b) * p.qo_heads + at.first_head;
  write_block_output<T, Shape>(p, at, row_base, alone, v_scale, s_max, s_sum, s_out);
  if (alone) return;

  // The last block of this (sequence, KV head, tile) to finish merges every chunk's partial.
  __threadfence();  // this block's partials are visible device-wide before it counts itself
  __syncthreads();
  std::uint32_t* counter = decode_counter(p, at);
  if (!finished_last(counter, live_chunks, s_last)) return;
  merge_chunk_partials<T, Shape>(p, row_base, at.heads_here, live_chunks);
  if (threadIdx.x == 0) *counter = 0;  // ready for the next call (or graph replay)
}

}  // namespace kvvm::kernels
