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

#include "kernels/attention/decode_merge.cuh"
#include "kernels/attention/decode_shape.cuh"

namespace kvvm::kernels {

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
