// PrefixSharing: an arena's sharing decisions (see arena.h and shared_prefix.h): which windows
// of a prefix can be shared, sealing them read-only and publishing them as a SharedPrefix,
// mapping a prefix read-only into a slot with the boundary copy, fork, and copy-on-write of the
// read-only windows a write touches. It keeps the slots' read-only flags and which sequences
// hold which prefixes' boundary bytes (it is the BoundaryHolder the prefixes ask).
//
// It works on its arena's slot table (ArenaState, which owns it) under the same pattern and
// locks as the rest of the arena: sharing is bound up with the slots, but what it decides is
// its own. A SharedPrefix sees it only through BoundaryHolder.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "kv/arena_state.h"
#include "kvvm/base/mutex.h"
#include "kvvm/base/status.h"
#include "kvvm/kv/prefix/shared_prefix.h"

namespace kvvm {

class PrefixSharing final : public BoundaryHolder {
 public:
  explicit PrefixSharing(ArenaState& state) : state_(state) {}
  PrefixSharing(const PrefixSharing&) = delete;
  PrefixSharing& operator=(const PrefixSharing&) = delete;

  // Whether the slot still holds, active, the sequence admitted as `occupancy` (a boundary
  // source).
  bool holds(std::uint32_t slot, std::uint64_t occupancy) const override;

  // The public operations, as Arena describes them.
  Result<std::shared_ptr<SharedPrefix>> publish(SlotId slot, std::uint64_t prefix_tokens);
  Result<std::vector<HandleInfo>> seal_windows(SlotId slot, std::uint64_t from, std::uint64_t to,
                                               std::vector<std::uint64_t>* newly);
  Result<SlotId> admit_shared(const SharedPrefix& prefix, std::uint64_t tokens, Stream stream);
  Result<SlotId> fork(SlotId parent, std::uint64_t position, Stream stream);

  // Copy-on-write, for growth. The read-only windows that writing tokens [from, to) of a slot
  // of `state` would touch. Static with `state` passed, so the analysis sees the caller's own
  // lock (it cannot tell that a PrefixSharing's state_ is its caller).
  static std::vector<std::uint64_t> readonly_written(const ArenaState& state,
                                                     const ArenaState::Slot& slot,
                                                     std::uint64_t from, std::uint64_t to)
      KVVM_REQUIRES(state.mutex_);
  // Window w of every fragment becomes read-write: copied into a private handle when others
  // map it, switched in place when this is the only mapping. REQUIRES the slot claimed.
  Status make_writable(SlotId slot, std::uint64_t window, Stream stream);
  // Drops the slot from the prefixes it is a boundary source for (those of more than
  // `keep_below` tokens).
  void drop_sources(SlotId slot, std::uint64_t keep_below) KVVM_EXCLUDES(state_.mutex_);

 private:
  Status check_compatible(const SharedPrefix& prefix, std::string_view what) const;
  // Read-only windows [0, floor(tokens * contiguous / granule)) of an active slot become a
  // prefix (possibly of no whole window, for fork). `newly` receives the windows this call
  // turned read-only.
  Result<std::shared_ptr<SharedPrefix>> publish_windows(SlotId slot, std::uint64_t tokens,
                                                        std::vector<std::uint64_t>* newly);
  // Makes windows read-write again in every fragment (undoing a publish no one used).
  void restore_writable(SlotId slot, const std::vector<std::uint64_t>& windows);
  // Maps the prefix, commits windows up to `tokens`, copies the boundary; all or nothing.
  // `kept` = 0: the slot is empty. `kept` >= k: a finished slot whose windows [0, k) already
  // map the prefix read-only and [k, kept) are private read-write (keep_prefix_windows()):
  // only what lies past them is committed. REQUIRES the slot claimed.
  // When the boundary copy's completion is unknown (`*unconfirmed` set), nothing is undone:
  // the copy may still write the slot's windows.
  Status install_prefix(SlotId slot, const SharedPrefix& prefix, std::uint64_t tokens,
                        std::uint64_t kept, Stream stream, bool* unconfirmed)
      KVVM_EXCLUDES(state_.mutex_);
  // The least recently used finished, idle slot whose windows [0, k) the table's hint says
  // map `handles` ([f * k + w]) read-only, claimed (busy set for the caller to adopt).
  std::optional<SlotId> take_slot_mapping(const std::vector<Handle>& handles, std::uint64_t k)
      KVVM_EXCLUDES(state_.mutex_);
  // For a slot take_slot_mapping() claimed: checks against the reservation that windows
  // [0, k) of every fragment map `handles` read-only, then unmaps what follows the private
  // read-write windows after them (the last sequence's published windows, which the next one
  // would have to copy before writing). Returns the windows per fragment kept; 0 when the slot
  // cannot be used (another mapping, a fence still pending, or a failed unmap, which
  // quarantines it).
  std::uint64_t keep_prefix_windows(SlotId slot, const std::vector<Handle>& handles,
                                    std::uint64_t k) KVVM_EXCLUDES(state_.mutex_);
  // admit_shared() with its slot claimed (the claim's lock not held).
  Result<SlotId> start_sharer(SlotId slot, const SharedPrefix& prefix, std::vector<Handle> handles,
                              std::uint64_t tokens, std::uint64_t kept, Stream stream,
                              const std::string& what) KVVM_EXCLUDES(state_.mutex_);
  // Copies the prefix's boundary bytes into the slot from a sequence that holds them intact.
  // `*unconfirmed` set: copies were queued and no fence confirmed them (the source slot, when
  // it is this arena's, is marked unconfirmed here; the target is the caller's to keep).
  Status copy_boundary(SlotId slot, const SharedPrefix& prefix, Stream stream, bool* unconfirmed)
      KVVM_EXCLUDES(state_.mutex_);

  ArenaState& state_;
};

}  // namespace kvvm
