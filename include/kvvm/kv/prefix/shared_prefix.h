// SharedPrefix: the first P tokens of a sequence, published so that other sequences map its
// whole windows read-only instead of holding their own copies (docs/ARCHITECTURE.md
// "Lifecycles"; invariants 1 and 5 of "Invariants").
//
// Publishing turns the windows lying wholly inside the prefix read-only in the publisher's
// slot and records their handles. A sequence admitted with the prefix maps those handles
// read-only at the same offsets of its own slot (no new bytes: the handles are billed once,
// to whoever created them), then copies the prefix bytes of the last, partial window of each
// fragment into private memory (the boundary copy). Physical lifetime is the union of every
// mapping: the pool returns a handle when its last mapping goes, so no single user, the
// publisher included, can release memory another still maps.
//
// A SharedPrefix is a value the caller holds (std::shared_ptr). It stays usable while every
// one of its windows is still mapped somewhere with the content it had when published; once
// all users have gone (or a window was rewritten in place by its last user) admission with it
// is refused with FailedPrecondition, never served from memory that was reused since.
//
// It knows nothing of arenas: what it needs from the ones that hold its boundary bytes is one
// question (BoundaryHolder::holds), so the arena's sharing and the prefix depend on each other
// only through this header.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvvm/base/mutex.h"
#include "kvvm/kv/layout.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/handle_pool.h"

namespace kvvm {

struct SharedPrefixInfo {
  std::uint64_t tokens = 0;                // P
  std::uint64_t fragments = 0;             // of the layout
  std::uint64_t windows_per_fragment = 0;  // whole windows shared in each fragment
  std::uint64_t shared_bytes = 0;          // fragments * windows * granule: held once
  std::uint64_t boundary_bytes = 0;        // what each sharer copies privately, all fragments
};

// What keeps sequences that may hold a prefix's boundary bytes (an arena's slot table). It
// must drop itself from every prefix it was added to before it goes.
class BoundaryHolder {
 public:
  // Whether `slot` still holds, active, the sequence admitted there as `occupancy`.
  virtual bool holds(std::uint32_t slot, std::uint64_t occupancy) const = 0;

 protected:
  ~BoundaryHolder() = default;
};

class SharedPrefix : public std::enable_shared_from_this<SharedPrefix> {
 public:
  // The prefix whose windows are `handles` ([fragment * windows_per_fragment + window], each
  // with the pool epoch it had when sealed) in a layout `plan` of `pool`. With boundary bytes
  // it is usable only once a source is added.
  static std::shared_ptr<SharedPrefix> create(const HandlePool& pool, LayoutPlan plan,
                                              SharedPrefixInfo info,
                                              std::vector<HandleInfo> handles);

  const SharedPrefixInfo& info() const { return info_; }
  const LayoutPlan& plan() const { return plan_; }
  // True while every shared window's handle is still mapped with its published content (the
  // pool's checkout epoch is unchanged) and, when the prefix has boundary bytes, some user
  // still holds them intact to copy from.
  bool usable() const;

  // What an arena mapping the prefix uses.
  const HandlePool& pool() const { return *pool_; }
  const std::vector<HandleInfo>& handles() const { return handles_; }
  // Where sharers copy the boundary bytes from: an active sequence whose first P tokens are
  // intact (the publisher, or a sharer that has not rewound below P since).
  struct Source {
    const BoundaryHolder* holder = nullptr;
    std::uint32_t slot = 0;
    std::uint64_t occupancy = 0;  // the slot's admission number: a later sequence there differs
    Address base = 0;             // the slot's first byte
  };
  void add_source(Source source) const;
  void drop_source(const BoundaryHolder* holder, std::uint32_t slot) const;
  std::vector<Source> sources() const;

 private:
  SharedPrefix(const HandlePool& pool, LayoutPlan plan, SharedPrefixInfo info,
               std::vector<HandleInfo> handles)
      : pool_(&pool), plan_(std::move(plan)), info_(info), handles_(std::move(handles)) {}
  bool windows_intact() const;

  const HandlePool* pool_;
  const LayoutPlan plan_;
  const SharedPrefixInfo info_;
  const std::vector<HandleInfo> handles_;  // [fragment * windows_per_fragment + window]

  mutable Mutex mutex_;  // a leaf lock
  mutable std::vector<Source> sources_ KVVM_GUARDED_BY(mutex_);
};

}  // namespace kvvm
