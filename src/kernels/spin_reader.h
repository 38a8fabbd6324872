// A GPU kernel that reads a range of the KV cache for a chosen time: for tests (a release
// must not unmap memory while it runs) and benchmarks (a decode step's fixed kernel time).
// Built only when the CUDA compiler is present (KVVM_HAS_CUDA_KERNELS).
#pragma once

#include <cstdint>

#include "kvvm/base/status.h"

namespace kvvm::kernels {

// Creates a non-blocking stream on the current device (the primary context the CUDA driver
// made current).
Result<void*> create_stream();
void destroy_stream(void* stream);

// Launches one block that reads every 8-byte word of [address, address + bytes) repeatedly
// until about `microseconds` have passed on the GPU clock, then writes the sum of what it
// read to `sum_out` (device or managed memory, may be 0). Asynchronous on `stream`.
Status launch_spin_reader(void* stream, std::uint64_t address, std::uint64_t bytes,
                          std::uint32_t microseconds, std::uint64_t sum_out);

Status synchronize_stream(void* stream);

}  // namespace kvvm::kernels
