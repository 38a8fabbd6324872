// DeviceExpertResidency: a mixture's experts cached in the CUDA weight store's stable-address
// slots, the residency decided on the device. Each sparse layer runs moe_residency_cuda
// (include/kvvm/kernels/moe_kernels.h) between its router and its permutation: the policy of
// ExpertCache (model/weights/expert_cache.h: routed-row counts halved every kDecayAcquires,
// recency among equals, a layer's wanted experts never evicted by its own misses) on state in
// device memory, the misses read from mapped pinned staging by the GPU. No host
// synchronisation and no host decision per layer, so a step with cached experts is captured in
// the decode graphs like any other.
//
// The state lives in one device allocation of this object's (a few bytes per expert and per
// slot: bytes() says how many); its counters are mirrored into pinned host memory by the
// kernels, so stats() reads them from any thread without touching the stream.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/kernels/moe_kernels.h"
#include "kvvm/model/weight_memory.h"
#include "model/weights/expert_cache.h"
#include "model/weights/weight_layout.h"

namespace kvvm::model::detail {

class DeviceExpertResidency {
 public:
  // Slot s at first_slot + s * expert_bytes (device), expert i of the staging (mapped pinned
  // host memory, sparse layer by sparse layer) at staging + i * expert_bytes; an expert's
  // tensors at `offsets` inside its bytes. Preloads every slot (preloaded_expert) on `stream`
  // and waits for it. REQUIRES experts <= slots.
  static Result<std::unique_ptr<DeviceExpertResidency>> create(const ExpertCacheShape& shape,
                                                               void* first_slot,
                                                               const unsigned char* staging,
                                                               const ExpertOffsets& offsets,
                                                               void* stream);
  DeviceExpertResidency(const DeviceExpertResidency&) = delete;
  DeviceExpertResidency& operator=(const DeviceExpertResidency&) = delete;
  ~DeviceExpertResidency();

  // Enqueues on `stream` the residency of sparse layer `layer` for the routed `ids`
  // ([tokens][top_k] on the device): misses copied into slots, `tables` (the layer's [4][experts]
  // pointer tables on the device) rewritten for its wanted experts. Capturable.
  Status acquire(std::uint32_t layer, std::uint32_t tokens, std::uint32_t top_k,
                 const std::int32_t* ids, std::uint64_t* tables, void* stream) const;

  // The slot preloaded with expert `expert` of sparse layer `layer`, if any: the tables'
  // first contents, before any step.
  std::optional<std::uint32_t> preloaded_slot(std::uint32_t layer, std::uint32_t expert) const;
  Address slot_address(std::uint32_t slot) const;
  // As the kernels last mirrored them (at most one layer behind the stream).
  ExpertCacheStats stats() const;
  std::uint64_t bytes() const { return bytes_; }

 private:
  DeviceExpertResidency() = default;
  ExpertCacheShape shape_;
  ExpertOffsets offsets_;
  void* first_slot_ = nullptr;
  const void* staging_ = nullptr;  // its device address
  void* state_ = nullptr;          // device: slot_of, count, last_use, holder, copy list, counters
  std::uint64_t bytes_ = 0;
  std::uint32_t* slot_of_ = nullptr;
  std::uint64_t* count_ = nullptr;
  std::uint64_t* last_use_ = nullptr;
  std::uint32_t* holder_ = nullptr;
  std::uint32_t* copy_list_ = nullptr;
  MoeResidencyCounters* counters_ = nullptr;
  MoeResidencyCounters* mirror_ = nullptr;         // pinned, mapped
  MoeResidencyCounters* mirror_device_ = nullptr;  // its device address
  std::vector<std::uint32_t> preloaded_;           // per expert index: its slot or kMoeNoSlot
};

}  // namespace kvvm::model::detail
