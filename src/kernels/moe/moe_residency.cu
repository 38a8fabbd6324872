// The expert residency cache's device side (moe_residency_cuda,
// include/kvvm/kernels/moe_kernels.h): a one-block plan and a grid that copies the misses.
//
// Why one block for the plan: a layer wants at most kMoeMaxExperts experts and the cache holds a
// few thousand slots, so one block counts, ranks and picks victims with __syncthreads alone and
// no second launch. Each victim is a block-wide minimum over the evictable slots: every thread
// keeps the best of its own slots (s = thread, thread + 1024, ...), the block reduces them, and
// only the winner's owner rescans its slots before the next miss (the winner now holds a wanted
// expert, which no later miss of this layer may take). A layer that hits everything skips the
// victim search.
//
// Why the copy reads host memory from the SMs: a copy engine transfer must be issued by the host
// with its addresses known at issue (or at capture), but which expert misses, and into which
// slot, is known only on the device. Pinned host memory mapped into the device's address space
// is read by ordinary loads that cross the bus; enough of them in flight (a grid of every SM,
// four 16-byte loads per thread) keep the link as busy as a copy engine would.
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/launch_support.cuh"
#include "kvvm/kernels/moe_kernels.h"

namespace kvvm {
namespace kernels {
namespace {

constexpr unsigned kPlanThreads = 1024;
constexpr unsigned kPlanWarps = kPlanThreads / 32;
constexpr unsigned kCopyThreads = 256;
constexpr unsigned kCopyUnroll = 4;
constexpr unsigned kCopyBlocksPerSm = 2;

__device__ __forceinline__ std::uint64_t global_ns() {
  std::uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

// A candidate for eviction; the order ExpertCache's std::set keeps (count, last use, slot).
struct Victim {
  std::uint64_t count;
  std::uint64_t last_use;
  std::uint32_t slot;
};
__device__ __forceinline__ Victim no_victim() {
  return {~std::uint64_t{0}, ~std::uint64_t{0}, kMoeNoSlot};
}
__device__ __forceinline__ bool lower(const Victim& a, const Victim& b) {
  if (a.count != b.count) return a.count < b.count;
  if (a.last_use != b.last_use) return a.last_use < b.last_use;
  return a.slot < b.slot;
}
__device__ __forceinline__ Victim warp_lowest(Victim v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const Victim other{__shfl_xor_sync(0xffffffffu, v.count, offset),
                       __shfl_xor_sync(0xffffffffu, v.last_use, offset),
                       __shfl_xor_sync(0xffffffffu, v.slot, offset)};
    if (lower(other, v)) v = other;
  }
  return v;
}

// Whether expert index `holder` is wanted by this plan's layer (so no miss may evict it).
__device__ __forceinline__ bool wanted_here(const MoeResidencyParams& p, const std::uint32_t* rows,
                                            std::uint32_t holder) {
  return holder / p.experts == p.layer && rows[holder % p.experts] != 0;
}

// The lowest evictable slot among s = tid, tid + kPlanThreads, ...
__device__ Victim own_lowest(const MoeResidencyParams& p, const std::uint32_t* rows, unsigned tid) {
  Victim best = no_victim();
  for (std::uint32_t s = tid; s < p.slots; s += kPlanThreads) {
    const std::uint32_t h = p.holder[s];
    if (wanted_here(p, rows, h)) continue;
    const Victim v{p.count[h], p.last_use[h], s};
    if (lower(v, best)) best = v;
  }
  return best;
}

__device__ __forceinline__ void mirror_counters(const MoeResidencyParams& p) {
  if (p.mirror == nullptr) return;
  volatile MoeResidencyCounters* m = p.mirror;
  m->acquisitions = p.counters->acquisitions;
  m->lookups = p.counters->lookups;
  m->hits = p.counters->hits;
  m->misses = p.counters->misses;
  m->bytes_copied = p.counters->bytes_copied;
  m->copy_ns = p.counters->copy_ns;
}

__global__ void __launch_bounds__(kPlanThreads)
    moe_residency_plan_kernel(const MoeResidencyParams p) {
  __shared__ std::uint32_t rows[kMoeMaxExperts];
  __shared__ std::uint32_t missed[kMoeMaxExperts];  // the misses' experts, ascending
  __shared__ std::uint32_t warp_misses[kPlanWarps];
  __shared__ Victim warp_best[kPlanWarps];
  __shared__ Victim winner;
  __shared__ std::uint64_t now;
  const unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (unsigned e = tid; e < kMoeMaxExperts; e += kPlanThreads) rows[e] = 0;
  allow_next_kernel_to_start();  // the copy's blocks wait for this one
  wait_for_previous_kernel();
  if (tid == 0) now = ++p.counters->acquisitions;
  __syncthreads();
  const std::uint64_t all = std::uint64_t{p.sparse_layers} * p.experts;
  if (now % p.decay_every == 0) {
    for (std::uint64_t i = tid; i < all; i += kPlanThreads) p.count[i] /= 2;
  }
  const std::uint32_t pairs = p.tokens * p.top_k;
  for (std::uint32_t i = tid; i < pairs; i += kPlanThreads) {
    const std::int32_t id = load_previous_output(p.ids + i);
    if (id >= 0 && static_cast<std::uint32_t>(id) < p.experts) atomicAdd(&rows[id], 1u);
  }
  __syncthreads();

  // Hits and misses: thread e looks after expert e (experts <= kMoeMaxExperts < kPlanThreads).
  const std::uint32_t index = p.layer * p.experts + tid;
  const bool wanted = tid < p.experts && rows[tid] != 0;
  bool miss = false;
  if (wanted) {
    p.count[index] += rows[tid];
    p.last_use[index] = now;
    miss = p.slot_of[index] == kMoeNoSlot;
  }
  const unsigned ballot = __ballot_sync(0xffffffffu, miss);
  if (lane == 0) warp_misses[warp] = __popc(ballot);
  const int wanted_total = __syncthreads_count(wanted);
  std::uint32_t rank = __popc(ballot & ((1u << lane) - 1));
  for (unsigned w = 0; w < warp; ++w) rank += warp_misses[w];
  std::uint32_t misses = 0;
  for (unsigned w = 0; w < kPlanWarps; ++w) misses += warp_misses[w];
  if (miss) missed[rank] = tid;
  __syncthreads();

  if (misses > 0) {
    Victim mine = own_lowest(p, rows, tid);
    for (std::uint32_t m = 0; m < misses; ++m) {
      const Victim best = warp_lowest(mine);
      if (lane == 0) warp_best[warp] = best;
      __syncthreads();
      if (warp == 0) {
        const Victim v = warp_lowest(warp_best[lane]);
        if (lane == 0) {
          // slots >= experts and this layer's wanted are all out of the running: one remains.
          const std::uint32_t slot = v.slot;
          const std::uint32_t expert = p.layer * p.experts + missed[m];
          p.slot_of[p.holder[slot]] = kMoeNoSlot;
          p.holder[slot] = expert;
          p.slot_of[expert] = slot;
          p.copy_list[2 * m] = slot;
          p.copy_list[2 * m + 1] = expert;
          winner = v;
        }
      }
      __syncthreads();
      if (winner.slot % kPlanThreads == tid) mine = own_lowest(p, rows, tid);
    }
  }

  if (wanted) {
    const std::uint64_t at = reinterpret_cast<std::uint64_t>(p.first_slot) +
                             std::uint64_t{p.slot_of[index]} * p.expert_bytes;
    p.tables[tid] = at + p.gate_up_offset;
    p.tables[p.experts + tid] = at + p.down_offset;
    if (p.gate_up_scale_offset != kMoeNoOffset) {
      p.tables[2 * p.experts + tid] = at + p.gate_up_scale_offset;
    }
    if (p.down_scale_offset != kMoeNoOffset) {
      p.tables[3 * p.experts + tid] = at + p.down_scale_offset;
    }
  }
  if (tid == 0) {
    MoeResidencyCounters* c = p.counters;
    c->lookups += static_cast<std::uint32_t>(wanted_total);
    c->hits += static_cast<std::uint32_t>(wanted_total) - misses;
    c->misses += misses;
    c->bytes_copied += std::uint64_t{misses} * p.expert_bytes;
    c->copies = misses;
    c->planned_at = global_ns();
    mirror_counters(p);
  }
}

__global__ void __launch_bounds__(kCopyThreads)
    moe_residency_copy_kernel(const MoeResidencyParams p) {
  // No allow_next_kernel_to_start: the permutation, and so the grouped GEMMs, start after every
  // byte is in its slot.
  wait_for_previous_kernel();
  const std::uint32_t copies = load_previous_output(&p.counters->copies);
  if (copies == 0) return;
  const std::uint64_t per = p.expert_bytes / 16;
  const std::uint64_t total = copies * per;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * kCopyThreads;
  const auto* from = static_cast<const uint4*>(p.staging);
  auto* to = static_cast<uint4*>(p.first_slot);
  for (std::uint64_t first = std::uint64_t{blockIdx.x} * kCopyThreads + threadIdx.x; first < total;
       first += stride * kCopyUnroll) {
    uint4 v[kCopyUnroll];
    std::uint64_t at[kCopyUnroll];
#pragma unroll
    for (unsigned u = 0; u < kCopyUnroll; ++u) {
      const std::uint64_t i = first + u * stride;
      if (i >= total) continue;
      const std::uint64_t c = i / per, within = i - c * per;
      const std::uint32_t slot = load_previous_output(p.copy_list + 2 * c);
      const std::uint32_t expert = load_previous_output(p.copy_list + 2 * c + 1);
      v[u] = __ldcs(from + std::uint64_t{expert} * per + within);
      at[u] = std::uint64_t{slot} * per + within;
    }
#pragma unroll
    for (unsigned u = 0; u < kCopyUnroll; ++u) {
      if (first + u * stride < total) to[at[u]] = v[u];
    }
  }
  // The last block to finish counts the stall: from the plan's end to the last byte written.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&p.counters->finished_blocks, 1u) == gridDim.x - 1) {
      MoeResidencyCounters* c = p.counters;
      c->copy_ns += global_ns() - c->planned_at;
      c->finished_blocks = 0;
      mirror_counters(p);
    }
  }
}

}  // namespace
}  // namespace kernels

Status moe_residency_cuda(const MoeResidencyParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_moe_residency(p));
  if (p.tokens == 0) return Status::Ok();
  const auto s = static_cast<cudaStream_t>(stream);
  KVVM_RETURN_IF_ERROR(
      kernels::cuda_status("cudaLaunchKernelEx(moe_residency_plan_kernel)",
                           kernels::launch_overlapping(kernels::moe_residency_plan_kernel, dim3(1),
                                                       kernels::kPlanThreads, 0, s, p)));
  KVVM_ASSIGN_OR_RETURN(
      const kernels::Residency residency,
      kernels::prepare_kernel(reinterpret_cast<const void*>(kernels::moe_residency_copy_kernel),
                              kernels::kCopyThreads, 0));
  const unsigned blocks =
      static_cast<unsigned>(residency.multiprocessors) * kernels::kCopyBlocksPerSm;
  return kernels::cuda_status(
      "cudaLaunchKernelEx(moe_residency_copy_kernel)",
      kernels::launch_overlapping(kernels::moe_residency_copy_kernel, dim3(blocks),
                                  kernels::kCopyThreads, 0, s, p));
}

}  // namespace kvvm
