// KvView: the one thing a kernel sees of the KV cache. A plain struct of strides that
// addresses any of the three layouts (they are all affine), so one strided kernel reads them
// all and never sees an arena, a slot table or a driver.
#pragma once

#include <cstdint>

#include "kvvm/base/dtype.h"

namespace kvvm {

struct KvView {
  std::uint64_t base = 0;          // address of slot 0
  std::uint64_t slot_stride = 0;   // bytes between consecutive slots
  std::uint64_t layer_stride = 0;  // bytes between layer l and l + 1
  std::uint64_t kv_stride = 0;     // bytes from K to V of the same layer
  std::uint64_t head_stride = 0;   // bytes between KV head h and h + 1
  std::uint64_t token_stride = 0;  // bytes between token t and t + 1
  std::uint32_t element_bytes = 0;
  std::uint32_t head_dim = 0;  // elements of one head of one token, contiguous
  // The element type, so a kernel launcher can refuse a view it cannot read; a
  // zero-initialised view holds kUnset, which no launcher accepts.
  DType element = DType::kUnset;

  // Byte offset from `base` of element 0 of (slot, layer, kv = 0 for K / 1 for V, head, token).
  KVVM_HOST_DEVICE std::uint64_t offset(std::uint64_t slot, std::uint64_t layer, std::uint64_t kv,
                                        std::uint64_t head, std::uint64_t token) const {
    return slot * slot_stride + layer * layer_stride + kv * kv_stride + head * head_stride +
           token * token_stride;
  }
  KVVM_HOST_DEVICE std::uint64_t address(std::uint64_t slot, std::uint64_t layer, std::uint64_t kv,
                                         std::uint64_t head, std::uint64_t token) const {
    return base + offset(slot, layer, kv, head, token);
  }
};

}  // namespace kvvm
