// SlotClaim: an arena slot's busy flag held for the length of one operation, given back on
// every path (early returns included), so no branch clears it by hand.
//
// A claim remembers the lock it was taken under: it ends under that lock if the lock is held
// then, else it takes the lock for the moment it needs. So a claim must be declared after its
// lock (destroyed before it) and never outlive it.
#pragma once

#include "kv/arena_state.h"
#include "kvvm/base/mutex.h"

namespace kvvm {

class SlotClaim {
 public:
  // Waits while another call holds the slot, then claims it. `lock` holds arena.mutex_.
  static SlotClaim take(ArenaState& arena, SlotId slot, MutexLock& lock)
      KVVM_REQUIRES(arena.mutex_) {
    ArenaState::Slot& s = arena.slots_[slot];
    arena.changed_.wait(lock.native(), [&] { return !s.busy; });
    s.busy = true;
    return SlotClaim(arena, slot, lock);
  }
  // Adopts a claim already made (busy set under `lock`, a lock on arena.mutex_), e.g. by
  // take_empty_slot().
  static SlotClaim adopt(ArenaState& arena, SlotId slot, MutexLock& lock) {
    return SlotClaim(arena, slot, lock);
  }

  SlotClaim(SlotClaim&& other) noexcept
      : arena_(other.arena_), slot_(other.slot_), lock_(other.lock_) {
    other.arena_ = nullptr;
  }
  SlotClaim(const SlotClaim&) = delete;
  SlotClaim& operator=(const SlotClaim&) = delete;
  SlotClaim& operator=(SlotClaim&&) = delete;
  ~SlotClaim() { end(); }

  // Gives the slot back now (idempotent) and wakes whoever waits on the arena.
  // Opts out: it locks only when its lock is not held, which the analysis cannot follow.
  void end() KVVM_NO_THREAD_SAFETY_ANALYSIS {
    if (arena_ == nullptr) return;
    const bool held = lock_->owns_lock();
    if (!held) lock_->lock();
    ArenaState::Slot& s = arena_->slots_[slot_];
    s.busy = false;
    s.shrinking = false;
    if (!held) lock_->unlock();
    arena_->changed_.notify_all();
    arena_ = nullptr;
  }

 private:
  SlotClaim(ArenaState& arena, SlotId slot, MutexLock& lock)
      : arena_(&arena), slot_(slot), lock_(&lock) {}

  ArenaState* arena_;
  SlotId slot_;
  MutexLock* lock_;
};

}  // namespace kvvm
