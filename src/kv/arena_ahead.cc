// Arena commit-ahead (see arena.h): the hooks the CommitAhead worker runs. The worker takes
// the first active slot below its target, commits its lead without waiting for budget (a
// convenience, not a claim on memory), and stalls the slot on failure until it grows again.
#include <algorithm>

#include "kv/commit_ahead.h"
#include "kvvm/arena.h"

namespace kvvm {

std::uint64_t Arena::ahead_target(const Slot& slot) const {
  const std::uint64_t max_windows = options_.plan.fragment_stride / options_.plan.granule;
  return std::min(options_.plan.windows_per_fragment(slot.tokens) + options_.commit_ahead_windows,
                  max_windows);
}

std::unique_ptr<CommitAhead> Arena::start_commit_ahead() {
  CommitAhead::Hooks hooks;
  hooks.next = [this]() -> std::optional<CommitAhead::Job> {
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
  hooks.run = [this](CommitAhead::Job& job) {
    Status committed = commit_windows(job.slot, job.from, job.to, std::chrono::milliseconds(0));
    job.poisoned = !committed.ok() && has_poison(job.slot);
    return committed;
  };
  hooks.finish = [this](const CommitAhead::Job& job, const Status& committed) {
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

}  // namespace kvvm
