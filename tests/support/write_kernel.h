// A GPU kernel that writes a range of memory: for tests that a write into a shared, read-only
// window faults on the GPU as it does on the host. Built only with the CUDA compiler.
#pragma once

#include <cstdint>

#include "kvvm/status.h"

namespace kvvm::testkit {

// Launches a kernel that stores `value` into every byte of [address, address + bytes), then
// synchronizes `stream` and returns what the launch and the synchronization answered (a
// write through a read-only mapping surfaces as an error there and poisons the context).
Status write_bytes_on_gpu(void* stream, std::uint64_t address, std::uint64_t bytes,
                          std::uint8_t value);

}  // namespace kvvm::testkit
