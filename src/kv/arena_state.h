// ArenaState: what an Arena holds behind its public header (a pimpl): the reservation, the slot
// table with its lock, counters and kept totals, and the parts (DummyTail, CopyOnWrite,
// CommitAhead, PrefixSharing); and the operations on them. Arena forwards to it.
//
// Every operation on a slot follows one pattern: under mutex_, check the slot's state and claim
// it (a SlotClaim, slot_claim.h); without the lock, make the driver calls through the
// Reservation (which is safe for disjoint ranges); under mutex_ again, publish the new state
// and end the claim. So the scheduler never waits on a driver call it did not ask for, and the
// worker and the governor's reclaim never touch a slot someone else is changing.
//
// Its methods live by concept: the table itself, mapping under the slots, the dummy tail's
// range and statistics in arena_state.cc; a sequence's lifecycle (admission, growth and the
// commit-ahead worker's hooks, rewind, finish, reclamation) in slot_lifecycle.cc. The sharing
// decisions are PrefixSharing's (prefix_sharing.h), which works on this table.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/mutex.h"
#include "kvvm/base/status.h"
#include "kvvm/kv/arena.h"

namespace kvvm {

class CommitAhead;
class CopyOnWrite;
class DummyTail;
class PrefixSharing;
class SlotClaim;

namespace detail {

inline constexpr std::size_t kLatencyBuckets = 24;  // 2^24 µs = 16.8 s

inline std::string slot_text(SlotId slot) { return "slot " + std::to_string(slot); }

// "WHAT N tokens: beyond the max context of M".
inline Status beyond_context(std::string_view what, std::uint64_t tokens,
                             std::uint64_t max_context) {
  return Status::InvalidArgument(std::string(what) + " " + std::to_string(tokens) +
                                 " tokens: beyond the max context of " +
                                 std::to_string(max_context));
}

}  // namespace detail

struct ArenaState {
  // kQuarantined: an unmap under the slot failed (poisoned windows): never admitted again.
  enum class SlotState { kFree, kActive, kFinished, kQuarantined };
  struct Slot {
    SlotState state = SlotState::kFree;
    std::uint64_t tokens = 0;     // live length
    std::uint64_t windows = 0;    // committed windows per fragment, from the start
    bool busy = false;            // a commit or unmap of this slot is in flight (a SlotClaim)
    bool shrinking = false;       // ... and it is an unmap (reclaim), which may take windows
                                  // the live length needs; a commit only ever adds windows
    std::uint64_t last_used = 0;  // tick of the last admit / ensure / finish
    Fence fence = 0;              // recorded at finish; 0: none pending
    // Streams where work on this slot's windows (a boundary copy into or out of them, a
    // copy-on-write reading them) was queued and then its fence failed: its completion is
    // unknown. Before the windows are unmapped (or taken by another sequence) a fence recorded
    // on each, after `fence`, must complete. A stream leaves the list once such a fence is
    // recorded (`fence` then holds it). Non-empty: the slot is unconfirmed.
    std::vector<Stream> unconfirmed;
    bool ahead_stalled = false;    // the worker could not commit ahead; retried on growth
    std::uint64_t dummy_from = 0;  // windows [dummy_from, dummy_to) of every fragment are
    std::uint64_t dummy_to = 0;    // mapped to the dummy tail page
    std::uint64_t occupancy = 0;   // admission number of the sequence here (0: none yet)
    // readonly[w]: window w is mapped read-only in some fragment (shared or published); a
    // write there must go through PrefixSharing::make_writable(). Empty when the slot has none.
    std::vector<bool> readonly;
    // Prefixes whose boundary bytes this sequence holds intact (a source for new sharers).
    std::vector<std::weak_ptr<const SharedPrefix>> sourcing;
    // The handles ([f * k + w]) the last admit_shared() here mapped read-only at windows
    // [0, k): a hint that lets the next sharer of that prefix take this slot once finished and
    // keep them mapped. Checked against the reservation before use, so it may go stale. Those
    // of its windows still read-only hold a sharer's or the prefix cache's bytes, which
    // unmapping them here gives no one (not reclaimable).
    std::vector<Handle> prefix_handles;
  };
  // What stats() reports about the slots, kept as they change so stats() does no per-slot or
  // per-block work. Windows are per fragment.
  struct SlotTotals {
    std::uint64_t committed_windows = 0;  // every slot
    std::uint64_t active_windows = 0;
    std::uint64_t finished_windows = 0;
    std::uint64_t finished_shared_windows = 0;  // read-only prefix windows of finished slots
    std::uint64_t live_tokens = 0;              // active slots
    std::uint64_t readonly_windows = 0;         // active slots
    std::uint64_t dummy_windows = 0;            // every slot
    std::uint64_t active = 0;
    std::uint64_t finished = 0;
    std::uint64_t quarantined = 0;
    std::uint64_t unconfirmed = 0;
    std::uint64_t unconfirmed_windows = 0;
    std::uint64_t fragments = 1;  // the plan's: a slot's prefix_handles over its windows
    // Adds (sign > 0) or takes out (sign < 0) one slot's share.
    void add(const Slot& slot, int sign);
  };
  // Every change to a slot's state, tokens, windows, read-only flags or dummy range happens
  // while one lives: it takes the slot out of the totals and puts it back as it is when the
  // edit ends. Never nested for one slot. The lock must stay held for its whole life (the
  // annotation checks its start).
  class SlotEdit {
   public:
    SlotEdit(ArenaState& state, Slot& slot) KVVM_REQUIRES(state.mutex_)
        : totals_(state.totals_), slot_(slot) {
      totals_.add(slot_, -1);
    }
    SlotEdit(const SlotEdit&) = delete;
    SlotEdit& operator=(const SlotEdit&) = delete;
    ~SlotEdit() { totals_.add(slot_, +1); }

   private:
    SlotTotals& totals_;
    Slot& slot_;
  };

  // Registers the reclaimer and starts the worker (options.commit_ahead_windows > 0).
  ArenaState(HandlePool& pool, Governor& governor, ArenaOptions options,
             std::unique_ptr<Reservation> reservation, std::unique_ptr<DummyTail> dummy,
             std::unique_ptr<CopyOnWrite> cow);
  ArenaState(const ArenaState&) = delete;
  ArenaState& operator=(const ArenaState&) = delete;
  // Stops the worker, drops the slots from every prefix's sources, destroys pending fences;
  // the reservation's destructor then synchronizes and unmaps.
  ~ArenaState();

  // The table and mapping under the slots (arena_state.cc).
  // InvalidArgument "WHAT of slot N: the arena has M slots" for a slot beyond the table.
  Status check_slot(std::string_view what, SlotId slot) const;
  Address slot_base(SlotId slot) const;
  // Ranges of windows [from, to) of every fragment of the slot.
  std::vector<Range> window_ranges(SlotId slot, std::uint64_t from, std::uint64_t to) const;
  // Commits windows [from, to) of the slot under a fresh grant, replacing dummy windows in the
  // way (mapped back on failure). REQUIRES the slot claimed.
  Status commit_windows(SlotId slot, std::uint64_t from, std::uint64_t to,
                        std::chrono::milliseconds wait) KVVM_EXCLUDES(mutex_);
  // Unmaps windows [from, to) of a claimed slot.
  Status release_windows(SlotId slot, std::uint64_t from, std::uint64_t to) KVVM_EXCLUDES(mutex_);
  // True when a block under the slot is poisoned.
  bool has_poison(SlotId slot) const KVVM_EXCLUDES(mutex_);
  // Windows per fragment the dummy tail page covers in an active slot (0: no dummy page).
  std::uint64_t padded_windows() const;
  // Maps the dummy over the slot's uncovered windows from `from` up to the padded length and
  // records the dummy range. REQUIRES the slot claimed.
  Status cover_tail(SlotId slot, std::uint64_t from) KVVM_EXCLUDES(mutex_);
  void note_latency(std::chrono::steady_clock::duration elapsed);
  ArenaStats stats() const;
  std::vector<const Reservation*> reservations() const;
  void begin_capture();
  void end_capture();

  // A sequence's lifecycle (slot_lifecycle.cc); the public operations as Arena describes them.
  Result<SlotId> admit(std::uint64_t tokens);
  Status ensure(SlotId slot, std::uint64_t tokens, Stream stream);
  Status rewind(SlotId slot, std::uint64_t tokens);
  Status finish(SlotId slot, Stream stream);
  Status release(SlotId slot, Stream stream);
  std::uint64_t reclaim(std::uint64_t bytes);
  std::uint64_t tokens(SlotId slot) const;
  void wait_until_idle();
  // Claims an empty slot (free, or a finished one unmapped for the purpose): its busy flag is
  // set for the caller to adopt into a SlotClaim.
  Result<SlotId> take_empty_slot(std::string_view what) KVVM_EXCLUDES(mutex_);
  // A new sequence of `tokens` starts in the slot. Inside a SlotEdit.
  void start_sequence(Slot& slot, std::uint64_t tokens) KVVM_REQUIRES(mutex_);
  // The slot admit() fills: the finished slot whose mapped windows best fit `needed`, else a
  // free one; nullopt when neither is idle.
  std::optional<SlotId> best_admission_slot(std::uint64_t needed) const KVVM_REQUIRES(mutex_);
  // Commits what a slot claimed for admission lacks and covers its padded tail; on failure
  // records what the failure left (quarantine, or mapped windows of a finished slot).
  // REQUIRES the slot claimed.
  Status fill_admitted(SlotId slot, SlotState previous, std::uint64_t have, std::uint64_t needed,
                       std::uint64_t tokens) KVVM_EXCLUDES(mutex_);
  // The slot's live length becomes `tokens` (its windows are mapped). Inside a SlotEdit.
  void note_growth(Slot& slot, std::uint64_t tokens) KVVM_REQUIRES(mutex_);
  // ensure()'s slow path, with the slot claimed and ensure()'s lock released: copy-on-write of
  // `shared`, windows [have, needed), then the outcome published; ends the claim before
  // dropping the boundary sources the rewritten windows invalidate.
  Status grow_claimed(SlotClaim& claim, SlotId slot, std::uint64_t tokens, std::uint64_t have,
                      std::uint64_t needed, const std::vector<std::uint64_t>& shared, Stream stream)
      KVVM_EXCLUDES(mutex_);
  // Copy-on-write of `shared`, then windows [have, needed). `made_writable` receives the
  // windows made writable.
  Status write_and_grow(SlotId slot, const std::vector<std::uint64_t>& shared, std::uint64_t have,
                        std::uint64_t needed, Stream stream,
                        std::vector<std::uint64_t>& made_writable);
  // After a failed write_and_grow: whether the slot can no longer be trusted (a poisoned block,
  // or the window whose copy-on-write failed left unmapped).
  bool broken_after(SlotId slot, const std::vector<std::uint64_t>& shared,
                    std::size_t made_writable) const KVVM_EXCLUDES(mutex_);
  // Unmaps what the slot does not need (all of a finished slot once its fence completed, or
  // with `keep_prefix` all but the shared prefix it maps read-only; the commit-ahead windows
  // of an active one); returns the bytes unmapped (0 when the slot is busy, during capture,
  // its fence is pending, or nothing lies past what it keeps).
  std::uint64_t unmap_slot(SlotId slot, bool keep_prefix = false) KVVM_EXCLUDES(mutex_);
  // The windows per fragment at the start of a slot that map the shared prefix its
  // prefix_handles name, when all of them are still read-only (else 0).
  std::uint64_t prefix_windows(const Slot& slot) const KVVM_REQUIRES(mutex_);
  // Whether the slot's fence (if any) completed, and then, for an unconfirmed slot, a fence
  // recorded after its unconfirmed work; destroys each once it has. REQUIRES the slot claimed.
  bool fence_completed(SlotId slot) KVVM_EXCLUDES(mutex_);
  // Work queued on `stream` over the slot's windows had its fence fail (see Slot::unconfirmed).
  // REQUIRES a SlotEdit of the slot alive.
  void mark_unconfirmed(Slot& slot, Stream stream) KVVM_REQUIRES(mutex_);
  // The windows per fragment the worker wants for a slot.
  std::uint64_t ahead_target(const Slot& slot) const KVVM_REQUIRES(mutex_);
  // The worker, with hooks that pick the slot furthest behind its target, commit its lead
  // without waiting for budget, and publish the outcome.
  std::unique_ptr<CommitAhead> start_commit_ahead();

  HandlePool& pool_;
  Governor& governor_;
  const ArenaOptions options_;
  std::unique_ptr<Reservation> reservation_;
  std::unique_ptr<DummyTail> dummy_;  // null: no dummy tail page
  std::unique_ptr<CopyOnWrite> cow_;  // one scratch lane per slot

  // Leaf with respect to the driver (never held across a driver call).
  mutable Mutex mutex_;
  std::condition_variable changed_;
  // Never resized: its size is options_.max_slots, which code outside the lock reads instead.
  std::vector<Slot> slots_ KVVM_GUARDED_BY(mutex_);
  std::uint64_t tick_ KVVM_GUARDED_BY(mutex_) = 0;
  std::uint64_t occupancies_ KVVM_GUARDED_BY(mutex_) = 0;
  int capture_depth_ KVVM_GUARDED_BY(mutex_) = 0;
  // The counters; the slot figures come from totals_.
  ArenaStats counters_ KVVM_GUARDED_BY(mutex_);
  SlotTotals totals_ KVVM_GUARDED_BY(mutex_);

  std::unique_ptr<PrefixSharing> sharing_;  // never null
  Governor::Registration reclaimer_;
  std::unique_ptr<CommitAhead> ahead_;  // null without commit-ahead; stopped first
};

}  // namespace kvvm
