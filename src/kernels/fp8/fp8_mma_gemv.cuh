// The FP8 GEMV on the tensor cores (fp8_gemv_cuda with quantized activations,
// include/kvvm/kernels/fp8_kernels.h): y[r][n] = sum over k of dq(xq)[r][k] * dq(w)[n][k] for up to
// 8 rows, each warp a tile of 16 outputs, the rows being the 8 columns of mma.m16n8k32 e4m3.
//
// Why: widening e4m3 weights on the CUDA cores costs about four instructions a byte (the
// widening GEMV runs at 62-94 % of a copy's rate, bound by its instructions, and its cost grows
// with the rows); one MMA multiplies 512 weights by 8 rows, so the loop is loads and little
// else and 8 rows read the weights once.
//
// The k order inside a tile is a permutation both operands share: a 64-byte step of the row
// is lane quad's 16 bytes [16 quad, 16 quad + 16), of which bytes 0-7 are the first MMA's
// k-slots (4quad..+3, 16 + 4quad..+3) and 8-15 the second's; the activations' 16 bytes at the
// same place give the B fragments. So each lane reads two whole 16-byte vectors of weights (rows
// group and group + 8 of the tile) and one of its activation row per step, no shuffles.
//
// Sums: each step's 64 products are summed by the tensor core into a zeroed fragment, then
// scaled (block-scaled: the weights' 128 x 128 block scale times the row's group-of-128
// scale) and added in float32, so the tensor core never holds a long running sum (its
// accumulation keeps fewer bits than float32). kSplit warps share a tile, each taking every
// kSplit-th step, their sums added in warp order; a per-channel sum is scaled once at the end.
// The order is fixed by (in, out) and the split, itself chosen from the shape.
#pragma once

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/mma.cuh"
#include "kvvm/kernels/fp8_kernels.h"

namespace kvvm {
namespace kernels {

inline constexpr unsigned kMmaGemvThreads = 256;
inline constexpr unsigned kMmaGemvWarps = kMmaGemvThreads / 32;
inline constexpr unsigned kMmaTileOutputs = 16;

// kSteps 64-byte steps (two weight vectors each) in flight per lane.
template <typename T, unsigned kSplit, unsigned kSteps, bool kBlock>
__global__ void __launch_bounds__(kMmaGemvThreads) fp8_mma_gemv_kernel(const Fp8GemvArgs p) {
  constexpr unsigned kTiles = kMmaGemvWarps / kSplit;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned group = lane / 4, quad = lane % 4;
  const std::uint32_t tile = blockIdx.x * kTiles + warp / kSplit;
  const unsigned part = warp % kSplit;
  const std::uint32_t vectors = p.in / 16;  // 16-byte vectors a row
  const std::uint32_t steps = (vectors + 3) / 4;
  const std::uint32_t row_lo = tile * kMmaTileOutputs + group, row_hi = row_lo + 8;
  // Rows past `out` read row 0 and are never stored; x rows past `rows` read as zeros.
  const uint4* w = static_cast<const uint4*>(p.weight);
  const uint4* w_lo = w + static_cast<std::uint64_t>(row_lo < p.out ? row_lo : 0) * vectors + quad;
  const uint4* w_hi = w + static_cast<std::uint64_t>(row_hi < p.out ? row_hi : 0) * vectors + quad;
  const bool x_row = group < p.rows;
  const uint4* xq =
      static_cast<const uint4*>(p.xq) + static_cast<std::uint64_t>(group) * vectors + quad;
  const unsigned col0 = 2 * quad, col1 = col0 + 1;  // this lane's C columns: rows of x
  const bool tile_live = tile * kMmaTileOutputs < p.out;
  const std::uint32_t blocks_in = (p.in + kFp8Block - 1) / kFp8Block;
  const float* w_scales =
      p.scales + static_cast<std::uint64_t>(tile * kMmaTileOutputs / kFp8Block) *
                     ((blocks_in + 3) / 4 * 4);  // the store's padded row of blocks

  // One round of kSteps steps: the weights and their block scales (they never depend on the
  // previous kernel, so the first round's are requested before the wait), then the
  // activations and theirs (that kernel's output: coherent loads). The scales travel with their
  // step, a round ahead, so no step waits on a scale's load.
  struct Round {
    uint4 lo[kSteps], hi[kSteps], x[kSteps];
    float ws[kSteps], xs0[kSteps], xs1[kSteps];
  };
  const auto live = [&](std::uint32_t s) { return tile_live && s < steps; };
  const auto request = [&](std::uint32_t at, Round& r) {
#pragma unroll
    for (unsigned u = 0; u < kSteps; ++u) {
      const std::uint32_t s = at + u * kSplit;
      const bool in_row = live(s) && s * 4 + quad < vectors;
      r.lo[u] = in_row ? __ldcs(w_lo + s * 4) : make_uint4(0, 0, 0, 0);
      r.hi[u] = in_row ? __ldcs(w_hi + s * 4) : make_uint4(0, 0, 0, 0);
      if constexpr (kBlock) r.ws[u] = live(s) ? __ldg(w_scales + s / 2) : 0.0f;
    }
  };
  const auto activations = [&](std::uint32_t at, Round& r) {
#pragma unroll
    for (unsigned u = 0; u < kSteps; ++u) {
      const std::uint32_t s = at + u * kSplit;
      r.x[u] = live(s) && x_row && s * 4 + quad < vectors ? load_previous_output(xq + s * 4)
                                                          : make_uint4(0, 0, 0, 0);
      if constexpr (kBlock) {
        // The step's group of 128 along `in` is s / 2.
        const float* xs = p.x_scales + static_cast<std::uint64_t>(s / 2) * p.x_stride;
        r.xs0[u] = live(s) && col0 < p.rows ? load_previous_output(xs + col0) : 0.0f;
        r.xs1[u] = live(s) && col1 < p.rows ? load_previous_output(xs + col1) : 0.0f;
      }
    }
  };

  float total[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  Round current;
  request(part, current);
  wait_for_previous_kernel();
  activations(part, current);
  if (tile_live) {
    for (std::uint32_t at = part; at < steps; at += kSteps * kSplit) {
      Round next;
      request(at + kSteps * kSplit, next);
      activations(at + kSteps * kSplit, next);
#pragma unroll
      for (unsigned u = 0; u < kSteps; ++u) {
        const std::uint32_t s = at + u * kSplit;
        if (s >= steps) break;  // the same for every lane: the MMAs stay warp-wide
        const uint4 &lo = current.lo[u], &hi = current.hi[u], &x = current.x[u];
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const std::uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y};
        const std::uint32_t b0[2] = {x.x, x.y};
        mma_m16n8k32_e4m3(d, a0, b0);
        const std::uint32_t a1[4] = {lo.z, hi.z, lo.w, hi.w};
        const std::uint32_t b1[2] = {x.z, x.w};
        mma_m16n8k32_e4m3(d, a1, b1);
        if constexpr (kBlock) {
          const float s0 = current.ws[u] * current.xs0[u], s1 = current.ws[u] * current.xs1[u];
          total[0] = fmaf(d[0], s0, total[0]);
          total[1] = fmaf(d[1], s1, total[1]);
          total[2] = fmaf(d[2], s0, total[2]);
          total[3] = fmaf(d[3], s1, total[3]);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) total[i] += d[i];
        }
      }
      current = next;
    }
  }
  if constexpr (kSplit > 1) {
    __shared__ float partial[kMmaGemvWarps][4][32];
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][i][lane] = total[i];
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float sum = 0.0f;
#pragma unroll
      for (unsigned s = 0; s < kSplit; ++s) sum += partial[warp + s][i][lane];
      total[i] = sum;
    }
  }
  if (!tile_live) return;
    // total[0], total[1]: (row_lo, col0 / col1); total[2], total[3]: (row_hi, col0 / col1).
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::uint32_t row = i < 2 ? row_lo : row_hi;
    const unsigned col = i % 2 == 0 ? col0 : col1;
    if (row >= p.out || col >= p.rows) continue;
    float value = total[i];
    if constexpr (!kBlock) value *= __ldg(p.scales + row) * load_previous_output(p.x_scales + col);
    const std::uint64_t at = static_cast<std::uint64_t>(col) * p.out + row;
    if (p.bias != nullptr) {
      value += to_float<T>(static_cast<const T*>(p.bias)[row]);
    } else if (p.beta != 0.0f) {
      value += p.beta * to_float<T>(static_cast<const T*>(p.y)[at]);
    }
    static_cast<T*>(p.y)[at] = from_float<T>(value);
  }
}

}  // namespace kernels
}  // namespace kvvm
