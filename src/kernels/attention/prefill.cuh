// Causal prefill attention over a KvView on the tensor cores: FlashAttention-2 on
// mma.sync.m16n8k16 (fp32 accumulation), ldmatrix and cp.async.
//
// Rows. A block takes 128 query rows that share one KV head. Rows are the (position, head)
// pairs of the KV head's group laid out position-major: row R of the KV head is query
// position R / group, query head kv_head * group + R % group, so every K / V tile staged in
// shared memory serves the whole group, any group size works without padding (the last
// block of a chunk is the only partial one) and a block of group g spans about 128 / g
// positions. Grid: one block per (128-row tile, KV head), 1-D, heaviest (last) tiles first
// so the causal tail of light blocks is short.
//
// Warps. 4 warps x 32 rows: each warp owns two m16 tiles, so every K / V fragment it loads
// from shared memory feeds two MMAs (16 rows per warp is shared-memory-bandwidth bound).
// K / V are staged 64 keys at a time; the softmax steps over them 64 keys at a time at D = 64
// and 32 at D = 128. Per step and warp: S = Q K^T is 2 x (keys / 8) accumulator tiles (32
// fp32 registers per thread at D = 128, 64 at D = 64); P is rebuilt from them in registers
// as the A operand of P V (the C fragments of two adjacent n8 tiles are one k16 A fragment);
// O is 2 x D/8 tiles (128 registers at D = 128). S of 64 keys on top of O spills at D = 128
// (ptxas at the 255 cap), hence its 32-key steps. Q is read from shared memory by ldmatrix
// at every k-step (holding it would cost 64 more registers at D = 128). Online softmax in
// fp32 on exp2 (the scale carries log2 e): a row lives in the 4 lanes of a quad (reductions:
// xor 1, 2; the running sum stays per lane and is reduced once at the end); O is rescaled
// only when some row maximum of the warp moved. State starts at (-inf, 0, 0) and exp2 is
// taken against 0 while the max is still -inf, so a fully masked row gives 0, never NaN.
//
// Shared memory: Q 128 x D x 2 bytes, K and V 64 x D x 2 bytes each, double-buffered:
//   D = 128: 32 KiB + 2 x 2 x 16 KiB = 96 KiB per block;
//   D =  64: 16 KiB + 2 x 2 x  8 KiB = 48 KiB per block.
// Registers (sm_90, ptxas -v): 243 per thread at D = 128, 219 at D = 64, no spill, no stack.
// So 2 blocks (8 warps, 256 threads x <= 255 registers = the 64 Ki register file) per SM at
// either D: __launch_bounds__(128, 2). Three blocks at D = 64 would need <= 168 registers and
// spill. Shared-memory traffic per warp and 32 keys at D = 128: 16 ldmatrix.x4 of Q, 16 of K,
// 16 of V (512 bytes each) against 128 MMAs, plus the cp.async fill; at 128 bytes per clock
// per SM that is about as many clocks as the MMAs take, so a larger key step (Q read once per
// 64 keys) is the next lever if registers allow.
//
// Rows are 128 / 256 bytes: the 16-byte chunk index is XOR-swizzled with (row & 7) on the
// cp.async write and the ldmatrix read alike, so the 8 row addresses of one 8x8 matrix fall
// in 8 distinct bank groups.
//
// Pipeline. Q and K / V tile 0 are one cp.async group; while tile j is computed, tile j + 1
// is in flight into the other buffer.
//
// An fp8 (e4m3) cache: tile j + 1 is copied as it is stored (half the bytes) into a staging
// area (the second K buffer holds K and V of 64 e4m3 rows), and once landed every thread
// widens its share to T into the first buffer (e4m3 -> fp16 is exact and one instruction per
// pair; fp16 -> bf16 through float is exact too), so the products are the 16-bit path's. The
// K scale is folded into the softmax scale and the V scale into the output normalisation,
// so no element is rescaled; the conversion costs 64 x D x 2 elements per block per tile,
// small against the tile's 2 x 128 x 64 x D multiply-adds.
//
// Causality and length: a block reads keys [0, start + its last row's position] only; a
// dead copy (a key past that end, a row past the chunk) has source size 0 (zero-fill) and
// the address of a live row. Only key tiles that reach past the block's first position
// apply the per-element mask (key > row position -> -inf). Rows past the chunk are computed
// on zeros and never written. The output goes through the warp's own Q rows in shared memory
// (only that warp reads them) so global stores are 16 bytes.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/mma.cuh"
#include "kvvm/kernels/attention.h"

namespace kvvm::kernels {

constexpr std::uint32_t kPrefillThreads = 128;
constexpr std::uint32_t kPrefillRows = 128;     // query rows (position x head) per block
constexpr std::uint32_t kPrefillWarpRows = 32;  // two m16 tiles per warp
constexpr std::uint32_t kPrefillKeys = 64;      // keys per tile

// The caller's parameters as given, and what the launcher derives from them.
struct PrefillKernelParams : PrefillParams {
  explicit PrefillKernelParams(const PrefillParams& params) : PrefillParams(params) {}
  std::uint32_t group = 0;        // query heads per KV head
  std::uint32_t query_tiles = 0;  // blocks per KV head: ceil(tokens * group / 128)
  float scale_log2 = 0;
};

template <std::uint32_t D>
__host__ __device__ constexpr std::uint32_t prefill_shared_bytes() {
  return (kPrefillRows + 2 * 2 * kPrefillKeys) * D * 2;  // Q, 2 x K, 2 x V tiles
}

// Keys of one softmax step: the staged tile of 64 in halves at D = 128, where S of 64 keys
// (64 registers) on top of O (128) would spill.
template <std::uint32_t D>
__host__ __device__ constexpr std::uint32_t prefill_sub_keys() {
  return D <= 64 ? 64 : 32;
}

template <std::uint32_t D>
__host__ __device__ constexpr int prefill_blocks_per_sm() {
  return 2;
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of D-element rows.
template <std::uint32_t D>
__device__ __forceinline__ std::uint32_t swizzled(std::uint32_t row, std::uint32_t chunk) {
  return row * (D * 2) + ((chunk ^ (row & 7)) << 4);
}

// 2^x on the special-function unit; 2^-inf = +0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Sixteen e4m3 bytes as 16 values of T, in two 16-byte chunks.
template <typename T>
__device__ __forceinline__ void widen16(const uint4 bytes, uint4& low, uint4& high) {
  std::uint32_t halves[8];
  e4m3x4_to_half2x2(bytes.x, halves[0], halves[1]);
  e4m3x4_to_half2x2(bytes.y, halves[2], halves[3]);
  e4m3x4_to_half2x2(bytes.z, halves[4], halves[5]);
  e4m3x4_to_half2x2(bytes.w, halves[6], halves[7]);
  if constexpr (!std::is_same_v<T, __half>) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(&halves[i]));
      halves[i] = pack_float2<T>(pair.x, pair.y);  // exact: an e4m3 value is a bf16 value
    }
  }
  low = make_uint4(halves[0], halves[1], halves[2], halves[3]);
  high = make_uint4(halves[4], halves[5], halves[6], halves[7]);
}

// Where a block and a thread sit: the block's KV head and its rows of that head's (position,
// head) rows, the keys they read, and the thread's place.
struct PrefillPlace {
  std::uint32_t kv_head;
  std::uint32_t group;
  std::uint32_t row0;  // first row of the KV head's rows
  std::uint32_t last_row;
  std::uint32_t first_position;
  std::uint32_t key_end;  // keys [0, key_end)
  std::uint32_t tid;
  std::uint32_t lane;
  std::uint32_t warp;
  std::uint64_t head0;  // the KV head's first query head
};

__device__ __forceinline__ PrefillPlace prefill_place(const PrefillKernelParams& p) {
  PrefillPlace at;
  at.kv_head = blockIdx.x % p.kv_heads;
  const std::uint32_t query_tile = p.query_tiles - 1 - blockIdx.x / p.kv_heads;
  at.group = p.group;
  at.row0 = query_tile * kPrefillRows;
  at.last_row = min(at.row0 + kPrefillRows, p.tokens * at.group) - 1;
  at.first_position = p.start + at.row0 / at.group;
  at.key_end = p.start + at.last_row / at.group + 1;
  at.tid = threadIdx.x;
  at.lane = at.tid % 32;
  at.warp = at.tid / 32;
  at.head0 = std::uint64_t{at.kv_head} * at.group;
  return at;
}

// The block's shared memory: Q [128][D], then K and V [2][64][D] each (double-buffered).
struct PrefillShared {
  unsigned char* q;
  unsigned char* k;
  unsigned char* v;
};

// Q rows into shared memory (a row past the chunk copies nothing from the block's first row).
template <std::uint32_t D>
__device__ __forceinline__ void stage_query_rows(const PrefillKernelParams& p,
                                                 const PrefillPlace& at, unsigned char* q_s) {
  constexpr std::uint32_t kChunks = D / 8;  // 16-byte chunks in a row
  constexpr std::uint32_t kRowBytes = D * 2;
  const unsigned char* q = static_cast<const unsigned char*>(p.q);
#pragma unroll
  for (std::uint32_t it = 0; it < kPrefillRows * kChunks / kPrefillThreads; ++it) {
    const std::uint32_t i = it * kPrefillThreads + at.tid;
    const std::uint32_t r = i / kChunks, c = i % kChunks;
    const bool live = at.row0 + r <= at.last_row;
    const std::uint32_t row = live ? at.row0 + r : at.row0;
    const std::uint64_t q_row =
        std::uint64_t{row / at.group} * p.qo_heads + at.head0 + row % at.group;
    copy_async_16(q_s + swizzled<D>(r, c), q + q_row * kRowBytes + c * 16, live);
  }
}

// A thread's share of every K / V tile copy: its chunk column is the same in every pass.
struct PrefillKvCopies {
  const unsigned char* k_thread;  // key 0 of the KV head, at the thread's chunk column
  std::uint32_t key;              // the thread's first row of a tile
  std::uint32_t at;               // that row's swizzled chunk, as a byte offset
};

template <std::uint32_t D>
__device__ __forceinline__ PrefillKvCopies prefill_kv_copies(const PrefillKernelParams& p,
                                                             const PrefillPlace& at) {
  constexpr std::uint32_t kChunks = D / 8;
  const KvView& view = p.view;
  const std::uint32_t my_chunk = at.tid % kChunks;
  PrefillKvCopies copies;
  copies.key = at.tid / kChunks;
  copies.at = swizzled<D>(copies.key, my_chunk);
  copies.k_thread = reinterpret_cast<const unsigned char*>(view.base) + p.slot * view.slot_stride +
                    p.layer * view.layer_stride + at.kv_head * view.head_stride + my_chunk * 16;
  return copies;
}

// K and V of keys [64 tile, 64 tile + 64) into buffer `buffer`. A key at or past key_end
// copies nothing from the tile's first key (always live). V is K's address plus kv_stride,
// added at the copy (one pointer held).
template <std::uint32_t D>
__device__ __forceinline__ void issue_kv_tile(const KvView& view, const PrefillKvCopies& copies,
                                              std::uint32_t key_end, const PrefillShared& smem,
                                              std::uint32_t tile, std::uint32_t buffer) {
  constexpr std::uint32_t kChunks = D / 8;
  constexpr std::uint32_t kRowBytes = D * 2;
  constexpr std::uint32_t kTileBytes = kPrefillKeys * kRowBytes;
  const std::uint32_t key0 = tile * kPrefillKeys;
#pragma unroll
  for (std::uint32_t it = 0; it < kPrefillKeys * kChunks / kPrefillThreads; ++it) {
    // Rows it * 128 / kChunks apart keep (row & 7), so the swizzle of copies.at holds.
    const std::uint32_t key = key0 + copies.key + it * (kPrefillThreads / kChunks);
    const bool live = key < key_end;
    const unsigned char* k_row =
        copies.k_thread + std::uint64_t{live ? key : key0} * view.token_stride;
    const std::uint32_t at =
        buffer * kTileBytes + copies.at + it * (kPrefillThreads / kChunks) * kRowBytes;
    copy_async_16(smem.k + at, k_row, live);
    copy_async_16(smem.v + at, k_row + view.kv_stride, live);
  }
}

// e4m3 K and V of keys [64 tile, 64 tile + 64) into the staging area, rows as stored:
// K rows at staged, V rows 64 x D bytes further.
template <std::uint32_t D>
__device__ __forceinline__ void issue_fp8_kv_tile(const PrefillKernelParams& p,
                                                  const PrefillPlace& at, unsigned char* staged,
                                                  std::uint32_t tile) {
  constexpr std::uint32_t kFp8Chunks = D / 16;  // 16-byte chunks of an e4m3 row
  const KvView& view = p.view;
  const unsigned char* head = reinterpret_cast<const unsigned char*>(view.base) +
                              p.slot * view.slot_stride + p.layer * view.layer_stride +
                              at.kv_head * view.head_stride;
  const std::uint32_t key0 = tile * kPrefillKeys;
#pragma unroll
  for (std::uint32_t it = 0; it < kPrefillKeys * kFp8Chunks / kPrefillThreads; ++it) {
    const std::uint32_t i = it * kPrefillThreads + at.tid;
    const std::uint32_t r = i / kFp8Chunks, c = i % kFp8Chunks;
    const bool live = key0 + r < at.key_end;
    const unsigned char* k_row =
        head + std::uint64_t{live ? key0 + r : key0} * view.token_stride + c * 16;
    copy_async_16(staged + r * D + c * 16, k_row, live);
    copy_async_16(staged + kPrefillKeys * D + r * D + c * 16, k_row + view.kv_stride, live);
  }
}

// The staged tile widened into buffer 0 (the swizzled layout the products read).
template <typename T, std::uint32_t D>
__device__ __forceinline__ void widen_staged_tile(const unsigned char* staged,
                                                  const PrefillShared& smem, std::uint32_t tid) {
  constexpr std::uint32_t kFp8Chunks = D / 16;
#pragma unroll
  for (std::uint32_t it = 0; it < 2 * kPrefillKeys * kFp8Chunks / kPrefillThreads; ++it) {
    const std::uint32_t i = it * kPrefillThreads + tid;
    const std::uint32_t kv = i / (kPrefillKeys * kFp8Chunks);
    const std::uint32_t r = (i / kFp8Chunks) % kPrefillKeys, c = i % kFp8Chunks;
    uint4 low, high;
    widen16<T>(*reinterpret_cast<const uint4*>(staged + i * 16), low, high);
    unsigned char* tile = kv == 0 ? smem.k : smem.v;
    *reinterpret_cast<uint4*>(tile + swizzled<D>(r, 2 * c)) = low;
    *reinterpret_cast<uint4*>(tile + swizzled<D>(r, 2 * c + 1)) = high;
  }
}

// The online softmax's start: (-inf, 0) per row, O zero.
template <std::uint32_t D>
__device__ __forceinline__ void clear_prefill_state(float (&o)[2][D / 8][4], float (&m)[2][2],
                                                    float (&l)[2][2]) {
#pragma unroll
  for (std::uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (std::uint32_t h = 0; h < 2; ++h) {
      m[mt][h] = kNegInf;
      l[mt][h] = 0.0f;
    }
#pragma unroll
    for (std::uint32_t n = 0; n < D / 8; ++n) {
#pragma unroll
      for (std::uint32_t e = 0; e < 4; ++e) o[mt][n][e] = 0.0f;
    }
  }
}

// S = Q K^T (unscaled) of the warp's 32 rows and a step of kSubKeys keys.
template <typename T, std::uint32_t D>
__device__ __forceinline__ void prefill_scores(std::uint32_t q_step, std::uint32_t k_tile,
                                               float (&s)[2][prefill_sub_keys<D>() / 8][4]) {
  constexpr std::uint32_t kRowBytes = D * 2;
  constexpr std::uint32_t kKeyTiles = prefill_sub_keys<D>() / 8;
#pragma unroll
  for (std::uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (std::uint32_t n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (std::uint32_t e = 0; e < 4; ++e) s[mt][n][e] = 0.0f;
    }
  }
#pragma unroll
  for (std::uint32_t kk = 0; kk < D / 16; ++kk) {
    std::uint32_t a[2][4];
#pragma unroll
    for (std::uint32_t mt = 0; mt < 2; ++mt) {
      // Matrices: rows 0-7 / 8-15 (lane bit 3) x dims 0-7 / 8-15 (lane bit 4).
      ldmatrix_x4(a[mt], (q_step ^ (kk * 32)) + mt * 16 * kRowBytes);
    }
#pragma unroll
    for (std::uint32_t n2 = 0; n2 < kKeyTiles / 2; ++n2) {
      // Matrices: keys 0-7 / 8-15 (lane bit 4) x dims 0-7 / 8-15 (lane bit 3).
      std::uint32_t b[4];
      ldmatrix_x4(b, (k_tile ^ (kk * 32)) + n2 * 16 * kRowBytes);
      const std::uint32_t b_low[2] = {b[0], b[1]}, b_high[2] = {b[2], b[3]};
#pragma unroll
      for (std::uint32_t mt = 0; mt < 2; ++mt) {
        mma_m16n8k16<T>(s[mt][2 * n2], a[mt], b_low);
        mma_m16n8k16<T>(s[mt][2 * n2 + 1], a[mt], b_high);
      }
    }
  }
}

// Scale into the log2 domain; mask (key > row position -> -inf) only on steps that reach past
// the block's first position.
template <std::uint32_t D>
__device__ __forceinline__ void scale_and_mask_scores(float (&s)[2][prefill_sub_keys<D>() / 8][4],
                                                      std::uint32_t key0, float score_scale,
                                                      const PrefillPlace& at, std::uint32_t start) {
  constexpr std::uint32_t kSubKeys = prefill_sub_keys<D>();
  constexpr std::uint32_t kKeyTiles = kSubKeys / 8;
  const bool diagonal = key0 + kSubKeys - 1 > at.first_position;
#pragma unroll
  for (std::uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (std::uint32_t n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (std::uint32_t e = 0; e < 4; ++e) s[mt][n][e] *= score_scale;
    }
  }
  if (diagonal) {
#pragma unroll
    for (std::uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (std::uint32_t h = 0; h < 2; ++h) {
        // This thread's row (m tile mt, half h) is warp row 16 mt + 8 h + lane / 4;
        // derived here, on the few diagonal tiles, rather than held in registers.
        const std::uint32_t row =
            at.row0 + at.warp * kPrefillWarpRows + mt * 16 + h * 8 + at.lane / 4;
        const std::uint32_t position = start + row / at.group;
#pragma unroll
        for (std::uint32_t n = 0; n < kKeyTiles; ++n) {
#pragma unroll
          for (std::uint32_t e = 2 * h; e < 2 * h + 2; ++e) {
            const std::uint32_t key = key0 + n * 8 + 2 * (at.lane & 3) + (e & 1);
            if (key > position) s[mt][n][e] = kNegInf;
          }
        }
      }
    }
  }
}

// Online softmax: s becomes P; the running max and sum of each row move on, and `corrections`
// holds the factor each row's O takes. Returns whether any of this lane's rows moved.
template <std::uint32_t D>
__device__ __forceinline__ bool prefill_softmax(float (&s)[2][prefill_sub_keys<D>() / 8][4],
                                                float (&m)[2][2], float (&l)[2][2],
                                                float (&corrections)[2][2]) {
  constexpr std::uint32_t kKeyTiles = prefill_sub_keys<D>() / 8;
  bool rescale = false;
#pragma unroll
  for (std::uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (std::uint32_t h = 0; h < 2; ++h) {
      float tile_max = kNegInf;
#pragma unroll
      for (std::uint32_t n = 0; n < kKeyTiles; ++n) {
        tile_max = fmaxf(tile_max, fmaxf(s[mt][n][2 * h], s[mt][n][2 * h + 1]));
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(m[mt][h], tile_max);
      const float base = new_max == kNegInf ? 0.0f : new_max;
      const float correction = fast_exp2(m[mt][h] - base);
      m[mt][h] = new_max;
      float added = 0.0f;
#pragma unroll
      for (std::uint32_t n = 0; n < kKeyTiles; ++n) {
#pragma unroll
        for (std::uint32_t e = 2 * h; e < 2 * h + 2; ++e) {
          s[mt][n][e] = fast_exp2(s[mt][n][e] - base);
          added += s[mt][n][e];
        }
      }
      l[mt][h] = l[mt][h] * correction + added;
      corrections[mt][h] = correction;
      rescale |= correction != 1.0f;
    }
  }
  return rescale;
}

template <std::uint32_t D>
__device__ __forceinline__ void rescale_prefill_output(float (&o)[2][D / 8][4],
                                                       const float (&corrections)[2][2]) {
#pragma unroll
  for (std::uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (std::uint32_t n = 0; n < D / 8; ++n) {
#pragma unroll
      for (std::uint32_t e = 0; e < 4; ++e) o[mt][n][e] *= corrections[mt][e / 2];
    }
  }
}

// O += P V: P packed from the S accumulators (the A fragments of every k16 step), V by
// ldmatrix.trans; dims outer so each V address serves every key step.
template <typename T, std::uint32_t D>
__device__ __forceinline__ void accumulate_prefill_values(
    const float (&s)[2][prefill_sub_keys<D>() / 8][4], std::uint32_t v_tile,
    float (&o)[2][D / 8][4]) {
  constexpr std::uint32_t kRowBytes = D * 2;
  constexpr std::uint32_t kKeySteps = prefill_sub_keys<D>() / 16;  // k16 steps of P V
  std::uint32_t a[kKeySteps][2][4];
#pragma unroll
  for (std::uint32_t kk = 0; kk < kKeySteps; ++kk) {
#pragma unroll
    for (std::uint32_t mt = 0; mt < 2; ++mt) {
      a[kk][mt][0] = pack_float2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      a[kk][mt][1] = pack_float2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      a[kk][mt][2] = pack_float2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      a[kk][mt][3] = pack_float2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }
  }
#pragma unroll
  for (std::uint32_t d2 = 0; d2 < D / 16; ++d2) {
    const std::uint32_t v_dims = v_tile ^ (d2 * 32);
#pragma unroll
    for (std::uint32_t kk = 0; kk < kKeySteps; ++kk) {
      // Matrices: keys 0-7 / 8-15 (lane bit 3) x dims 0-7 / 8-15 (lane bit 4), transposed.
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, v_dims + kk * 16 * kRowBytes);
      const std::uint32_t b_low[2] = {b[0], b[1]}, b_high[2] = {b[2], b[3]};
#pragma unroll
      for (std::uint32_t mt = 0; mt < 2; ++mt) {
        mma_m16n8k16<T>(o[mt][2 * d2], a[kk][mt], b_low);
        mma_m16n8k16<T>(o[mt][2 * d2 + 1], a[kk][mt], b_high);
      }
    }
  }
}

// Normalize and stage O as T in this warp's Q rows (only this warp reads them), then 16-byte
// stores of whole rows; rows past the chunk are not written.
template <typename T, std::uint32_t D>
__device__ __forceinline__ void write_prefill_output(const PrefillKernelParams& p,
                                                     const PrefillPlace& at,
                                                     const float (&o)[2][D / 8][4],
                                                     const float (&l)[2][2], float v_scale,
                                                     unsigned char* q_s) {
  constexpr std::uint32_t kChunks = D / 8;
  constexpr std::uint32_t kRowBytes = D * 2;
  unsigned char* o_warp = q_s + at.warp * kPrefillWarpRows * kRowBytes;
#pragma unroll
  for (std::uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (std::uint32_t h = 0; h < 2; ++h) {
      float sum = l[mt][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      // An e4m3 cache's V scale multiplies the output.
      const float inverse = sum > 0.0f ? v_scale / sum : 0.0f;
      const std::uint32_t r = mt * 16 + h * 8 + at.lane / 4;
#pragma unroll
      for (std::uint32_t n = 0; n < D / 8; ++n) {
        *reinterpret_cast<std::uint32_t*>(o_warp + swizzled<D>(r, n) + (at.lane & 3) * 4) =
            pack_float2<T>(o[mt][n][2 * h] * inverse, o[mt][n][2 * h + 1] * inverse);
      }
    }
  }
  __syncwarp();
  unsigned char* out = static_cast<unsigned char*>(p.out);
#pragma unroll
  for (std::uint32_t it = 0; it < kChunks; ++it) {
    const std::uint32_t i = it * 32 + at.lane;
    const std::uint32_t r = i / kChunks, c = i % kChunks;
    const std::uint32_t row = at.row0 + at.warp * kPrefillWarpRows + r;
    if (row > at.last_row) continue;
    const std::uint64_t out_row =
        std::uint64_t{row / at.group} * p.qo_heads + at.head0 + row % at.group;
    *reinterpret_cast<uint4*>(out + out_row * kRowBytes + c * 16) =
        *reinterpret_cast<const uint4*>(o_warp + swizzled<D>(r, c));
  }
}

template <typename T, std::uint32_t D, bool kFp8 = false>
__global__ void __launch_bounds__(kPrefillThreads, prefill_blocks_per_sm<D>())
    prefill_kernel(const PrefillKernelParams p) {
  constexpr std::uint32_t kRowBytes = D * 2;
  constexpr std::uint32_t kTileBytes = kPrefillKeys * kRowBytes;
  constexpr std::uint32_t kSubKeys = prefill_sub_keys<D>();

  // 1 KiB aligned: the swizzle XORs absolute shared addresses (bits 4-7 free).
  extern __shared__ __align__(1024) uint4 shared_raw[];
  PrefillShared smem;
  smem.q = reinterpret_cast<unsigned char*>(shared_raw);  // [128][D]
  smem.k = smem.q + kPrefillRows * kRowBytes;             // [2][64][D]
  smem.v = smem.k + 2 * kTileBytes;                       // [2][64][D]

  const PrefillPlace at = prefill_place(p);
  // An e4m3 cache's scales: per-head ones when given (the layer's K scale is then not in
  // scale_log2).
  const float score_scale = kFp8 && p.head_scales.k != nullptr
                                ? p.scale_log2 * p.head_scales.k[at.kv_head]
                                : p.scale_log2;
  const float v_scale =
      kFp8 ? (p.head_scales.v != nullptr ? p.head_scales.v[at.kv_head] : p.v_scale) : 1.0f;

  stage_query_rows<D>(p, at, smem.q);
  const PrefillKvCopies copies = prefill_kv_copies<D>(p, at);
  // An e4m3 tile is staged as stored in the second K buffer (K rows, then V rows).
  unsigned char* staged = smem.k + kTileBytes;

  // A lambda, as the kernel had it: the copies' index arithmetic then compiles as it did
  // before the phases were named (called directly, a register more at 16 bits).
  auto load_tile = [&](std::uint32_t tile, std::uint32_t buffer) {
    issue_kv_tile<D>(p.view, copies, at.key_end, smem, tile, buffer);
  };

  float o[2][D / 8][4];
  float m[2][2], l[2][2];
  clear_prefill_state<D>(o, m, l);

  // ldmatrix row addresses of this lane. Q and V: row lane & 15 of a 16-row step, chunk
  // 2 step + lane / 16; K: row 8 (lane / 16) + lane % 8, chunk 2 step + (lane / 8) % 2. Every
  // row is (lane & 7) mod 8, so the swizzled chunk of k16 step `step` is (2 step) ^ x, x the
  // lane's 3-bit term: as a byte address, (row address + 16 x) ^ (32 step), since a row
  // address has bits 4-7 clear. One XOR per ldmatrix, and nothing per step to hold in
  // registers across the key loop. (Computed here from threadIdx.x, not from `at`: so the
  // compiler keeps them as it did before the phases were named, registers included.)
  const std::uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const std::uint32_t qv_x = ((lane >> 4) ^ (lane & 7)) << 4;
  const std::uint32_t k_x = (((lane >> 3) & 1) ^ (lane & 7)) << 4;
  const std::uint32_t q_lane =
      shared_address(smem.q) + (warp * kPrefillWarpRows + (lane & 15)) * kRowBytes + qv_x;
  const std::uint32_t k_lane =
      shared_address(smem.k) + (((lane >> 4) << 3) + (lane & 7)) * kRowBytes + k_x;
  const std::uint32_t v_lane = shared_address(smem.v) + (lane & 15) * kRowBytes + qv_x;
  // The XOR form above needs the dynamic shared memory 1 KiB aligned, as declared; a
  // misplaced window would read wrong rows silently, so it stops the kernel instead.
  if ((shared_address(shared_raw) & 1023u) != 0) __trap();
  const std::uint32_t tiles = (at.key_end + kPrefillKeys - 1) / kPrefillKeys;
  if constexpr (kFp8) {
    issue_fp8_kv_tile<D>(p, at, staged, 0);
  } else {
    load_tile(0, 0);
  }
  copy_async_commit();  // with Q
  for (std::uint32_t j = 0; j < tiles; ++j) {
    if constexpr (kFp8) {
      copy_async_wait<0>();
      __syncthreads();  // tile j is staged, and every warp is done with buffer 0's tile j - 1
      widen_staged_tile<T, D>(staged, smem, at.tid);
      __syncthreads();  // buffer 0 holds tile j; the staging area is free
      if (j + 1 < tiles) issue_fp8_kv_tile<D>(p, at, staged, j + 1);
      copy_async_commit();
    } else {
      if (j + 1 < tiles) load_tile(j + 1, (j + 1) & 1);
      copy_async_commit();  // possibly empty: tile j is then always all but the newest group
      copy_async_wait<1>();
      __syncthreads();
    }
    const std::uint32_t buffer = kFp8 ? 0 : j & 1;
#pragma unroll 1
    for (std::uint32_t half = 0; half < kPrefillKeys / kSubKeys; ++half) {
      const std::uint32_t key0 = j * kPrefillKeys + half * kSubKeys;
      if (key0 >= at.key_end) break;  // block-uniform; no barrier inside
      // Q's address made opaque per step: else the compiler hoists the 8 XORed Q addresses out
      // of the key loop into registers that O and S need.
      std::uint32_t q_step;
      asm volatile("mov.b32 %0, %1;\n" : "=r"(q_step) : "r"(q_lane));
      const std::uint32_t k_tile = k_lane + buffer * kTileBytes + half * kSubKeys * kRowBytes;
      const std::uint32_t v_tile = v_lane + buffer * kTileBytes + half * kSubKeys * kRowBytes;

      float s[2][kSubKeys / 8][4];
      prefill_scores<T, D>(q_step, k_tile, s);
      scale_and_mask_scores<D>(s, key0, score_scale, at, p.start);
      float corrections[2][2];
      const bool moved = prefill_softmax<D>(s, m, l, corrections);
      // Once the row maxima settle (most tiles), no row of the warp moves and O is left as is.
      if (__any_sync(0xffffffffu, moved)) rescale_prefill_output<D>(o, corrections);
      accumulate_prefill_values<T, D>(s, v_tile, o);
    }
    __syncthreads();  // every warp is done with this buffer before tile j + 2 lands in it
  }
  copy_async_wait<0>();

  write_prefill_output<T, D>(p, at, o, l, v_scale, smem.q);
}

}  // namespace kvvm::kernels
