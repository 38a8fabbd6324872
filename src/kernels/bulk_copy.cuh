// Hopper (sm_90) bulk copies from global to shared memory and the mbarriers that count their
// bytes in.
//
// Why: a cp.async.bulk moves a whole contiguous run (here one head row of K or V, 128-256
// bytes) with one instruction issued by one lane, and the copy engine issues its DRAM
// requests itself. Measured against 16-byte cp.async copies on the decode kernel (H200,
// docs/PERFORMANCE.md, "Decode: bulk row copies"): 9-11 % more bandwidth at D = 128, and the
// blocks' loop times spread over 9 % of their median instead of 34 %. Completion is counted
// in bytes on an mbarrier, so a waiting warp needs no commit groups.
//
// Every function here is a single PTX instruction (PTX ISA 8.0+, "cp.async.bulk",
// "mbarrier"); the kernels that use them are compiled for sm_90 only through their callers.
#pragma once

#include <cstdint>

namespace kvvm::kernels {

// An mbarrier that completes a phase when one arrival and the expected bytes have come in.
__device__ __forceinline__ void mbarrier_init(std::uint32_t barrier) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(barrier) : "memory");
}
// Makes initialised barriers visible to the copy engine (the async proxy).
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// The one arrival of this phase, announcing `bytes` to come from bulk copies.
__device__ __forceinline__ void mbarrier_arrive_expect(std::uint32_t barrier, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes)
               : "memory");
}
// Waits until the phase of parity `parity` has completed (its bytes are in shared memory).
__device__ __forceinline__ void mbarrier_wait(std::uint32_t barrier, std::uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(barrier),
      "r"(parity)
      : "memory");
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared
// memory and counts them on `barrier`. The lines are marked evict-first in L2: a decode reads
// each KV byte once per step, and keeping them would only push out what is read again.
__device__ __forceinline__ void bulk_copy_evict_first(std::uint32_t shared, const void* global,
                                                      std::uint32_t bytes, std::uint32_t barrier) {
  asm volatile(
      "{\n"
      ".reg .b64 policy;\n"
      "createpolicy.fractional.L2::evict_first.b64 policy, 1.0;\n"
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1], %2, [%3], policy;\n"
      "}\n" ::"r"(shared),
      "l"(global), "r"(bytes), "r"(barrier)
      : "memory");
}

}  // namespace kvvm::kernels
