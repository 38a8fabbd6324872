// The permutation of (token, choice) pairs by expert (moe_permute_cuda,
// include/kvvm/kernels/moe_kernels.h): a stable counting sort in one block of 1024 threads, so
// one launch, no scratch and no host synchronisation.
//
// Why one block: a step routes at most a few tens of thousands of pairs, and a grid would need a
// second launch (or a grid-wide barrier) between the counts and the scatter; one block counts,
// scans and scatters with __syncthreads alone.
//
// Stability without a per-thread histogram: the pairs go through in chunks of 4096, warp w
// taking 4 consecutive groups of 32. Within a group, __match_any_sync gives each lane the lanes
// of its expert, so its rank is the lower ones among them plus what the warp already counted for
// that expert (wtab[w][e]); across warps, an exclusive scan of wtab's columns; across chunks, a
// per-expert cursor. Each pair's rank within its expert goes to slot_of_pair first; once every
// count is known, a scan turns counts into padded offsets and the ranks into rows. Every step is
// a fixed function of the ids, so the result is the same bits each time.
#include <cstdint>

#include "kernels/common.cuh"
#include "kvvm/kernels/moe_kernels.h"

namespace kvvm {
namespace kernels {
namespace {

constexpr unsigned kPermuteThreads = 1024;
constexpr unsigned kPermuteWarps = kPermuteThreads / 32;
constexpr unsigned kGroupsPerWarp = 4;
constexpr unsigned kChunk = kPermuteThreads * kGroupsPerWarp;

__global__ void __launch_bounds__(kPermuteThreads) moe_permute_kernel(const MoePermuteParams p) {
  allow_next_kernel_to_start();  // the grouped GEMM's blocks wait for this one
  // Counts of expert e in warp w's part of the chunk (at most 128: 16 bits), then their
  // exclusive scan over w (at most 4096).
  __shared__ std::uint16_t wtab[kPermuteWarps][kMoeMaxExperts];
  __shared__ std::uint32_t cursor[kMoeMaxExperts];  // pairs of e in the chunks before
  __shared__ std::uint32_t start[kMoeMaxExperts];   // e's first permuted row
  __shared__ std::uint32_t warp_total[2][kPermuteWarps];
  const unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const std::uint32_t pairs = p.tokens * p.top_k;
  const std::uint32_t experts = p.experts;
  for (unsigned i = tid; i < kPermuteWarps * kMoeMaxExperts; i += kPermuteThreads) {
    (&wtab[0][0])[i] = 0;
  }
  for (unsigned e = tid; e < kMoeMaxExperts; e += kPermuteThreads) cursor[e] = 0;
  wait_for_previous_kernel();
  __syncthreads();

  const unsigned lower_lanes = (1u << lane) - 1;
  for (std::uint32_t chunk = 0; chunk < pairs; chunk += kChunk) {
    std::uint32_t expert[kGroupsPerWarp], rank[kGroupsPerWarp];
#pragma unroll
    for (unsigned g = 0; g < kGroupsPerWarp; ++g) {
      const std::uint32_t pair = chunk + warp * 32 * kGroupsPerWarp + g * 32 + lane;
      std::uint32_t e = experts;  // no pair, or an id out of range: dropped
      if (pair < pairs) {
        const std::int32_t id = p.ids[pair];
        if (id >= 0 && static_cast<std::uint32_t>(id) < experts) e = static_cast<std::uint32_t>(id);
      }
      const unsigned peers = __match_any_sync(0xffffffffu, e);
      const bool live = e < experts;
      rank[g] = live ? __popc(peers & lower_lanes) + wtab[warp][e] : 0;
      expert[g] = e;
      __syncwarp();
      if (live && (peers & lower_lanes) == 0) {
        wtab[warp][e] = static_cast<std::uint16_t>(wtab[warp][e] + __popc(peers));
      }
      __syncwarp();
    }
    __syncthreads();
    std::uint32_t chunk_count = 0;
    if (tid < experts) {
      for (unsigned w = 0; w < kPermuteWarps; ++w) {
        const std::uint32_t c = wtab[w][tid];
        wtab[w][tid] = static_cast<std::uint16_t>(chunk_count);
        chunk_count += c;
      }
    }
    __syncthreads();
#pragma unroll
    for (unsigned g = 0; g < kGroupsPerWarp; ++g) {
      const std::uint32_t pair = chunk + warp * 32 * kGroupsPerWarp + g * 32 + lane;
      if (pair >= pairs) continue;
      const std::uint32_t e = expert[g];
      p.slot_of_pair[pair] = e < experts ? cursor[e] + wtab[warp][e] + rank[g] : kMoePadRow;
    }
    __syncthreads();
    if (tid < experts) cursor[tid] += chunk_count;
    for (unsigned i = tid; i < kPermuteWarps * kMoeMaxExperts; i += kPermuteThreads) {
      (&wtab[0][0])[i] = 0;
    }
    __syncthreads();
  }

  // Offsets (each count padded to the tile) and the active list: two block-wide exclusive
  // scans over the experts, one value per thread.
  const std::uint32_t count = tid < experts ? cursor[tid] : 0;
  const std::uint32_t padded = (count + p.tile - 1) & ~(p.tile - 1);
  const std::uint32_t flag = count > 0 ? 1 : 0;
  std::uint32_t rows_incl = padded, active_incl = flag;
  for (unsigned offset = 1; offset < 32; offset <<= 1) {
    const std::uint32_t r = __shfl_up_sync(0xffffffffu, rows_incl, offset);
    const std::uint32_t a = __shfl_up_sync(0xffffffffu, active_incl, offset);
    if (lane >= offset) {
      rows_incl += r;
      active_incl += a;
    }
  }
  if (lane == 31) {
    warp_total[0][warp] = rows_incl;
    warp_total[1][warp] = active_incl;
  }
  __syncthreads();
  std::uint32_t rows_before = 0, active_before = 0;
  for (unsigned w = 0; w < warp; ++w) {
    rows_before += warp_total[0][w];
    active_before += warp_total[1][w];
  }
  const std::uint32_t first = rows_before + rows_incl - padded;
  const std::uint32_t slot = active_before + active_incl - flag;
  if (tid < experts) {
    start[tid] = first;
    p.offsets[tid] = first;
    if (tid == experts - 1) {
      p.offsets[experts] = first + padded;
      p.active[0] = slot + flag;
    }
    if (flag != 0) p.active[1 + slot] = tid;
    for (std::uint32_t r = first + count; r < first + padded; ++r) p.rows[r] = kMoePadRow;
  }
  __syncthreads();
  for (std::uint32_t pair = tid; pair < pairs; pair += kPermuteThreads) {
    const std::int32_t id = p.ids[pair];
    if (id < 0 || static_cast<std::uint32_t>(id) >= experts) continue;
    const std::uint32_t row = start[id] + p.slot_of_pair[pair];
    p.slot_of_pair[pair] = row;
    p.rows[row] = pair;
  }
}

}  // namespace
}  // namespace kernels

Status moe_permute_cuda(const MoePermuteParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_moe_permute(p));
  if (p.tokens == 0) return Status::Ok();
  return kernels::cuda_status(
      "cudaLaunchKernelEx(moe_permute_kernel)",
      kernels::launch_overlapping(kernels::moe_permute_kernel, dim3(1), kernels::kPermuteThreads, 0,
                                  static_cast<cudaStream_t>(stream), p));
}

}  // namespace kvvm
