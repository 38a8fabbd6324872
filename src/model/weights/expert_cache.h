// ExpertCache: which expert each slot of a WeightStore's expert region holds, and which one a
// miss evicts. A mixture under a weight budget keeps every layer's dense part resident and its
// experts staged in host memory; a step's wanted experts are made resident here before they
// are computed, a miss copying the expert's bytes from staging into a slot whose holder is not
// wanted now.
//
// Why by measured routing frequency: routers favour some experts for long stretches of text, so
// the rows routed to an expert over the last few hundred steps predict the next step better
// than recency alone (a batch touches many experts once). The count halves every
// kDecayAcquires acquisitions so the cache follows a change of topic; recency breaks ties.
//
// The copy is a callback (the host driver's write on the CPU backend); the CUDA backend runs
// this policy on the device instead (DeviceExpertResidency), held to this class by its tests. A
// failed copy leaves every mapping as it was (the copy writes nothing when it fails, as the
// drivers' writes do) and fails the step naming the expert.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/model/weight_memory.h"
#include "kvvm/vmm/driver.h"

namespace kvvm::model::detail {

// The experts a step's top-k choices `ids` ([tokens][top_k]) route to, ascending, into `wanted`,
// and the rows routed to each into `rows` (as long as `wanted`): what a backend asks the cache
// for. InvalidArgument naming an id outside [0, experts).
Status wanted_experts(std::span<const std::int32_t> ids, std::uint32_t experts,
                      std::vector<std::uint32_t>& wanted, std::vector<std::uint32_t>& rows);

// Acquisitions between two halvings of every expert's routing count.
inline constexpr std::uint64_t kDecayAcquires = 4096;

struct ExpertCacheShape {
  std::uint32_t sparse_layers = 0;
  std::uint32_t experts = 0;  // per sparse layer
  std::uint32_t slots = 0;    // 1 .. sparse_layers * experts
  std::uint64_t expert_bytes = 0;
};

// What slot `slot` holds before any routing is seen (the index sparse layer * experts +
// expert): expert slot / sparse_layers of sparse layer slot % sparse_layers, so the slots take
// an even share of each layer's lowest ids. Every backend's cache preloads this way.
inline std::uint32_t preloaded_expert(const ExpertCacheShape& shape, std::uint32_t slot) {
  return (slot % shape.sparse_layers) * shape.experts + slot / shape.sparse_layers;
}

class ExpertCache {
 public:
  // Writes `bytes` from host staging at `from` into a slot at `to`, done when it returns.
  using Copy = std::function<Status(Address to, const unsigned char* from, std::uint64_t bytes)>;

  // Slot s at first_slot + s * expert_bytes; expert e of sparse layer l staged at
  // staging + (l * experts + e) * expert_bytes (both outlive the cache).
  ExpertCache(const ExpertCacheShape& shape, Address first_slot, const unsigned char* staging,
              Copy copy);

  // Fills every slot before any routing is seen, as preloaded_expert says.
  Status preload();

  // Makes experts `ids` (distinct, at most slots()) of sparse layer `layer` resident and writes
  // their addresses to `at` (as many as ids). rows[i], the rows routed to ids[i] this step, feed
  // the frequency. A miss evicts the holder, not among `ids`, with the lowest routing count
  // (the least recently used among equals). A failed copy leaves every slot holding what it
  // held and returns the copy's error naming the expert and layer.
  Status acquire(std::uint32_t layer, std::span<const std::uint32_t> ids,
                 std::span<const std::uint32_t> rows, std::span<Address> at);

  std::uint32_t slots() const { return shape_.slots; }
  // Safe from any thread while steps run.
  ExpertCacheStats stats() const;
  // The slot holding expert `expert` of sparse layer `layer`, if any (tests).
  std::optional<std::uint32_t> slot_of(std::uint32_t layer, std::uint32_t expert) const;

 private:
  static constexpr std::uint32_t kEmpty = ~std::uint32_t{0};
  using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint32_t>;  // count, last use, slot

  Key key_of(std::uint32_t slot) const;
  Address slot_address(std::uint32_t slot) const;
  const unsigned char* staged(std::uint32_t expert_index) const;
  Status fill(std::uint32_t slot, std::uint32_t expert_index);
  // work(), its time added to the time waiting on copies.
  Status timed(const std::function<Status()>& work);
  void decay();

  ExpertCacheShape shape_;
  Address first_slot_ = 0;
  const unsigned char* staging_ = nullptr;
  Copy copy_;
  // Indexed by sparse layer * experts + expert: its slot (kEmpty: not resident), its routed rows
  // (halving), the acquisition that last wanted it.
  std::vector<std::uint32_t> slot_of_;
  std::vector<std::uint64_t> count_;
  std::vector<std::uint64_t> last_use_;
  std::vector<std::uint32_t> holder_;  // per slot: the expert index it holds, or kEmpty
  std::set<Key> evictable_;            // the resident experts not wanted by the acquisition
  std::uint64_t acquisitions_ = 0;
  std::vector<std::uint32_t> wanted_slots_;  // scratch

  std::atomic<std::uint64_t> lookups_{0}, hits_{0}, misses_{0}, bytes_copied_{0}, copy_ns_{0};
};

}  // namespace kvvm::model::detail
