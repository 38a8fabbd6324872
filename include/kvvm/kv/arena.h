// Arena: the KV cache of up to max_slots sequences in one reservation.
//
// Each sequence gets a slot: a fixed-stride address range, so its base address is fixed from
// admission to release (invariant 4, docs/ARCHITECTURE.md "Invariants") and kernels address it
// through one KvView. Physical memory is committed under a slot window by window as the sequence
// grows; every fragment of the layout grows together, as one transaction under a governor grant.
//
// Lifecycle of a slot: free -> active (admitted, growing) -> finished (reclaimable: its
// windows stay mapped so the next sequence admitted there needs no driver call) -> reclaimed
// under budget pressure (windows unmapped once the fence recorded at finish completed, so no
// kernel can still read them: invariant 6).
//
// Commit-ahead: a background worker keeps `commit_ahead_windows` windows per fragment
// committed beyond each active sequence's live length, so ensure() on the decode path
// normally finds its windows mapped. Those bytes are budgeted and reclaimable like any other.
//
// Dummy tail page (optional): one read-only zero-filled granule, billed once for the whole
// arena, is mapped over every uncommitted window of an active slot up to `padded_tokens`, so
// a kernel that reads a padded shape reads zeros instead of faulting. Growth replaces dummy
// windows with real ones in one transaction: unmap the dummy, map real memory, and on
// failure map the dummy back.
//
// Shared prefixes and fork (see shared_prefix.h): publish() turns the whole windows of a
// sequence's first P tokens read-only and hands out a SharedPrefix; admit_shared() maps them
// read-only into a new slot at the same offsets and copies the partial window's prefix bytes
// privately; fork() does both at once for a child of a live sequence. A write into a read-only
// window (after rewind(), by the publisher or by a sharer) is made safe by ensure(), which
// copies that window into a private handle and remaps it read-write in one transaction
// (copy-on-write at window granularity; in place, without a copy, when no one else maps it).
//
// Capture guard: while a CaptureGuard lives (a CUDA graph is being captured), any call that
// would map or unmap is refused with Unavailable and the worker waits (invariant 7).
//
// Thread-safety: admit / ensure / finish / reclaim may be called from any thread (one
// scheduler owns the sequences; the governor may call reclaim from another); per-slot work is
// serialized by the slot's busy flag, and no driver call is made while the arena's lock is
// held.
//
// This header is the contract; the slot table and the parts behind it are in src/kv
// (arena_state.h, prefix_sharing.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/governor/governor.h"
#include "kvvm/kv/kv_view.h"
#include "kvvm/kv/layout.h"
#include "kvvm/kv/prefix/shared_prefix.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/reservation.h"

namespace kvvm {

struct ArenaState;

struct ArenaOptions {
  LayoutPlan plan;  // geometry, layout, granule (must equal the driver's), context
  std::uint32_t max_slots = 0;
  TierId tier = 0;                         // the governor tier the pool charges
  std::uint32_t commit_ahead_windows = 0;  // per fragment; 0: no background worker
  // How long admit() and ensure() may wait for budget (FIFO) before answering
  // ResourceExhausted; 0: never block.
  std::chrono::milliseconds budget_wait{0};
  // > 0: map the dummy tail page up to this many tokens (<= the plan's max context).
  std::uint64_t padded_tokens = 0;
};

using SlotId = std::uint32_t;

struct ArenaStats {
  std::uint64_t committed_bytes = 0;  // mapped under the arena, every slot
  std::uint64_t live_bytes = 0;       // tokens * bytes per token, active slots
  // Mapped in finished slots, less the prefix windows they still map read-only (a sharer's or
  // the prefix cache's bytes: unmapping them there gives nothing back).
  std::uint64_t reclaimable_bytes = 0;
  double waste_ratio = 0;  // (committed - live) / live; 0 when nothing is live
  std::uint32_t active_slots = 0;
  std::uint32_t finished_slots = 0;
  std::uint32_t quarantined_slots = 0;
  std::uint64_t admissions = 0;
  std::uint64_t reused_admissions = 0;  // admitted into a finished slot's mapped windows
  std::uint64_t refusals = 0;           // admit/ensure answered ResourceExhausted
  std::uint64_t ensures = 0;
  std::uint64_t ensures_committing = 0;  // ensure calls that had to map (not found mapped)
  std::uint64_t ahead_commits = 0;       // commits made by the worker
  std::uint64_t reclaimed_bytes = 0;
  std::uint64_t dummy_windows = 0;           // windows mapped to the dummy tail page, all fragments
  std::uint64_t dummy_bytes = 0;             // what the dummy page costs: one granule, or 0
  std::uint64_t dummy_restore_failures = 0;  // windows left unmapped when restoring failed
  // Sharing. committed_bytes counts every mapping; physical_bytes counts each handle mapped
  // under the slots once, so the difference is what sharing saves.
  std::uint64_t physical_bytes = 0;
  std::uint64_t shared_saved_bytes = 0;  // committed_bytes - physical_bytes
  std::uint64_t readonly_windows = 0;    // mapped read-only in active slots, all fragments
  std::uint64_t published_prefixes = 0;
  std::uint64_t shared_admissions = 0;  // admit_shared() and fork() successes
  // admit_shared() found a finished slot still mapping its prefix but could not take it: a
  // kernel of the last sequence may still read the windows that slot would have to unmap.
  std::uint64_t reuse_fence_pending = 0;
  // Reclaims of a finished slot that unmapped only what follows the prefix it maps read-only
  // (the prefix's bytes are a sharer's or the cache's), leaving it for the next sharer.
  std::uint64_t prefix_kept_reclaims = 0;
  std::uint64_t forks = 0;
  std::uint64_t cow_copies = 0;           // windows copied into a private handle on write
  std::uint64_t cow_in_place = 0;         // read-only windows made writable with no copy
  std::uint64_t boundary_copy_bytes = 0;  // copied by sharers from the partial windows
  // Copies queued (a boundary copy, a copy-on-write) whose fence then failed, so whether they
  // completed is unknown (invariant 6): what they may still read or write stays mapped and
  // charged until a later fence on their stream completes. So far; and now: the slots and
  // copy-on-write scratch lanes waiting for that fence, and the bytes they keep mapped.
  std::uint64_t unconfirmed_copies = 0;
  std::uint32_t unconfirmed_slots = 0;
  std::uint32_t unconfirmed_lanes = 0;
  std::uint64_t unconfirmed_bytes = 0;
  // Commit latency histogram: bucket i counts commits that took [2^i, 2^(i+1)) microseconds
  // (bucket 0 includes anything under 2 µs).
  std::vector<std::uint64_t> commit_latency_us_log2;
  DriverCallCounts driver_calls;
};

class Arena {
 public:
  // Reserves max_slots * slot_stride addresses. InvalidArgument when the plan's granule is
  // not the driver's, max_slots is 0, or the product overflows; DriverError (or
  // ResourceExhausted) when the address space is short.
  static Result<std::unique_ptr<Arena>> create(HandlePool& pool, Governor& governor,
                                               ArenaOptions options);
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  // Stops the worker; the reservation's destructor then synchronizes and unmaps.
  ~Arena();

  // Admits a sequence that will hold `tokens` tokens now: picks the finished slot whose
  // mapped windows best fit (no driver call when they already cover it), else a free slot,
  // and commits what is missing under a grant. ResourceExhausted (with the shortfall) when
  // the budget cannot pay after reclaiming; Unavailable when every slot is taken or during
  // graph capture. Nothing changes on failure.
  Result<SlotId> admit(std::uint64_t tokens);

  // Makes sure the first `tokens` tokens of the slot are committed in every fragment; one
  // transaction; the base address never changes and no byte moves.
  // Windows the new tokens [old length, tokens) fall in that are read-only (shared, or
  // published) are first made writable: copied into a private handle on `stream` (ordered
  // before the remap), or switched in place when this slot is their only mapping.
  Status ensure(SlotId slot, std::uint64_t tokens, Stream stream = nullptr);

  // The live length drops to `tokens` (<= the current one): rejected speculative tokens, a
  // beam cut. Windows stay mapped; the next ensure() makes the ones it writes writable.
  Status rewind(SlotId slot, std::uint64_t tokens);

  // Publishes the first `prefix_tokens` (<= the live length) tokens of an active sequence:
  // the windows lying wholly inside them turn read-only in its slot and become the prefix.
  // FailedPrecondition with the layout arithmetic's reason when no whole window lies inside
  // (head-major with a short prefix, say); nothing changes on failure.
  Result<std::shared_ptr<SharedPrefix>> publish(SlotId slot, std::uint64_t prefix_tokens);

  // Admits a sequence of `tokens` (>= the prefix's) tokens whose first ones are the prefix's:
  // maps the prefix's windows read-only at the same offsets (no new bytes), commits the rest
  // privately under a grant for those bytes only, and copies the boundary bytes on `stream`.
  // InvalidArgument when the prefix comes from an arena of another geometry, layout, granule
  // or pool; FailedPrecondition when it is no longer usable. Nothing changes on failure.
  Result<SlotId> admit_shared(const SharedPrefix& prefix, std::uint64_t tokens,
                              Stream stream = nullptr);

  // A child of an active sequence holding its first `position` (<= its length) tokens: the
  // parent's whole windows below `position` become read-only in both, the partial window is
  // copied privately for the child on `stream`. The child's live length is `position`.
  Result<SlotId> fork(SlotId parent, std::uint64_t position, Stream stream = nullptr);

  // The sequence finished: its windows stay mapped (reclaimable) and are unmapped only after
  // a fence recorded now on `stream` completes.
  Status finish(SlotId slot, Stream stream = nullptr);

  // finish(), then unmaps the slot's windows at once if its fence already completed (always on
  // the host; on a GPU once the stream drained), else leaves them to reclaim().
  Status release(SlotId slot, Stream stream = nullptr);

  // Unmaps reclaimable windows until `bytes` were given back or none is left whose fence
  // completed: finished slots least recently used first (largest first among equals), then
  // commit-ahead windows beyond live lengths, then the shared prefix windows finished slots
  // still map. A finished slot that maps a shared prefix keeps it in the first pass (its
  // bytes are a sharer's or the cache's; the next sharer of that prefix takes the slot with
  // no driver call for it) and loses only what follows. Returns the bytes given back.
  // Registered as the governor's reclaimer for the tier.
  std::uint64_t reclaim(std::uint64_t bytes);

  // Turns windows [from, to) of every fragment of an active slot read-only and returns their
  // handles, fragment by fragment ([f * (to - from) + i]) — what publish() and the prefix
  // cache register. Nothing changes on failure.
  Result<std::vector<HandleInfo>> seal_windows(SlotId slot, std::uint64_t from, std::uint64_t to,
                                               std::vector<std::uint64_t>* newly = nullptr);

  // While alive, calls that would map or unmap are refused and the worker waits.
  class CaptureGuard {
   public:
    CaptureGuard(CaptureGuard&& other) noexcept : arena_(other.arena_) { other.arena_ = nullptr; }
    CaptureGuard& operator=(CaptureGuard&&) = delete;
    ~CaptureGuard();

   private:
    friend class Arena;
    explicit CaptureGuard(Arena* arena) : arena_(arena) {}
    Arena* arena_;
  };
  [[nodiscard]] CaptureGuard begin_capture();

  Address slot_base(SlotId slot) const;
  std::uint64_t tokens(SlotId slot) const;
  KvView view() const;
  const LayoutPlan& plan() const;
  HandlePool& pool() const;
  TierId tier() const;
  const Reservation& reservation() const;
  // Every reservation the arena holds: the slots', the copy-on-write windows and the dummy's
  // home (if any) (for tests that account for every mapping).
  std::vector<const Reservation*> reservations() const;
  // Constant time: every figure is kept as slots and mappings change, none recounted.
  ArenaStats stats() const;
  // Waits until the worker has nothing left to do (tests and benchmarks).
  void wait_until_idle();

 private:
  explicit Arena(std::unique_ptr<ArenaState> state);

  // Everything the arena holds and does behind this contract (src/kv/arena_state.h).
  std::unique_ptr<ArenaState> state_;
};

}  // namespace kvvm
