// Arena reclamation (see arena.h): finished slots keep their windows mapped until budget
// pressure asks for them back, and then only once the fence recorded at finish completed, so no
// kernel can still read what is unmapped.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "kv/commit_ahead.h"
#include "kv/slot_claim.h"
#include "kvvm/arena.h"
#include "kvvm/log.h"

namespace kvvm {

std::uint64_t Arena::reclaim(std::uint64_t bytes) {
  if (CommitAhead::running_here()) return 0;
  const LayoutPlan& plan = options_.plan;
  struct Candidate {
    SlotId id;
    std::uint64_t keep;  // windows per fragment to keep
    std::uint64_t last_used;
    std::uint64_t windows;
  };
  std::vector<Candidate> finished, ahead;
  {
    std::lock_guard lock(mutex_);
    if (capture_depth_ > 0) return 0;  // no unmap during graph capture
    for (SlotId id = 0; id < slots_.size(); ++id) {
      const Slot& slot = slots_[id];
      if (slot.busy || slot.windows == 0) continue;
      if (slot.state == SlotState::kFinished) {
        finished.push_back({id, 0, slot.last_used, slot.windows});
      } else if (slot.state == SlotState::kActive) {
        const std::uint64_t live = plan.windows_per_fragment(slot.tokens);
        if (slot.windows > live) ahead.push_back({id, live, slot.last_used, slot.windows});
      }
    }
  }
  // Least recently used first; among equals the largest.
  const auto order = [](const Candidate& a, const Candidate& b) {
    return a.last_used != b.last_used ? a.last_used < b.last_used : a.windows > b.windows;
  };
  std::sort(finished.begin(), finished.end(), order);
  std::sort(ahead.begin(), ahead.end(), order);
  finished.insert(finished.end(), ahead.begin(), ahead.end());

  // What the tier gets back is what the pool releases: handles above its bound go at once,
  // the rest when it is trimmed.
  const std::uint64_t released_before = pool_.released_bytes();
  const auto given_back = [&] { return pool_.released_bytes() - released_before; };
  for (const Candidate& candidate : finished) {
    if (given_back() >= bytes) break;
    if (unmap_slot(candidate.id) == 0) continue;
    if (given_back() < bytes) pool_.trim(bytes - given_back());
  }
  return given_back();
}

std::uint64_t Arena::unmap_slot(SlotId id) {
  const LayoutPlan& plan = options_.plan;
  std::unique_lock lock(mutex_);
  Slot& slot = slots_[id];
  // The slot may have changed since the caller looked; skip it rather than wait on it.
  if (slot.busy || capture_depth_ > 0) return 0;
  const bool finished_slot = slot.state == SlotState::kFinished;
  if (!finished_slot && slot.state != SlotState::kActive) return 0;
  const std::uint64_t from = finished_slot ? 0 : plan.windows_per_fragment(slot.tokens);
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
      std::lock_guard guard(mutex_);
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
    if (finished_slot) slot.state = SlotState::kFree;
  } else if (poisoned) {
    slot.state = SlotState::kQuarantined;
  }
  counters_.reclaimed_bytes += unmapped;
  return unmapped;
}

bool Arena::fence_completed(SlotId id) {
  Fence fence = 0;
  {
    std::lock_guard lock(mutex_);
    fence = slots_[id].fence;
  }
  if (fence == 0) return true;
  Result<bool> done = pool_.driver().fence_done(fence);
  if (!done.ok() || !*done) return false;  // not yet (or unknown): keep the memory mapped
  Status destroyed = pool_.driver().destroy_fence(fence);
  if (!destroyed.ok()) {
    log(LogLevel::kWarning, "reclaim: " + destroyed.to_string());
  }
  std::lock_guard lock(mutex_);
  slots_[id].fence = 0;
  return true;
}

Status Arena::release(SlotId slot, Stream stream) {
  KVVM_RETURN_IF_ERROR(finish(slot, stream));
  // On the host the fence is complete already; on a GPU this unmaps only if the stream has
  // drained, and otherwise leaves the windows to reclaim() once it has.
  (void)unmap_slot(slot);
  return Status::Ok();
}

}  // namespace kvvm
