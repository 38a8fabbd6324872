// Arena statistics: the counters kept as operations happen, and the figures derived from the
// slot table when asked. Physical bytes come from the reservation, which keeps them as
// mappings come and go, so stats() does no work per mapped block.
#include <algorithm>
#include <bit>

#include "kv/arena_detail.h"
#include "kv/dummy_tail.h"
#include "kvvm/arena.h"

namespace kvvm {

void Arena::note_latency(std::chrono::steady_clock::duration elapsed) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(elapsed).count();
  const std::size_t bucket =
      us < 2 ? 0
             : std::min<std::size_t>(std::bit_width(static_cast<std::uint64_t>(us)) - 1,
                                     detail::kLatencyBuckets - 1);
  std::lock_guard lock(mutex_);
  ++counters_.commit_latency_us_log2[bucket];
}

ArenaStats Arena::stats() const {
  const LayoutPlan& plan = options_.plan;
  const std::uint64_t window_bytes = plan.fragments * plan.granule;
  // Each handle mapped under the slots once (the dummy page is billed on its own line);
  // the reservation keeps the figure as blocks come and go.
  const std::uint64_t physical =
      reservation_->distinct_handle_bytes(dummy_ ? dummy_->handle() : kNoHandle);
  std::lock_guard lock(mutex_);
  ArenaStats stats = counters_;
  std::uint64_t active_committed = 0;
  for (const Slot& slot : slots_) {
    stats.committed_bytes += slot.windows * window_bytes;
    switch (slot.state) {
      case SlotState::kActive:
        ++stats.active_slots;
        stats.live_bytes += slot.tokens * plan.bytes_per_token;
        active_committed += slot.windows * window_bytes;
        break;
      case SlotState::kFinished:
        ++stats.finished_slots;
        stats.reclaimable_bytes += slot.windows * window_bytes;
        break;
      case SlotState::kQuarantined:
        ++stats.quarantined_slots;
        break;
      case SlotState::kFree:
        break;
    }
  }
  stats.waste_ratio = stats.live_bytes == 0
                          ? 0.0
                          : static_cast<double>(active_committed - stats.live_bytes) /
                                static_cast<double>(stats.live_bytes);
  stats.driver_calls = pool_.driver().counts();
  for (const Slot& slot : slots_) {
    if (slot.state != SlotState::kActive) continue;
    stats.readonly_windows +=
        plan.fragments *
        static_cast<std::uint64_t>(std::count(slot.readonly.begin(), slot.readonly.end(), true));
  }
  stats.dummy_bytes = dummy_ ? dummy_->bytes() : 0;
  stats.physical_bytes = physical;
  stats.shared_saved_bytes =
      stats.committed_bytes > physical ? stats.committed_bytes - physical : 0;
  for (const Slot& slot : slots_) {
    stats.dummy_windows += plan.fragments * (slot.dummy_to - slot.dummy_from);
  }
  return stats;
}

void Arena::wait_until_idle() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] {
    if (options_.commit_ahead_windows == 0 || capture_depth_ > 0) return true;
    return std::none_of(slots_.begin(), slots_.end(), [&](const Slot& s) {
      return s.busy ||
             (s.state == SlotState::kActive && !s.ahead_stalled && s.windows < ahead_target(s));
    });
  });
}

}  // namespace kvvm
