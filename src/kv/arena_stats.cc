// Arena statistics: counters kept as operations happen, slot totals kept as slots change (every
// change inside a SlotEdit), and physical bytes kept by the reservation as mappings come and
// go; so stats() does no work per slot or per mapped block.
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
  const SlotTotals& t = totals_;
  stats.committed_bytes = t.committed_windows * window_bytes;
  stats.live_bytes = t.live_tokens * plan.bytes_per_token;
  stats.reclaimable_bytes = t.finished_windows * window_bytes;
  stats.active_slots = static_cast<std::uint32_t>(t.active);
  stats.finished_slots = static_cast<std::uint32_t>(t.finished);
  stats.quarantined_slots = static_cast<std::uint32_t>(t.quarantined);
  const std::uint64_t active_committed = t.active_windows * window_bytes;
  stats.waste_ratio = stats.live_bytes == 0
                          ? 0.0
                          : static_cast<double>(active_committed - stats.live_bytes) /
                                static_cast<double>(stats.live_bytes);
  stats.driver_calls = pool_.driver().counts();
  stats.readonly_windows = plan.fragments * t.readonly_windows;
  stats.dummy_bytes = dummy_ ? dummy_->bytes() : 0;
  stats.physical_bytes = physical;
  stats.shared_saved_bytes =
      stats.committed_bytes > physical ? stats.committed_bytes - physical : 0;
  stats.dummy_windows = plan.fragments * t.dummy_windows;
  return stats;
}

void Arena::SlotTotals::add(const Slot& slot, int sign) {
  // Unsigned arithmetic wraps: adding n * (2^64 - 1) takes n away.
  const std::uint64_t k = sign > 0 ? 1 : ~std::uint64_t{0};
  committed_windows += k * slot.windows;
  dummy_windows += k * (slot.dummy_to - slot.dummy_from);
  switch (slot.state) {
    case SlotState::kActive:
      active += k;
      active_windows += k * slot.windows;
      live_tokens += k * slot.tokens;
      readonly_windows += k * static_cast<std::uint64_t>(
                                  std::count(slot.readonly.begin(), slot.readonly.end(), true));
      break;
    case SlotState::kFinished:
      finished += k;
      finished_windows += k * slot.windows;
      break;
    case SlotState::kQuarantined:
      quarantined += k;
      break;
    case SlotState::kFree:
      break;
  }
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
