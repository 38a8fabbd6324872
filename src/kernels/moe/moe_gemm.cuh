// The grouped GEMMs of the MoE layer (moe_expert_gate_up_cuda, moe_expert_down_cuda): one
// kernel template on mma.sync m16n8k16 (fp16 / bf16, fp32 accumulation), cp.async pipelines and
// ldmatrix, instantiated per element type, weight format, projection and tile.
//
// The grid: x over row tiles of the active experts (at most floor(pairs / kBm) + min(experts,
// pairs) tiles exist, so the grid is sized from `tokens` alone), y over output tiles. Block x
// finds its (expert, row tile) from the device's active list and offsets (a warp-wide scan of
// the experts' tile counts) and exits at once when it has none, so a batch of one token reads
// only its experts' weights.
//
// A tile: kBm permuted rows x kBn weight rows, 64 of K a stage (128-byte rows, their 16-byte
// chunks XOR-swizzled by row so cp.async writes and ldmatrix reads hit 8 bank groups). The A
// rows are gathered: gate|up reads x[rows[r] / top_k], down reads act[r]; padding rows and rows
// past the expert's run are zero-filled and never stored. gate|up's kBn weight rows are kBn / 2
// gate rows and the kBn / 2 up rows of the same outputs, so a thread holds gate and up of one
// output and the epilogue writes silu(gate) * up.
//
// FP8 block-scaled weights (kFp8Block128): the e4m3 tile is copied as bytes and widened in
// shared memory to the element type (exact: every e4m3 value is an fp16 and a bf16 value), the
// activations stay as they are, and each 128 of K is summed by the tensor cores into a zeroed
// fragment, then multiplied by the block's float32 scale and added in float32. Why not e4m3
// MMAs on quantized activations: this is the product of x and the dequantized weights itself
// (no activation rounding), with the bf16 kernel's structure; what it costs is the widening.
//
// Sums: each output's K runs in order, 16 at a time, through the same MMA sequence whatever the
// tile, batch or expert placement, so every tile choice gives the same bits and a token's
// result does not depend on the tokens beside it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/launch_support.cuh"
#include "kernels/mma.cuh"
#include "kvvm/kernels/moe_kernels.h"

namespace kvvm {
namespace kernels {
namespace moe {

constexpr std::uint32_t kBk = 64;  // K elements a stage: a 128-byte row of 16-bit elements
constexpr std::uint32_t kNoRow = ~std::uint32_t{0};

// A tile shape: kBm rows x kBn weight rows, kWm x kWn warps, kStages stages.
template <std::uint32_t kBmV, std::uint32_t kBnV, std::uint32_t kWmV, std::uint32_t kWnV,
          std::uint32_t kStagesV>
struct Tile {
  static constexpr std::uint32_t kBm = kBmV, kBn = kBnV, kWm = kWmV, kWn = kWnV;
  static constexpr std::uint32_t kStages = kStagesV;
  static constexpr std::uint32_t kThreads = kWm * kWn * 32;
  static constexpr std::uint32_t kTm = kBm / kWm, kTn = kBn / kWn;  // a warp's rows, columns
  static constexpr std::uint32_t kMi = kTm / 16, kNi = kTn / 8;     // its MMA tiles
  static_assert(kTm % 16 == 0 && kTn % 16 == 0, "a warp covers whole 16 x 16 tiles");
};
using SmallTile = Tile<16, 64, 1, 4, 4>;
using MediumTile = Tile<64, 128, 2, 4, 4>;
using LargeTile = Tile<128, 128, 2, 4, 3>;

template <typename T, bool kFp8, typename S>
__host__ __device__ constexpr std::uint32_t shared_bytes() {
  const std::uint32_t a = S::kStages * S::kBm * kBk * 2;
  const std::uint32_t b =
      kFp8 ? S::kStages * S::kBn * kBk + S::kBn * kBk * 2 : S::kStages * S::kBn * kBk * 2;
  return a + b + 2 * S::kBm * 4;
}

// Byte offset of (row, 16-byte chunk) in a tile of 128-byte rows.
__device__ __forceinline__ std::uint32_t swizzled(std::uint32_t row, std::uint32_t chunk) {
  return row * 128 + ((chunk ^ (row & 7)) * 16);
}

// 16 e4m3 bytes widened to 16 elements of T (two 16-byte chunks).
template <typename T>
__device__ __forceinline__ void widen16(const uint4& bytes, uint4& low, uint4& high) {
  const std::uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
  std::uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    std::uint32_t lo, hi;
    e4m3x4_to_half2x2(words[i], lo, hi);
    if constexpr (std::is_same_v<T, __half>) {
      out[2 * i] = lo;
      out[2 * i + 1] = hi;
    } else {
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
      out[2 * i] = pack_float2<__nv_bfloat16>(a.x, a.y);
      out[2 * i + 1] = pack_float2<__nv_bfloat16>(b.x, b.y);
    }
  }
  low = make_uint4(out[0], out[1], out[2], out[3]);
  high = make_uint4(out[4], out[5], out[6], out[7]);
}

// What differs between gate|up and down, on the host's params.
template <bool kGateUp>
struct Projection;
template <>
struct Projection<true> {
  using Params = MoeGateUpParams;
  static __device__ std::uint32_t k(const Params& p) { return p.hidden; }
  static __device__ std::uint32_t outputs(const Params& p) { return p.inter; }
  static __device__ const void* weights(const Params& p, std::uint32_t e) { return p.gate_up[e]; }
  static __device__ const float* scales(const Params& p, std::uint32_t e) {
    return p.gate_up_scales[e];
  }
  static __device__ const void* a(const Params& p) { return p.x; }
};
template <>
struct Projection<false> {
  using Params = MoeDownParams;
  static __device__ std::uint32_t k(const Params& p) { return p.inter; }
  static __device__ std::uint32_t outputs(const Params& p) { return p.hidden; }
  static __device__ const void* weights(const Params& p, std::uint32_t e) { return p.down[e]; }
  static __device__ const float* scales(const Params& p, std::uint32_t e) {
    return p.down_scales[e];
  }
  static __device__ const void* a(const Params& p) { return p.act; }
};

// Outputs (act columns for gate|up, hidden for down) of one block: gate|up's kBn weight rows
// make kBn / 2 outputs.
template <bool kGateUp, typename S>
__host__ __device__ constexpr std::uint32_t block_outputs() {
  return kGateUp ? S::kBn / 2 : S::kBn;
}

template <typename T, bool kGateUp, bool kFp8, typename S>
__global__ void __launch_bounds__(S::kThreads, 1)
    moe_gemm_kernel(const typename Projection<kGateUp>::Params p) {
  using P = Projection<kGateUp>;
  constexpr std::uint32_t kBm = S::kBm, kBn = S::kBn, kMi = S::kMi, kNi = S::kNi;
  constexpr std::uint32_t kHalf = kNi / 2;  // gate|up: a warp's gate fragments, then its up ones
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* sa = smem;
  unsigned char* sb = sa + S::kStages * kBm * kBk * 2;
  unsigned char* sb_wide = sb + S::kStages * kBn * kBk;  // FP8: the widened stage
  auto* s_src = reinterpret_cast<std::uint32_t*>(
      sb + (kFp8 ? S::kStages * kBn * kBk + kBn * kBk * 2 : S::kStages * kBn * kBk * 2));
  std::uint32_t* s_pair = s_src + kBm;
  __shared__ std::uint32_t s_block[3];  // expert, first row, end row

  const unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  wait_for_previous_kernel();

  // Which expert and row tile this block is: a scan of the active experts' tile counts.
  if (warp == 0) {
    const std::uint32_t b = blockIdx.x;
    const std::uint32_t active = p.active[0];
    std::uint32_t seen = 0, expert = kNoRow, first = 0, end = 0;
    for (std::uint32_t base = 0; base < active; base += 32) {
      const std::uint32_t i = base + lane;
      std::uint32_t e = 0, begin = 0, stop = 0, tiles = 0;
      if (i < active) {
        e = p.active[1 + i];
        begin = p.offsets[e];
        stop = p.offsets[e + 1];
        tiles = (stop - begin + kBm - 1) / kBm;
      }
      std::uint32_t inclusive = tiles;
      for (unsigned offset = 1; offset < 32; offset <<= 1) {
        const std::uint32_t v = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += v;
      }
      const bool hit = i < active && b >= seen + inclusive - tiles && b < seen + inclusive;
      const unsigned ballot = __ballot_sync(0xffffffffu, hit);
      if (ballot != 0) {
        const int owner = __ffs(ballot) - 1;
        const std::uint32_t tile = b - seen - (inclusive - tiles);
        const std::uint32_t row0 = begin + tile * kBm;
        expert = __shfl_sync(0xffffffffu, e, owner);
        first = __shfl_sync(0xffffffffu, row0, owner);
        end = __shfl_sync(0xffffffffu, stop, owner);
        break;
      }
      seen += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    if (lane == 0) {
      s_block[0] = expert;
      s_block[1] = first;
      s_block[2] = end < first + kBm ? end : first + kBm;
    }
  }
  __syncthreads();
  const std::uint32_t expert = s_block[0];
  if (expert == kNoRow) return;
  const std::uint32_t row_first = s_block[1], row_end = s_block[2];
  const std::uint32_t row_count = row_end - row_first;

  // The tile's A rows: the source row (x's token or act's row) and the pair, kNoRow for none.
  for (std::uint32_t i = tid; i < kBm; i += S::kThreads) {
    std::uint32_t src = kNoRow, pair = kNoRow;
    if (i < row_count) {
      pair = p.rows[row_first + i];
      if (pair != kMoePadRow) src = kGateUp ? pair / p.top_k : row_first + i;
    }
    s_src[i] = src;
    s_pair[i] = pair == kMoePadRow ? kNoRow : pair;
  }
  __syncthreads();

  const std::uint32_t k_total = P::k(p), outputs = P::outputs(p);
  const std::uint32_t out0 = blockIdx.y * block_outputs<kGateUp, S>();
  const T* a_base = static_cast<const T*>(P::a(p));
  const unsigned char* w_base = static_cast<const unsigned char*>(P::weights(p, expert));
  const std::uint32_t w_row_bytes = kFp8 ? k_total : k_total * 2;
  // Weight row of tile row j, or kNoRow past the outputs.
  const auto weight_row = [&](std::uint32_t j) -> std::uint32_t {
    if constexpr (kGateUp) {
      const std::uint32_t o = out0 + (j < kBn / 2 ? j : j - kBn / 2);
      return o < outputs ? (j < kBn / 2 ? o : p.inter + o) : kNoRow;
    } else {
      return out0 + j < outputs ? out0 + j : kNoRow;
    }
  };

  const std::uint32_t k_tiles = (k_total + kBk - 1) / kBk;
  const auto load_stage = [&](std::uint32_t kt) {
    const std::uint32_t stage = kt % S::kStages;
    const std::uint32_t k0 = kt * kBk;
    unsigned char* a_stage = sa + stage * kBm * kBk * 2;
    for (std::uint32_t c = tid; c < kBm * 8; c += S::kThreads) {
      const std::uint32_t row = c / 8, chunk = c % 8, k = k0 + chunk * 8;
      const std::uint32_t src = s_src[row];
      const bool live = src != kNoRow && k < k_total;
      const T* from = live ? a_base + static_cast<std::uint64_t>(src) * k_total + k : a_base;
      copy_async_16(a_stage + swizzled(row, chunk), from, live);
    }
    if constexpr (kFp8) {
      unsigned char* b_stage = sb + stage * kBn * kBk;
      for (std::uint32_t c = tid; c < kBn * 4; c += S::kThreads) {
        const std::uint32_t row = c / 4, chunk = c % 4, k = k0 + chunk * 16;
        const std::uint32_t w_row = weight_row(row);
        const bool live = w_row != kNoRow && k < k_total;
        const unsigned char* from =
            live ? w_base + static_cast<std::uint64_t>(w_row) * w_row_bytes + k : w_base;
        copy_async_16(b_stage + row * kBk + chunk * 16, from, live);
      }
    } else {
      unsigned char* b_stage = sb + stage * kBn * kBk * 2;
      for (std::uint32_t c = tid; c < kBn * 8; c += S::kThreads) {
        const std::uint32_t row = c / 8, chunk = c % 8, k = k0 + chunk * 8;
        const std::uint32_t w_row = weight_row(row);
        const bool live = w_row != kNoRow && k < k_total;
        const unsigned char* from =
            live ? w_base + static_cast<std::uint64_t>(w_row) * w_row_bytes + k * 2 : w_base;
        copy_async_16(b_stage + swizzled(row, chunk), from, live);
      }
    }
  };

  const unsigned wm = warp / S::kWn, wn = warp % S::kWn;
  // Tile row of this warp's B fragment f (its first of 8 rows).
  const auto b_row = [&](std::uint32_t f) -> std::uint32_t {
    if constexpr (kGateUp) {
      return f < kHalf ? wn * (S::kTn / 2) + 8 * f : kBn / 2 + wn * (S::kTn / 2) + 8 * (f - kHalf);
    } else {
      return wn * S::kTn + 8 * f;
    }
  };

  float acc[kMi][kNi][4];
  float total[kFp8 ? kMi : 1][kFp8 ? kNi : 1][4];
#pragma unroll
  for (std::uint32_t mi = 0; mi < kMi; ++mi) {
#pragma unroll
    for (std::uint32_t ni = 0; ni < kNi; ++ni) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mi][ni][i] = 0.0f;
    }
  }
  if constexpr (kFp8) {
#pragma unroll
    for (std::uint32_t mi = 0; mi < kMi; ++mi) {
#pragma unroll
      for (std::uint32_t ni = 0; ni < kNi; ++ni) {
#pragma unroll
        for (int i = 0; i < 4; ++i) total[mi][ni][i] = 0.0f;
      }
    }
  }
  // FP8: the weights' scales of this block's output rows (gate|up: the gate's and the up's).
  const float* scales = nullptr;
  std::uint32_t scale_first = 0, scale_second = 0;
  if constexpr (kFp8) {
    scales = P::scales(p, expert);
    const std::uint32_t scale_row = ((k_total + 127) / 128 + 3) / 4 * 4;
    scale_first = out0 / 128 * scale_row;
    scale_second = kGateUp ? (p.inter + out0) / 128 * scale_row : scale_first;
  }

#pragma unroll
  for (std::uint32_t s = 0; s + 1 < S::kStages; ++s) {
    if (s < k_tiles) load_stage(s);
    copy_async_commit();
  }
  for (std::uint32_t kt = 0; kt < k_tiles; ++kt) {
    copy_async_wait<S::kStages - 2>();
    __syncthreads();
    if (kt + S::kStages - 1 < k_tiles) load_stage(kt + S::kStages - 1);
    copy_async_commit();
    const std::uint32_t stage = kt % S::kStages;
    const unsigned char* a_stage = sa + stage * kBm * kBk * 2;
    const unsigned char* b_stage;
    if constexpr (kFp8) {
      const unsigned char* raw = sb + stage * kBn * kBk;
      for (std::uint32_t c = tid; c < kBn * 4; c += S::kThreads) {
        const std::uint32_t row = c / 4, chunk = c % 4;
        uint4 low, high;
        widen16<T>(*reinterpret_cast<const uint4*>(raw + row * kBk + chunk * 16), low, high);
        *reinterpret_cast<uint4*>(sb_wide + swizzled(row, 2 * chunk)) = low;
        *reinterpret_cast<uint4*>(sb_wide + swizzled(row, 2 * chunk + 1)) = high;
      }
      __syncthreads();
      b_stage = sb_wide;
    } else {
      b_stage = sb + stage * kBn * kBk * 2;
    }
    const std::uint32_t a_smem = shared_address(a_stage), b_smem = shared_address(b_stage);
#pragma unroll
    for (std::uint32_t ks = 0; ks < kBk / 16; ++ks) {
      std::uint32_t a[kMi][4], b[kNi][2];
#pragma unroll
      for (std::uint32_t mi = 0; mi < kMi; ++mi) {
        const std::uint32_t row = wm * S::kTm + mi * 16 + lane % 16;
        ldmatrix_x4(a[mi], a_smem + swizzled(row, ks * 2 + lane / 16));
      }
#pragma unroll
      for (std::uint32_t nj = 0; nj < kNi / 2; ++nj) {
        const std::uint32_t matrix = lane / 8;
        const std::uint32_t row = b_row(2 * nj + matrix / 2) + lane % 8;
        std::uint32_t r[4];
        ldmatrix_x4(r, b_smem + swizzled(row, ks * 2 + matrix % 2));
        b[2 * nj][0] = r[0];
        b[2 * nj][1] = r[1];
        b[2 * nj + 1][0] = r[2];
        b[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (std::uint32_t mi = 0; mi < kMi; ++mi) {
#pragma unroll
        for (std::uint32_t ni = 0; ni < kNi; ++ni) mma_m16n8k16<T>(acc[mi][ni], a[mi], b[ni]);
      }
    }
    if constexpr (kFp8) {
      // A 128-K block ends every second stage (or at K's end): scale its sums into the total.
      if (kt % 2 == 1 || kt + 1 == k_tiles) {
        const std::uint32_t kb = kt / 2;
        const float first_scale = __ldg(scales + scale_first + kb);
        const float second_scale = __ldg(scales + scale_second + kb);
#pragma unroll
        for (std::uint32_t mi = 0; mi < kMi; ++mi) {
#pragma unroll
          for (std::uint32_t ni = 0; ni < kNi; ++ni) {
            const float scale = kGateUp && ni >= kHalf ? second_scale : first_scale;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              total[mi][ni][i] = fmaf(acc[mi][ni][i], scale, total[mi][ni][i]);
              acc[mi][ni][i] = 0.0f;
            }
          }
        }
      }
    }
  }
  copy_async_wait<0>();

  if constexpr (kFp8) {
#pragma unroll
    for (std::uint32_t mi = 0; mi < kMi; ++mi) {
#pragma unroll
      for (std::uint32_t ni = 0; ni < kNi; ++ni) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mi][ni][i] = total[mi][ni][i];
      }
    }
  } else {
    (void)total;
  }
  const auto result = [&](std::uint32_t mi, std::uint32_t ni, int i) { return acc[mi][ni][i]; };
  const unsigned group = lane / 4, quad = lane % 4;
  if constexpr (kGateUp) {
    T* act = static_cast<T*>(p.act);
#pragma unroll
    for (std::uint32_t mi = 0; mi < kMi; ++mi) {
#pragma unroll
      for (std::uint32_t f = 0; f < kHalf; ++f) {
        const std::uint32_t col = out0 + wn * (S::kTn / 2) + 8 * f + 2 * quad;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const std::uint32_t local = wm * S::kTm + mi * 16 + group + 8 * h;
          if (local >= row_count || col >= outputs) continue;
          float v[2];
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float gate = rounded<T>(result(mi, f, 2 * h + c));
            const float up = rounded<T>(result(mi, f + kHalf, 2 * h + c));
            const float silu = rounded<T>(gate / (1.0f + expf(-gate)));
            v[c] = s_pair[local] == kNoRow ? 0.0f : silu * up;
          }
          *reinterpret_cast<std::uint32_t*>(
              act + static_cast<std::uint64_t>(row_first + local) * outputs + col) =
              pack_float2<T>(v[0], v[1]);
        }
      }
    }
  } else {
    T* pairs = static_cast<T*>(p.pairs);
#pragma unroll
    for (std::uint32_t mi = 0; mi < kMi; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const std::uint32_t local = wm * S::kTm + mi * 16 + group + 8 * h;
        if (local >= row_count) continue;
        const std::uint32_t pair = s_pair[local];
        if (pair == kNoRow) continue;
        const float weight = rounded<T>(p.weights[pair]);
#pragma unroll
        for (std::uint32_t ni = 0; ni < kNi; ++ni) {
          const std::uint32_t col = out0 + wn * S::kTn + 8 * ni + 2 * quad;
          if (col >= outputs) continue;
          const float y0 = rounded<T>(result(mi, ni, 2 * h)) * weight;
          const float y1 = rounded<T>(result(mi, ni, 2 * h + 1)) * weight;
          *reinterpret_cast<std::uint32_t*>(pairs + static_cast<std::uint64_t>(pair) * outputs +
                                            col) = pack_float2<T>(y0, y1);
        }
      }
    }
  }
}

// out[t] = round(sum over j of pairs[t * top_k + j]) (+ the shared expert's term), one thread a
// vector of 8 outputs.
template <typename T>
__global__ void __launch_bounds__(256) moe_combine_kernel(const MoeDownParams p) {
  allow_next_kernel_to_start();
  wait_for_previous_kernel();
  const std::uint32_t vectors = p.hidden / 8;
  const std::uint64_t index = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= static_cast<std::uint64_t>(p.tokens) * vectors) return;
  const std::uint32_t token = static_cast<std::uint32_t>(index / vectors);
  const std::uint32_t v = static_cast<std::uint32_t>(index % vectors);
  float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::uint32_t j = 0; j < p.top_k; ++j) {
    const std::uint64_t row = static_cast<std::uint64_t>(token) * p.top_k + j;
    const uint4 y =
        *(reinterpret_cast<const uint4*>(static_cast<const T*>(p.pairs) + row * p.hidden) + v);
    const T* e = reinterpret_cast<const T*>(&y);
#pragma unroll
    for (int i = 0; i < 8; ++i) sum[i] += to_float<T>(e[i]);
  }
  uint4 result;
  T* r = reinterpret_cast<T*>(&result);
  if (p.shared != nullptr) {
    const float g = to_float<T>(static_cast<const T*>(p.shared_gate)[token]);
    const float gate = rounded<T>(1.0f / (1.0f + expf(-g)));
    const uint4 s = *(reinterpret_cast<const uint4*>(static_cast<const T*>(p.shared) +
                                                     static_cast<std::uint64_t>(token) * p.hidden) +
                      v);
    const T* se = reinterpret_cast<const T*>(&s);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      r[i] = from_float<T>(rounded<T>(sum[i]) + rounded<T>(gate * to_float<T>(se[i])));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) r[i] = from_float<T>(sum[i]);
  }
  *(reinterpret_cast<uint4*>(static_cast<T*>(p.out) +
                             static_cast<std::uint64_t>(token) * p.hidden) +
    v) = result;
}

// The host's side: a tile from the rows each reachable expert gets on average (or the forced
// block_rows), the grid from `tokens` alone.
template <typename T, bool kGateUp, bool kFp8, typename S, typename Params>
Status launch_tiled(const Params& p, std::uint32_t pairs, std::uint32_t reach,
                    cudaStream_t stream) {
  const auto kernel = moe_gemm_kernel<T, kGateUp, kFp8, S>;
  constexpr std::uint32_t kShared = shared_bytes<T, kFp8, S>();
  auto residency =
      prepare_kernel(reinterpret_cast<const void*>(kernel), static_cast<int>(S::kThreads), kShared);
  if (!residency.ok()) return residency.status();
  constexpr std::uint32_t kOutputs = block_outputs<kGateUp, S>();
  const std::uint32_t outputs = kGateUp ? p.inter : p.hidden;
  const dim3 grid(pairs / S::kBm + reach, (outputs + kOutputs - 1) / kOutputs);
  return cuda_status("cudaLaunchKernelEx(moe_gemm_kernel)",
                     launch_overlapping(kernel, grid, S::kThreads, kShared, stream, p));
}

template <bool kGateUp, bool kFp8, typename Params>
Status launch_gemm(const Params& p, cudaStream_t stream) {
  const std::uint32_t pairs = p.tokens * p.top_k;
  const std::uint32_t reach = pairs < p.experts ? pairs : p.experts;
  const std::uint32_t per_expert = (pairs + reach - 1) / reach;
  std::uint32_t rows = p.block_rows;
  if (rows == 0) rows = per_expert <= 16 ? 16 : (per_expert <= 64 ? 64 : 128);
  const auto with_tile = [&](auto tile) -> Status {
    using S = decltype(tile);
    return p.element == DType::kFp16
               ? launch_tiled<__half, kGateUp, kFp8, S>(p, pairs, reach, stream)
               : launch_tiled<__nv_bfloat16, kGateUp, kFp8, S>(p, pairs, reach, stream);
  };
  switch (rows) {
    case 16:
      return with_tile(SmallTile{});
    case 64:
      return with_tile(MediumTile{});
    default:
      return with_tile(LargeTile{});
  }
}

// The FP8 instantiations live in moe_gemm_fp8.cu (compiled beside the 16-bit ones).
Status launch_gate_up_fp8(const MoeGateUpParams& p, cudaStream_t stream);
Status launch_down_fp8(const MoeDownParams& p, cudaStream_t stream);

}  // namespace moe
}  // namespace kernels
}  // namespace kvvm
