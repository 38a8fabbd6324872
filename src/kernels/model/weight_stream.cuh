// How the GEMVs (gemv_kernel.cu, fp8_kernels.cu) stream a weight matrix: each lane of a warp
// walks its share of one output's row of 16-byte vectors (first, first + stride, ...) with
// kUnroll loads in flight at every moment, the warp's count of warps per output (its split)
// is chosen from the shape alone, and the lanes' and warps' sums of an output are added in
// one fixed order.
//
// Why a pipeline: a decode step's GEMV is a pure read of its weights, so it runs at the
// memory's rate only while enough bytes are in the air. A lane requests its next round of
// kUnroll vectors before it multiplies the current one, and a round past the row's end is
// predicated off rather than run as a serial tail (one load, one wait, one use), so a
// lane's loads never drain to zero before its last use. The first round is requested before
// waiting for the previous kernel (programmatic dependent launch): weights never depend on it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common.cuh"

namespace kvvm {
namespace kernels {

// Round `at`: the vectors at, at + stride, ... (kUnroll of them) that lie below `vectors`;
// the others read as zeros and are never used.
template <unsigned kUnroll>
__device__ __forceinline__ void request_round(const uint4* w, std::uint32_t at,
                                              std::uint32_t stride, std::uint32_t vectors,
                                              uint4 (&round)[kUnroll]) {
#pragma unroll
  for (unsigned u = 0; u < kUnroll; ++u) {
    const std::uint32_t v = at + u * stride;
    round[u] = v < vectors ? __ldcs(w + v) : make_uint4(0, 0, 0, 0);
  }
}

// Calls use(vector, index) for each of the lane's vectors below `vectors`, in increasing
// index order (so the order of a lane's sums is fixed by the shape), after waiting for the
// previous kernel. Weights are read with the streaming hint: each is used once per step, and
// L1 stays for the activations every output re-reads.
template <unsigned kUnroll, typename Use>
__device__ __forceinline__ void stream_weights(const uint4* w, std::uint32_t first,
                                               std::uint32_t stride, std::uint32_t vectors,
                                               Use&& use) {
  uint4 current[kUnroll];
  request_round<kUnroll>(w, first, stride, vectors, current);
  wait_for_previous_kernel();
  for (std::uint32_t at = first; at < vectors; at += kUnroll * stride) {
    uint4 next[kUnroll];
    request_round<kUnroll>(w, at + kUnroll * stride, stride, vectors, next);
#pragma unroll
    for (unsigned u = 0; u < kUnroll; ++u) {
      if (at + u * stride < vectors) use(current[u], at + u * stride);
    }
#pragma unroll
    for (unsigned u = 0; u < kUnroll; ++u) current[u] = next[u];
  }
  // Every weight is in: the next kernel (a norm, RoPE, SiLU-mul, the argmax) may be scheduled
  // on the SMs this one leaves; it waits for this one before reading what it writes.
  allow_next_kernel_to_start();
}

// The sums of one output: each row's accumulator summed over the warp's lanes by a butterfly,
// then, with kSplit > 1, the kSplit warps' sums added by the output's first warp in warp order
// (through shared memory), so the order of every sum is fixed by the shape. `part` is the
// warp's place among its output's warps (warp % kSplit). Returns whether this warp holds the
// totals (every lane of the output's first warp); the others are done.
template <unsigned kRows, unsigned kSplit, unsigned kWarps>
__device__ __forceinline__ bool sum_output_partials(float (&acc)[kRows], unsigned warp,
                                                    unsigned part, unsigned lane) {
#pragma unroll
  for (unsigned r = 0; r < kRows; ++r) {
    for (int offset = 16; offset > 0; offset >>= 1) {
      acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
    }
  }
  if constexpr (kSplit > 1) {
    __shared__ float partial[kWarps][kRows];
    if (lane == 0) {
#pragma unroll
      for (unsigned r = 0; r < kRows; ++r) partial[warp][r] = acc[r];
    }
    __syncthreads();
    if (part != 0) return false;
#pragma unroll
    for (unsigned r = 0; r < kRows; ++r) {
      float total = 0.0f;
#pragma unroll
      for (unsigned s = 0; s < kSplit; ++s) total += partial[warp + s][r];
      acc[r] = total;
    }
  }
  return true;
}

// Warps per output (1, 2, 4 or 8), from the shape alone (so a row's sums run in one order
// whatever the batch): `requested` when it is one of those; else, with `lane_vectors`, the
// fewest that leave each lane at most that many of the row's `vectors`, or without it the
// fewest that put `want_warps` warps on the GPU. Measured (bench/gemv_bench): the 16-bit GEMV,
// a pure stream, runs fastest as many short warps; the FP8 one, which spends more instructions
// per byte widening its weights, with the fewest warps that fill about one wave.
__host__ __forceinline__ unsigned weight_stream_split(std::uint32_t out, std::uint32_t vectors,
                                                      std::uint32_t requested,
                                                      std::uint32_t lane_vectors,
                                                      std::uint64_t want_warps) {
  if (requested == 1 || requested == 2 || requested == 4 || requested == 8) return requested;
  unsigned split = 1;
  if (lane_vectors != 0) {
    while (split < 8 && vectors > std::uint64_t{lane_vectors} * 32 * split) split *= 2;
    return split;
  }
  while (split < 8 && std::uint64_t{out} * split < want_warps) split *= 2;
  return split;
}

// Vectors a lane keeps in flight (twice that while the next round lands): 4, or 8 when
// `requested` (only for up to kWideRows rows). Measured on an H200 (bench/gemv_bench): 8 takes
// enough registers to halve the warps an SM holds, and lost on every Llama-3-8B and -70B shape.
inline constexpr std::uint32_t kWideRows = 2;
__host__ __forceinline__ unsigned weight_stream_unroll(std::uint32_t requested) {
  return requested == 8 ? 8 : 4;
}

// The whole shape (kRows rows rounded up to 1, 2, 4, 8 or 16; kSplit; kUnroll) as
// compile-time constants: calls launch(rows, split, unroll) with std::integral_constants.
template <unsigned kRows, unsigned kUnroll, typename Launch>
cudaError_t dispatch_split(unsigned split, Launch& launch) {
  using Rows = std::integral_constant<unsigned, kRows>;
  using Unroll = std::integral_constant<unsigned, kUnroll>;
  switch (split) {
    case 1:
      return launch(Rows{}, std::integral_constant<unsigned, 1>{}, Unroll{});
    case 2:
      return launch(Rows{}, std::integral_constant<unsigned, 2>{}, Unroll{});
    case 4:
      return launch(Rows{}, std::integral_constant<unsigned, 4>{}, Unroll{});
    default:
      return launch(Rows{}, std::integral_constant<unsigned, 8>{}, Unroll{});
  }
}
template <typename Launch>
cudaError_t dispatch_weight_stream(std::uint32_t rows, unsigned split, unsigned unroll,
                                   Launch&& launch) {
  if (rows <= 1) {
    return unroll == 4 ? dispatch_split<1, 4>(split, launch) : dispatch_split<1, 8>(split, launch);
  }
  if (rows <= 2) {
    return unroll == 4 ? dispatch_split<2, 4>(split, launch) : dispatch_split<2, 8>(split, launch);
  }
  if (rows <= 4) return dispatch_split<4, 4>(split, launch);
  if (rows <= 8) return dispatch_split<8, 4>(split, launch);
  return dispatch_split<16, 4>(split, launch);
}

}  // namespace kernels
}  // namespace kvvm
