// HandlePool: owns every physical handle of one driver, and keeps unmapped ones for reuse
// so the hot path (commit, release) normally makes no create or release call.
//
// Each handle is in exactly one state (invariant 2, docs/ARCHITECTURE.md "Invariants"):
//   pooled      unmapped, ready for the next checkout
//   in use      checked out; mapped at `mappings` places (0 only between checkout and map)
//   quarantined its state cannot be trusted (a release or an unmap failed): never reused,
//               still charged, counted and reported
//   released    given back to the driver; no longer in the table
// A handle mapped in several places (a shared prefix) returns to the pool when its last
// mapping goes. Bytes are charged to the governor tier when a handle is created (through the
// caller's Grant) and returned when it is released, so the tier's used bytes equal the
// pool's owned bytes (invariant 1).
//
// Thread-safety: all calls are thread-safe. No driver call is made while mutex_ is held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvvm/base/mutex.h"
#include "kvvm/base/status.h"
#include "kvvm/governor/governor.h"
#include "kvvm/vmm/driver.h"

namespace kvvm {

enum class HandleState { kPooled, kInUse, kQuarantined, kReleased };
std::string_view to_string(HandleState state);

// What the pool knows about one handle; also what a sharer passes to map it.
struct HandleInfo {
  Handle handle = kNoHandle;
  std::size_t bytes = 0;
  std::size_t granule = 0;  // the granule of the driver that created it
  HandleState state = HandleState::kReleased;
  std::uint32_t mappings = 0;
  // Which issue of the handle this is: a pool-wide number taken at each checkout (and at
  // reissue()), so a reference kept across the handle's return to the pool (a shared prefix
  // whose users all left) is recognised as stale even when the handle id comes back.
  std::uint64_t epoch = 0;
  // References that keep an in-use handle (and its bytes) while it may be mapped nowhere: a
  // prefix-cache entry, or a copy-on-write in flight. Returned only with no mapping and no hold.
  std::uint32_t holds = 0;
  // Exported to or imported from another process: its bytes may be mapped outside this pool.
  // Such a handle is never pooled for reuse nor written in place by copy-on-write (the other
  // process may read it); it is released when its last mapping and hold here go, which drops
  // this process's reference only.
  bool crosses_processes = false;
};

struct PoolSnapshot {
  std::uint64_t mapped_bytes = 0;  // in use (checked out)
  std::uint64_t pooled_bytes = 0;
  std::uint64_t quarantined_bytes = 0;
  std::uint64_t owned_bytes = 0;  // mapped + pooled + quarantined
  std::uint64_t creates = 0;
  std::uint64_t releases = 0;
  std::uint64_t release_failures = 0;
  std::uint64_t released_bytes = 0;  // given back to the driver (and the tier) so far
  std::uint64_t pool_hits = 0;
  std::size_t handles_in_use = 0;
  std::size_t handles_pooled = 0;
  std::size_t handles_quarantined = 0;
};

// What happens to a handle when its last mapping goes or it is given back unmapped.
enum class Disposition {
  kKeep,     // back to the pool (released only above the pool's bound)
  kRelease,  // released now: a rolled-back transaction created it, so the ledger returns to
             // exactly where it was before
};

struct PoolOptions {
  // Unmapped bytes kept for reuse; above this a returned handle is released.
  std::uint64_t max_pooled_bytes = 256ull << 20;
};

class HandlePool {
 public:
  // `driver` and `governor` (optional) must outlive the pool. With a governor, created bytes
  // are charged to `tier` through the caller's grant and the pool registers a reclaimer
  // that trims pooled handles when the tier is short.
  HandlePool(Driver& driver, PoolOptions options = {}, Governor* governor = nullptr,
             TierId tier = 0);
  HandlePool(const HandlePool&) = delete;
  HandlePool& operator=(const HandlePool&) = delete;
  // Releases pooled handles. Handles still in use or quarantined are reported and left.
  ~HandlePool();

  // A handle of exactly `bytes` (a positive multiple of the granule): a pooled one if there
  // is one, else a new one created inside `grant` (required when the pool has a governor).
  // The handle is in use with 0 mappings; the caller maps it (note_mapped) or gives it back.
  // `created`, when given, says whether the handle was created (not a pool hit).
  Result<Handle> checkout(std::size_t bytes, Grant* grant, bool* created = nullptr);
  // The handle was mapped at one more place / one mapping of it went.
  // REQUIRES (KVVM_CHECK, as for hold, unhold, give_back and reissue): the handle is in use
  // or quarantined. The last unmap of an in-use handle returns
  // it to the pool (or releases it above the bound).
  void note_mapped(Handle handle);
  // note_mapped() for a sharer: only if the handle is in use with `bytes` and, when `epoch`
  // is non-zero, still the issue it names (checked and counted under one lock, so a handle
  // whose last mapping goes concurrently cannot be taken back from the pool). InvalidArgument
  // (FailedPrecondition for a stale epoch) otherwise, with nothing counted.
  Status share(Handle handle, std::size_t bytes, std::uint64_t epoch);
  void note_unmapped(Handle handle, Disposition disposition = Disposition::kKeep);
  // An in-use handle with no mappings goes back (a transaction rolled back).
  void give_back(Handle handle, Disposition disposition = Disposition::kKeep);
  // Takes / drops a hold (see HandleInfo::holds). REQUIRES: the handle is in use (or
  // quarantined, for unhold). Dropping the last reference returns it as note_unmapped would.
  void hold(Handle handle);
  void unhold(Handle handle, Disposition disposition = Disposition::kKeep);
  // The content of an in-use handle is about to change under its only mapping (a read-only
  // window made writable in place): references taken before by epoch become stale.
  void reissue(Handle handle);
  // The handle's state cannot be trusted: never reused, still charged.
  void quarantine(Handle handle, std::string_view why);

  // Sharing with another process (Driver::export_handle / import_handle). Both mark the
  // handle crosses_processes (see HandleInfo). Bytes: each process's ledger charges the handles
  // its pool holds, exported and imported alike, so a granule both processes map is counted in
  // both tiers until one lets it go (the physical memory is one copy; neither budget can be
  // overdrawn by the other's release).
  // A descriptor for an in-use handle (FailedPrecondition otherwise); the caller closes it.
  Result<int> export_handle(Handle handle);
  // A handle imported from `fd` (not taken) of `bytes` (a positive multiple of the granule),
  // charged through `grant` as checkout charges a created one (required with a governor); in
  // use with 0 mappings, as from checkout.
  Result<Handle> import_handle(int fd, std::size_t bytes, Grant* grant);

  // Releases pooled handles until at least `bytes` are freed or none is left; returns the
  // bytes freed (returned to the governor).
  std::uint64_t trim(std::uint64_t bytes);

  Result<HandleInfo> describe(Handle handle) const;
  PoolSnapshot snapshot() const;
  // Bytes released to the driver so far (cheap; for callers that measure what they freed).
  std::uint64_t released_bytes() const;
  std::vector<HandleInfo> handles() const;
  std::size_t granule() const { return granule_; }
  Driver& driver() const { return driver_; }
  const PoolOptions& options() const { return options_; }

 private:
  struct Entry {
    std::size_t bytes = 0;
    HandleState state = HandleState::kPooled;
    std::uint32_t mappings = 0;
    std::uint64_t epoch = 0;
    std::uint32_t holds = 0;
    bool crosses_processes = false;
  };
  // Releases `handle` (no longer in the table); on failure puts it back quarantined and
  // returns false. The driver call is made without the lock.
  bool release_now(Handle handle, std::size_t bytes) KVVM_EXCLUDES(mutex_);
  // Moves an in-use handle with no mappings back to the pool; returns true when it should be
  // released instead (kRelease, or the pool above its bound).
  bool return_locked(Handle handle, Entry& entry, Disposition disposition) KVVM_REQUIRES(mutex_);
  // Checks that `grant` can pay for `bytes` more (when the pool has a governor).
  Status check_grant(std::size_t bytes, const Grant* grant) const;

  Driver& driver_;
  const PoolOptions options_;
  Governor* const governor_;
  const TierId tier_;
  const std::size_t granule_;
  Governor::Registration reclaimer_;

  mutable Mutex mutex_;
  std::unordered_map<Handle, Entry> entries_ KVVM_GUARDED_BY(mutex_);
  // By size, LIFO.
  std::unordered_map<std::size_t, std::vector<Handle>> pooled_ KVVM_GUARDED_BY(mutex_);
  std::uint64_t next_epoch_ KVVM_GUARDED_BY(mutex_) = 0;
  // Creates, releases, hits, failures; bytes derived on snapshot.
  PoolSnapshot counters_ KVVM_GUARDED_BY(mutex_);
};

}  // namespace kvvm
