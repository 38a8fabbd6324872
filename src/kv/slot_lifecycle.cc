// A sequence's lifecycle in an arena's slot table (see arena.h and arena_state.h): admission
// (into the best-fitting finished slot, else a free one), growth (with copy-on-write of the
// read-only windows a write touches, decided by PrefixSharing), the commit-ahead worker's hooks,
// rewind, finish, and reclamation.
//
// Commit-ahead: CommitAhead owns the thread and knows no slots; the hooks here take the first
// active slot below its target, commit its lead without waiting for budget (a convenience, not
// a claim on memory), and stall the slot on failure until it grows again. They stay beside
// growth because they are growth ahead of demand, on the same slot fields.
//
// Reclamation: finished slots keep their windows mapped until budget pressure asks for them
// back, and then only once the fence recorded at finish completed, so no kernel can still read
// what is unmapped.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "kv/arena_state.h"
#include "kv/commit_ahead.h"
#include "kv/copy_on_write.h"
#include "kv/dummy_tail.h"
#include "kv/prefix/prefix_sharing.h"
#include "kv/slot_claim.h"
#include "kvvm/base/log.h"

namespace kvvm {
namespace {

using detail::slot_text;

}  // namespace

Result<SlotId> ArenaState::admit(std::uint64_t tokens) {
  if (tokens > options_.plan.max_context) {
    return detail::beyond_context("admit of", tokens, options_.plan.max_context);
  }
  const std::uint64_t needed = options_.plan.windows_per_fragment(tokens);
  MutexLock lock(mutex_);
  if (capture_depth_ > 0) {
    return Status::Unavailable("admit of " + std::to_string(tokens) +
                               " tokens refused during graph capture");
  }
  std::optional<SlotId> chosen = best_admission_slot(needed);
  if (chosen) {
    slots_[*chosen].busy = true;
  } else {
    // Only finished slots with shared windows are left: empty one.
    lock.unlock();
    KVVM_ASSIGN_OR_RETURN(SlotId emptied,
                          take_empty_slot("admit of " + std::to_string(tokens) + " tokens"));
    chosen = emptied;
    lock.lock();
  }
  const SlotId id = *chosen;
  SlotClaim claim = SlotClaim::adopt(*this, id, lock);
  Slot& slot = slots_[id];
  const SlotState previous = slot.state;
  const std::uint64_t have = slot.windows;
  lock.unlock();

  // A reused slot keeps its old fence until its next finish (or reclaim) destroys it: admission
  // into mapped windows makes no driver call at all.
  Status filled = fill_admitted(id, previous, have, needed, tokens);
  if (!filled.ok()) return filled;
  lock.lock();
  SlotEdit edit(*this, slot);
  slot.windows = std::max(have, needed);
  start_sequence(slot, tokens);
  slot.prefix_handles.clear();  // a slot with read-only windows is never admitted into here
  ++counters_.admissions;
  if (previous == SlotState::kFinished) ++counters_.reused_admissions;
  return id;
}

std::optional<SlotId> ArenaState::best_admission_slot(std::uint64_t needed) const {
  // Best fit among finished slots: the fewest mapped windows that still cover the request,
  // else the most; a free slot only when no finished one is idle.
  std::optional<SlotId> chosen;
  for (SlotId id = 0; id < slots_.size(); ++id) {
    const Slot& slot = slots_[id];
    // A sequence's shared (read-only) windows cannot be written by the next one.
    // Nor can it take windows that work of unknown completion may still write.
    if (slot.state != SlotState::kFinished || slot.busy || !slot.readonly.empty() ||
        !slot.unconfirmed.empty()) {
      continue;
    }
    if (!chosen) {
      chosen = id;
      continue;
    }
    const Slot& best = slots_[*chosen];
    const bool covers = slot.windows >= needed;
    const bool best_covers = best.windows >= needed;
    if ((covers && (!best_covers || slot.windows < best.windows)) ||
        (!covers && !best_covers && slot.windows > best.windows)) {
      chosen = id;
    }
  }
  for (SlotId id = 0; id < slots_.size() && !chosen; ++id) {
    if (slots_[id].state == SlotState::kFree && !slots_[id].busy) chosen = id;
  }
  return chosen;
}

Status ArenaState::fill_admitted(SlotId id, SlotState previous, std::uint64_t have,
                                 std::uint64_t needed, std::uint64_t tokens) {
  if (have < needed) {
    Status committed = commit_windows(id, have, needed, options_.budget_wait);
    if (!committed.ok()) {
      const bool poisoned = has_poison(id);
      MutexLock lock(mutex_);
      if (committed.code() == StatusCode::kResourceExhausted) ++counters_.refusals;
      if (poisoned) {
        SlotEdit edit(*this, slots_[id]);
        slots_[id].state = SlotState::kQuarantined;
      }
      return committed.with_context("admit of " + std::to_string(tokens) + " tokens into " +
                                    slot_text(id));
    }
  }
  if (padded_windows() == 0) return Status::Ok();
  Status covered = cover_tail(id, std::max(have, needed));
  if (covered.ok()) return covered;
  // The windows just committed stay mapped, reclaimable as a finished slot's.
  MutexLock lock(mutex_);
  SlotEdit edit(*this, slots_[id]);
  slots_[id].windows = std::max(have, needed);
  if (previous != SlotState::kFinished) slots_[id].state = SlotState::kFinished;
  ++counters_.refusals;
  return covered.with_context("admit into " + slot_text(id) + ": mapping the dummy tail page");
}

void ArenaState::start_sequence(Slot& slot, std::uint64_t tokens) {
  slot.state = SlotState::kActive;
  slot.tokens = tokens;
  slot.last_used = ++tick_;
  slot.ahead_stalled = false;
  slot.occupancy = ++occupancies_;
}

void ArenaState::note_growth(Slot& slot, std::uint64_t tokens) {
  slot.tokens = tokens;
  slot.last_used = ++tick_;
  slot.ahead_stalled = false;
}

Result<SlotId> ArenaState::take_empty_slot(std::string_view what) {
  MutexLock lock(mutex_);
  if (capture_depth_ > 0) {
    return Status::Unavailable(std::string(what) + " refused during graph capture");
  }
  for (SlotId id = 0; id < slots_.size(); ++id) {
    if (slots_[id].state == SlotState::kFree && !slots_[id].busy) {
      slots_[id].busy = true;
      return id;
    }
  }
  // No free slot: empty the least recently used finished one whose fence completed.
  std::vector<SlotId> finished;
  for (SlotId id = 0; id < slots_.size(); ++id) {
    if (slots_[id].state == SlotState::kFinished && !slots_[id].busy) finished.push_back(id);
  }
  std::sort(finished.begin(), finished.end(), [&](SlotId a, SlotId b) KVVM_REQUIRES(mutex_) {
    return slots_[a].last_used < slots_[b].last_used;
  });
  lock.unlock();
  for (SlotId id : finished) {
    (void)unmap_slot(id);
    lock.lock();
    if (slots_[id].state == SlotState::kFree && !slots_[id].busy) {
      slots_[id].busy = true;
      return id;
    }
    lock.unlock();
  }
  return Status::Unavailable(std::string(what) + ": all " + std::to_string(options_.max_slots) +
                             " slots hold sequences (or finished ones still being read)");
}

Status ArenaState::ensure(SlotId id, std::uint64_t tokens, Stream stream) {
  KVVM_RETURN_IF_ERROR(check_slot("ensure", id));
  if (tokens > options_.plan.max_context) {
    return detail::beyond_context("ensure of " + slot_text(id) + " to", tokens,
                                  options_.plan.max_context);
  }
  const std::uint64_t needed = options_.plan.windows_per_fragment(tokens);
  MutexLock lock(mutex_);
  Slot& slot = slots_[id];
  if (slot.state != SlotState::kActive) {
    return Status::FailedPrecondition("ensure of " + slot_text(id) + ": no active sequence there");
  }
  ++counters_.ensures;
  // The decode path: already mapped, no driver call. Not while a reclaim holds the slot (it
  // may be unmapping the very windows this length needs); a commit in flight (the worker's)
  // only adds windows, so the decode path need not wait for it. Writing the new tokens must
  // not land in a read-only (shared) window: those go the slow way.
  const bool mapped = slot.windows >= needed;
  if (!slot.shrinking && mapped &&
      PrefixSharing::readonly_written(*this, slot, slot.tokens, tokens).empty()) {
    {
      SlotEdit edit(*this, slot);
      note_growth(slot, tokens);
    }
    // Wake the worker only when this growth gave it something to do.
    const bool wake = options_.commit_ahead_windows > 0 && slot.windows < ahead_target(slot);
    lock.unlock();
    if (wake) changed_.notify_all();
    return Status::Ok();
  }
  SlotClaim claim = SlotClaim::take(*this, id, lock);
  if (slot.state != SlotState::kActive) {
    return Status::FailedPrecondition("ensure of " + slot_text(id) +
                                      ": the slot was quarantined while this call waited for it");
  }
  const std::vector<std::uint64_t> shared =
      PrefixSharing::readonly_written(*this, slot, slot.tokens, tokens);
  const std::uint64_t have = slot.windows;
  if (have >= needed && shared.empty()) {  // mapped meanwhile (by the worker): as the fast path
    SlotEdit edit(*this, slot);
    note_growth(slot, tokens);
    return Status::Ok();
  }
  if (capture_depth_ > 0) {
    return Status::Unavailable(
        "ensure of " + slot_text(id) + " to " + std::to_string(tokens) + " tokens needs " +
        std::to_string(needed > have ? needed - have : 0) + " more window(s) per fragment and " +
        std::to_string(shared.size()) + " shared window(s) copied: refused during graph capture");
  }
  ++counters_.ensures_committing;
  lock.unlock();
  return grow_claimed(claim, id, tokens, have, needed, shared, stream);
}

Status ArenaState::grow_claimed(SlotClaim& claim, SlotId id, std::uint64_t tokens,
                                std::uint64_t have, std::uint64_t needed,
                                const std::vector<std::uint64_t>& shared, Stream stream) {
  std::vector<std::uint64_t> made_writable;
  Status committed = write_and_grow(id, shared, have, needed, stream, made_writable);
  const bool broken = !committed.ok() && broken_after(id, shared, made_writable.size());
  {
    MutexLock lock(mutex_);
    Slot& slot = slots_[id];
    SlotEdit edit(*this, slot);
    for (std::uint64_t w : made_writable) slot.readonly[w] = false;
    while (!slot.readonly.empty() && !slot.readonly.back()) slot.readonly.pop_back();
    if (committed.ok()) {
      slot.windows = std::max(have, needed);
      note_growth(slot, tokens);
    } else {
      if (committed.code() == StatusCode::kResourceExhausted) ++counters_.refusals;
      if (broken) slot.state = SlotState::kQuarantined;
    }
  }
  claim.end();
  // The sequence no longer holds the boundary bytes of prefixes past the first rewritten window.
  const LayoutPlan& plan = options_.plan;
  if (!made_writable.empty()) {
    sharing_->drop_sources(id,
                           made_writable.front() * plan.granule / plan.contiguous_bytes_per_token);
  }
  return committed.ok() ? committed
                        : committed.with_context("ensure of " + slot_text(id) + " to " +
                                                 std::to_string(tokens) + " tokens");
}

Status ArenaState::write_and_grow(SlotId id, const std::vector<std::uint64_t>& shared,
                                  std::uint64_t have, std::uint64_t needed, Stream stream,
                                  std::vector<std::uint64_t>& made_writable) {
  // Copy-on-write first (the windows below the live end), then growth.
  for (std::uint64_t w : shared) {
    KVVM_RETURN_IF_ERROR(sharing_->make_writable(id, w, stream));
    made_writable.push_back(w);
  }
  if (needed > have) return commit_windows(id, have, needed, options_.budget_wait);
  return Status::Ok();
}

bool ArenaState::broken_after(SlotId id, const std::vector<std::uint64_t>& shared,
                              std::size_t made_writable) const {
  // A failed remap may have left a window unmapped: the slot can no longer be trusted.
  if (has_poison(id)) return true;
  if (made_writable >= shared.size()) return false;
  const std::uint64_t failed = shared[made_writable];
  for (const Range& range : window_ranges(id, failed, failed + 1)) {
    if (reservation_->blocks_in(range.offset, range.len).empty()) return true;
  }
  return false;
}

std::uint64_t ArenaState::ahead_target(const Slot& slot) const {
  const std::uint64_t max_windows = options_.plan.fragment_stride / options_.plan.granule;
  return std::min(options_.plan.windows_per_fragment(slot.tokens) + options_.commit_ahead_windows,
                  max_windows);
}

std::unique_ptr<CommitAhead> ArenaState::start_commit_ahead() {
  CommitAhead::Hooks hooks;
  hooks.next = [this]() KVVM_REQUIRES(mutex_) -> std::optional<CommitAhead::Job> {
    if (capture_depth_ > 0) return std::nullopt;  // wait until capture ends
    for (SlotId id = 0; id < slots_.size(); ++id) {
      Slot& s = slots_[id];
      if (s.state == SlotState::kActive && !s.busy && !s.ahead_stalled &&
          s.windows < ahead_target(s)) {
        s.busy = true;
        return CommitAhead::Job{id, s.windows, ahead_target(s), false};
      }
    }
    return std::nullopt;
  };
  hooks.run = [this](CommitAhead::Job& job) KVVM_EXCLUDES(mutex_) {
    Status committed = commit_windows(job.slot, job.from, job.to, std::chrono::milliseconds(0));
    job.poisoned = !committed.ok() && has_poison(job.slot);
    return committed;
  };
  hooks.finish = [this](const CommitAhead::Job& job,
                        const Status& committed) KVVM_REQUIRES(mutex_) {
    Slot& slot = slots_[job.slot];
    SlotEdit edit(*this, slot);
    if (committed.ok()) {
      slot.windows = job.to;
      ++counters_.ahead_commits;
    } else {
      slot.ahead_stalled = true;  // retried when the sequence grows again
      if (job.poisoned) slot.state = SlotState::kQuarantined;
    }
    slot.busy = false;  // the claim taken in `next`; the worker wakes the waiters
  };
  return std::make_unique<CommitAhead>(mutex_, changed_, std::move(hooks));
}

void ArenaState::wait_until_idle() {
  MutexLock lock(mutex_);
  changed_.wait(lock.native(), [&]() KVVM_REQUIRES(mutex_) {
    if (options_.commit_ahead_windows == 0 || capture_depth_ > 0) return true;
    return std::none_of(slots_.begin(), slots_.end(), [&](const Slot& s) KVVM_REQUIRES(mutex_) {
      return s.busy ||
             (s.state == SlotState::kActive && !s.ahead_stalled && s.windows < ahead_target(s));
    });
  });
}

Status ArenaState::rewind(SlotId id, std::uint64_t tokens) {
  KVVM_RETURN_IF_ERROR(check_slot("rewind", id));
  {
    MutexLock lock(mutex_);
    Slot& slot = slots_[id];
    if (slot.state != SlotState::kActive) {
      return Status::FailedPrecondition("rewind of " + slot_text(id) +
                                        ": no active sequence there");
    }
    if (tokens > slot.tokens) {
      return Status::InvalidArgument("rewind of " + slot_text(id) + " to " +
                                     std::to_string(tokens) + " tokens: it holds only " +
                                     std::to_string(slot.tokens));
    }
    SlotEdit edit(*this, slot);
    slot.tokens = tokens;
    slot.last_used = ++tick_;
  }
  // Tokens below a prefix's length will be rewritten: this sequence no longer holds that
  // prefix's boundary bytes for new sharers.
  sharing_->drop_sources(id, tokens);
  return Status::Ok();
}

Status ArenaState::finish(SlotId id, Stream stream) {
  KVVM_RETURN_IF_ERROR(check_slot("finish", id));
  MutexLock lock(mutex_);
  Slot& slot = slots_[id];
  if (slot.state != SlotState::kActive) {
    return Status::FailedPrecondition("finish of " + slot_text(id) + ": no active sequence there");
  }
  if (capture_depth_ > 0) {
    return Status::Unavailable("finish of " + slot_text(id) + " refused during graph capture");
  }
  SlotClaim claim = SlotClaim::take(*this, id, lock);
  if (slot.state != SlotState::kActive) {  // changed (quarantined) while we waited
    return Status::FailedPrecondition("finish of " + slot_text(id) +
                                      ": the slot was quarantined while this call waited for it");
  }
  const Fence old = slot.fence;
  lock.unlock();
  Result<Fence> fence = pool_.driver().record_fence(stream);
  if (!fence.ok()) return fence.status().with_context("finish of " + slot_text(id));
  if (old != 0) (void)pool_.driver().destroy_fence(old);
  sharing_->drop_sources(id, 0);
  // The slot's copy-on-write lane may hold a copy a fence failed to confirm: one more try, so
  // its handle does not wait for the lane's next copy (which tries first too).
  if (cow_->unsettled(id)) cow_->settle(id).ignore();
  lock.lock();
  SlotEdit edit(*this, slot);
  slot.fence = *fence;
  // Unconfirmed work queued on this stream lies before the fence just recorded there.
  std::erase(slot.unconfirmed, stream);
  slot.state = SlotState::kFinished;
  slot.tokens = 0;
  slot.last_used = ++tick_;
  return Status::Ok();
}

Status ArenaState::release(SlotId slot, Stream stream) {
  KVVM_RETURN_IF_ERROR(finish(slot, stream));
  // On the host the fence is complete already; on a GPU this unmaps only if the stream has
  // drained, and otherwise leaves the windows to reclaim() once it has.
  (void)unmap_slot(slot);
  return Status::Ok();
}

std::uint64_t ArenaState::reclaim(std::uint64_t bytes) {
  if (CommitAhead::running_here()) return 0;
  const LayoutPlan& plan = options_.plan;
  struct Candidate {
    SlotId id;
    std::uint64_t last_used;
    std::uint64_t windows;
  };
  std::vector<Candidate> finished, ahead;
  {
    MutexLock lock(mutex_);
    if (capture_depth_ > 0) return 0;  // no unmap during graph capture
    for (SlotId id = 0; id < slots_.size(); ++id) {
      const Slot& slot = slots_[id];
      if (slot.busy || slot.windows == 0) continue;
      if (slot.state == SlotState::kFinished) {
        finished.push_back({id, slot.last_used, slot.windows});
      } else if (slot.state == SlotState::kActive) {
        const std::uint64_t live = plan.windows_per_fragment(slot.tokens);
        if (slot.windows > live) ahead.push_back({id, slot.last_used, slot.windows});
      }
    }
  }
  // Least recently used first; among equals the largest.
  const auto order = [](const Candidate& a, const Candidate& b) {
    return a.last_used != b.last_used ? a.last_used < b.last_used : a.windows > b.windows;
  };
  std::sort(finished.begin(), finished.end(), order);
  std::sort(ahead.begin(), ahead.end(), order);

  // What the tier gets back is what the pool releases: handles above its bound go at once,
  // the rest when it is trimmed.
  const std::uint64_t released_before = pool_.released_bytes();
  const auto given_back = [&] { return pool_.released_bytes() - released_before; };
  const auto unmap_until_given = [&](const std::vector<Candidate>& candidates, bool keep_prefix) {
    for (const Candidate& candidate : candidates) {
      if (given_back() >= bytes) break;
      if (unmap_slot(candidate.id, keep_prefix) == 0) continue;
      if (given_back() < bytes) pool_.trim(bytes - given_back());
    }
  };
  // A finished slot's shared prefix windows free nothing while a sharer or the cache holds
  // the prefix, and kept they spare its next sharer every map: they go last, when the rest
  // did not suffice (bytes come back only for a prefix the cache has let go).
  unmap_until_given(finished, true);
  unmap_until_given(ahead, true);  // active slots: keep_prefix does not apply
  unmap_until_given(finished, false);
  return given_back();
}

std::uint64_t ArenaState::prefix_windows(const Slot& slot) const {
  const std::uint64_t k = slot.prefix_handles.size() / options_.plan.fragments;
  if (k == 0 || slot.windows < k || slot.readonly.size() < k) return 0;
  const auto first = slot.readonly.begin();
  return std::all_of(first, first + static_cast<std::ptrdiff_t>(k), [](bool r) { return r; }) ? k
                                                                                              : 0;
}

std::uint64_t ArenaState::unmap_slot(SlotId id, bool keep_prefix) {
  const LayoutPlan& plan = options_.plan;
  MutexLock lock(mutex_);
  Slot& slot = slots_[id];
  // The slot may have changed since the caller looked; skip it rather than wait on it.
  if (slot.busy || capture_depth_ > 0) return 0;
  const bool finished_slot = slot.state == SlotState::kFinished;
  if (!finished_slot && slot.state != SlotState::kActive) return 0;
  const std::uint64_t from = !finished_slot ? plan.windows_per_fragment(slot.tokens)
                             : keep_prefix  ? prefix_windows(slot)
                                            : 0;
  const std::uint64_t to = slot.windows;
  if (to <= from) return 0;
  slot.busy = true;
  slot.shrinking = true;
  SlotClaim claim = SlotClaim::adopt(*this, id, lock);
  lock.unlock();
  if (finished_slot && !fence_completed(id)) return 0;  // a kernel may still read it
  Status released = release_windows(id, from, to);
  const bool poisoned = !released.ok() && has_poison(id);
  if (released.ok() && !finished_slot && padded_windows() > 0) {
    // An active slot's padded tail must stay readable: the dummy goes back over it.
    Status covered = cover_tail(id, from);
    if (!covered.ok()) {
      MutexLock guard(mutex_);
      counters_.dummy_restore_failures += plan.fragments * (to - from);
    }
  }
  const std::uint64_t unmapped = released.ok() ? plan.fragments * (to - from) * plan.granule : 0;
  lock.lock();
  SlotEdit edit(*this, slot);
  if (released.ok()) {
    slot.windows = from;
    if (slot.readonly.size() > from) slot.readonly.resize(from);
    while (!slot.readonly.empty() && !slot.readonly.back()) slot.readonly.pop_back();
    if (finished_slot && from == 0) {
      slot.state = SlotState::kFree;
      slot.prefix_handles.clear();
    } else if (finished_slot) {
      ++counters_.prefix_kept_reclaims;
    }
  } else if (poisoned) {
    slot.state = SlotState::kQuarantined;
  }
  counters_.reclaimed_bytes += unmapped;
  return unmapped;
}

bool ArenaState::fence_completed(SlotId id) {
  // The fence recorded at finish, then one recorded after each stream's unconfirmed work.
  for (;;) {
    Fence fence = 0;
    std::optional<Stream> unconfirmed;
    {
      MutexLock lock(mutex_);
      fence = slots_[id].fence;
      if (!slots_[id].unconfirmed.empty()) unconfirmed = slots_[id].unconfirmed.back();
    }
    if (fence == 0) {
      if (!unconfirmed) return true;
      // Work whose fence failed was queued on that stream: a fence after it decides. Not
      // recorded, the memory stays mapped.
      Result<Fence> recorded = pool_.driver().record_fence(*unconfirmed);
      if (!recorded.ok()) return false;
      MutexLock lock(mutex_);
      Slot& slot = slots_[id];
      SlotEdit edit(*this, slot);
      slot.fence = *recorded;
      slot.unconfirmed.pop_back();
      continue;
    }
    Result<bool> done = pool_.driver().fence_done(fence);
    if (!done.ok()) {
      // Unknown: wait for it instead (it was recorded when the sequence ended, so the wait is
      // short); finished slots are the reclaim's first source, and a failed poll must not leave
      // their memory to look taken. A failed wait keeps the memory mapped.
      if (!pool_.driver().wait_fence(fence).ok()) return false;
    } else if (!*done) {
      return false;  // a kernel may still read it: keep the memory mapped
    }
    Status destroyed = pool_.driver().destroy_fence(fence);
    if (!destroyed.ok()) {
      log(LogLevel::kWarning, "reclaim: " + destroyed.to_string());
    }
    MutexLock lock(mutex_);
    slots_[id].fence = 0;
  }
}

void ArenaState::mark_unconfirmed(Slot& slot, Stream stream) {
  if (std::find(slot.unconfirmed.begin(), slot.unconfirmed.end(), stream) ==
      slot.unconfirmed.end()) {
    slot.unconfirmed.push_back(stream);
  }
}

std::uint64_t ArenaState::tokens(SlotId slot) const {
  MutexLock lock(mutex_);
  return slot < slots_.size() ? slots_[slot].tokens : 0;
}

}  // namespace kvvm
