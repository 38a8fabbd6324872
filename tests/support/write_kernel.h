// GPU kernels that write memory, for tests: one writes a range (a write into a shared,
// read-only window faults on the GPU as it does on the host); one copies late, letting the next
// kernel start first (a kernel launched overlapping its predecessor reads that kernel's output,
// not what the memory held before). Built only with the CUDA compiler.
#pragma once

#include <cstdint>

#include "kvvm/base/status.h"

namespace kvvm::testkit {

// Launches a kernel that stores `value` into every byte of [address, address + bytes), then
// synchronizes `stream` and returns what the launch and the synchronization answered (a
// write through a read-only mapping surfaces as an error there and poisons the context).
Status write_bytes_on_gpu(void* stream, std::uint64_t address, std::uint64_t bytes,
                          std::uint8_t value);

// Launches one block on `stream` that lets the next kernel start at once (programmatic
// dependent launch: a kernel launched with launch_overlapping may then run beside it), waits
// about `microseconds` on the GPU clock, and only then copies [source, source + bytes) to
// `destination` (16-byte aligned, bytes a multiple of 16). Asynchronous: the caller enqueues
// the reader next and synchronizes.
Status copy_late_on_gpu(void* stream, void* destination, const void* source, std::uint64_t bytes,
                        unsigned microseconds);

}  // namespace kvvm::testkit
