// A decode workspace as the contract in attention.h asks (counters zero before the first
// use), with everything else poisoned (0xff bytes: NaN partials) so a merge that read a
// partial nobody wrote shows up; and a check that a call left its counters zero again.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kvvm/kernels/attention.h"
#include "support/device_buffer.h"

namespace kvvm::testing {

inline std::size_t decode_workspace_bytes(const DecodePlan& plan) {
  return std::max<std::size_t>(plan.workspace_bytes, 16);
}
inline void prepare_decode_workspace(DeviceBuffer& workspace, const DecodePlan& plan) {
  workspace.poison();
  auto* end = static_cast<unsigned char*>(workspace.get()) + workspace.bytes() / 4 * 4;
  if (cudaMemset(end - plan.counter_bytes, 0, plan.counter_bytes) != cudaSuccess) {
    throw std::runtime_error("cudaMemset of the decode counters failed");
  }
}

// Counters of `plan` in `workspace` that are not zero (0 after every completed call).
inline std::size_t nonzero_counters(const DeviceBuffer& workspace, const DecodePlan& plan) {
  const std::vector<std::uint8_t> bytes = workspace.download();
  const std::size_t end = bytes.size() / 4 * 4;
  return static_cast<std::size_t>(std::count_if(bytes.begin() + (end - plan.counter_bytes),
                                                bytes.begin() + end,
                                                [](std::uint8_t b) { return b != 0; }));
}

}  // namespace kvvm::testing
