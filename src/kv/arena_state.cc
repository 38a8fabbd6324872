// ArenaState: see arena_state.h. This file holds the table itself (construction and
// teardown), mapping under the slots (the windows of a slot, commit and unmap, poison), the
// dummy tail page's range in each slot, statistics and capture.
//
// The dummy tail: which windows of a slot the page covers is slot state (kept in a SlotEdit
// like every counted field), so it lives here beside commit_windows, which replaces covered
// windows; DummyTail itself is the page and its all-or-nothing mapping, and knows no slots.
//
// Statistics: counters kept as operations happen, slot totals kept as slots change (every
// change inside a SlotEdit), and physical bytes kept by the reservation as mappings come and
// go; so stats() does no work per slot or per mapped block.
#include "kv/arena_state.h"

#include <algorithm>
#include <bit>
#include <string>

#include "kv/commit_ahead.h"
#include "kv/copy_on_write.h"
#include "kv/dummy_tail.h"
#include "kv/prefix/prefix_sharing.h"
#include "kvvm/base/log.h"

namespace kvvm {
namespace {

using detail::slot_text;

}  // namespace

ArenaState::ArenaState(HandlePool& pool, Governor& governor, ArenaOptions options,
                       std::unique_ptr<Reservation> reservation, std::unique_ptr<DummyTail> dummy,
                       std::unique_ptr<CopyOnWrite> cow)
    : pool_(pool),
      governor_(governor),
      options_(std::move(options)),
      reservation_(std::move(reservation)),
      dummy_(std::move(dummy)),
      cow_(std::move(cow)),
      slots_(options_.max_slots),
      sharing_(std::make_unique<PrefixSharing>(*this)) {
  counters_.commit_latency_us_log2.assign(detail::kLatencyBuckets, 0);
  totals_.fragments = options_.plan.fragments;
  reclaimer_ = governor_.add_reclaimer(options_.tier,
                                       [this](std::uint64_t wanted) { return reclaim(wanted); });
  if (options_.commit_ahead_windows > 0) ahead_ = start_commit_ahead();
}

ArenaState::~ArenaState() {
  ahead_.reset();                         // stops the worker
  reclaimer_ = Governor::Registration();  // waits for a reclaim in progress
  for (SlotId id = 0; id < slots_.size(); ++id) sharing_->drop_sources(id, 0);
  for (Slot& slot : slots_) {
    if (slot.fence != 0) {
      Status destroyed = pool_.driver().destroy_fence(slot.fence);
      if (!destroyed.ok()) {
        log(LogLevel::kWarning, "arena teardown: " + destroyed.to_string());
      }
      slot.fence = 0;
    }
  }
  // The reservation's destructor synchronizes before unmapping (or leaks deliberately); the
  // dummy granule goes after every slot's mapping of it.
  reservation_.reset();
  dummy_.reset();
}

Status ArenaState::check_slot(std::string_view what, SlotId slot) const {
  if (slot < options_.max_slots) return Status::Ok();
  return Status::InvalidArgument(std::string(what) + " of " + slot_text(slot) + ": the arena has " +
                                 std::to_string(options_.max_slots) + " slots");
}

Address ArenaState::slot_base(SlotId slot) const {
  return reservation_->base() + static_cast<Address>(slot) * options_.plan.slot_stride;
}

std::vector<Range> ArenaState::window_ranges(SlotId slot, std::uint64_t from,
                                             std::uint64_t to) const {
  const LayoutPlan& plan = options_.plan;
  std::vector<Range> ranges;
  ranges.reserve(plan.fragments);
  for (std::uint64_t f = 0; f < plan.fragments; ++f) {
    ranges.push_back(Range{slot * plan.slot_stride + f * plan.fragment_stride + from * plan.granule,
                           (to - from) * plan.granule});
  }
  return ranges;
}

Status ArenaState::commit_windows(SlotId slot, std::uint64_t from, std::uint64_t to,
                                  std::chrono::milliseconds wait) {
  const LayoutPlan& plan = options_.plan;
  const std::uint64_t bytes = plan.fragments * (to - from) * plan.granule;
  Result<Grant> grant = governor_.prepare(options_.tier, bytes, wait);
  if (!grant.ok()) {
    return grant.status().with_context(slot_text(slot) + ": committing windows [" +
                                       std::to_string(from) + ", " + std::to_string(to) + ") of " +
                                       std::to_string(plan.fragments) + " fragment(s)");
  }
  // Dummy windows in the way are unmapped first and mapped back if the commit fails.
  std::uint64_t dummy_from = 0;
  std::uint64_t dummy_to = 0;
  {
    MutexLock lock(mutex_);
    dummy_from = std::max(from, slots_[slot].dummy_from);
    dummy_to = std::min(to, slots_[slot].dummy_to);
  }
  const bool replaces_dummy = dummy_to > dummy_from;
  if (replaces_dummy) {
    Status unmapped = release_windows(slot, dummy_from, dummy_to);
    if (!unmapped.ok()) {
      return unmapped.with_context(slot_text(slot) + ": unmapping the dummy tail page");
    }
  }
  const auto start = std::chrono::steady_clock::now();
  Status committed = reservation_->commit_ranges(window_ranges(slot, from, to), &*grant);
  grant->commit_charged();
  if (committed.ok()) {
    note_latency(std::chrono::steady_clock::now() - start);
    MutexLock lock(mutex_);
    Slot& s = slots_[slot];
    SlotEdit edit(*this, s);
    s.dummy_from = std::max(s.dummy_from, to);
    if (s.dummy_from >= s.dummy_to) s.dummy_from = s.dummy_to = 0;
    return committed;
  }
  if (replaces_dummy) {
    Status restored = dummy_->map(*reservation_, window_ranges(slot, dummy_from, dummy_to));
    if (!restored.ok()) {
      // The tail below dummy_to is now a hole: say so, and keep the books true.
      MutexLock lock(mutex_);
      counters_.dummy_restore_failures += plan.fragments * (dummy_to - dummy_from);
      SlotEdit edit(*this, slots_[slot]);
      slots_[slot].dummy_from = dummy_to;
      return committed.with_context(slot_text(slot) +
                                    ": and the dummy tail page could not be "
                                    "mapped back over windows [" +
                                    std::to_string(dummy_from) + ", " + std::to_string(dummy_to) +
                                    "), where a padded read would now fault (" +
                                    restored.to_string() + ")");
    }
  }
  return committed;
}

Status ArenaState::release_windows(SlotId slot, std::uint64_t from, std::uint64_t to) {
  Status result;
  for (const Range& range : window_ranges(slot, from, to)) {
    Status released = reservation_->release(range.offset, range.len);
    if (!released.ok() && result.ok()) result = released;
  }
  return result;
}

bool ArenaState::has_poison(SlotId slot) const {
  const std::uint64_t begin = slot * options_.plan.slot_stride;
  const std::uint64_t end = begin + options_.plan.slot_stride;
  for (const Block& block : reservation_->blocks()) {
    if (block.poisoned && block.offset >= begin && block.offset < end) return true;
  }
  return false;
}

std::uint64_t ArenaState::padded_windows() const {
  return dummy_ ? options_.plan.windows_per_fragment(options_.padded_tokens) : 0;
}

Status ArenaState::cover_tail(SlotId slot, std::uint64_t from) {
  const std::uint64_t padded = padded_windows();
  std::uint64_t to = padded;
  {
    MutexLock lock(mutex_);
    const Slot& s = slots_[slot];
    if (s.dummy_to > s.dummy_from) to = std::min(padded, s.dummy_from);
  }
  if (from >= to) return Status::Ok();
  KVVM_RETURN_IF_ERROR(dummy_->map(*reservation_, window_ranges(slot, from, to)));
  MutexLock lock(mutex_);
  Slot& s = slots_[slot];
  SlotEdit edit(*this, s);
  if (s.dummy_to <= s.dummy_from) s.dummy_to = to;
  s.dummy_from = from;
  return Status::Ok();
}

void ArenaState::note_latency(std::chrono::steady_clock::duration elapsed) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(elapsed).count();
  const std::size_t bucket =
      us < 2 ? 0
             : std::min<std::size_t>(std::bit_width(static_cast<std::uint64_t>(us)) - 1,
                                     detail::kLatencyBuckets - 1);
  MutexLock lock(mutex_);
  ++counters_.commit_latency_us_log2[bucket];
}

ArenaStats ArenaState::stats() const {
  const LayoutPlan& plan = options_.plan;
  const std::uint64_t window_bytes = plan.fragments * plan.granule;
  // Each handle mapped under the slots once (the dummy page is billed on its own line);
  // the reservation keeps the figure as blocks come and go.
  const std::uint64_t physical =
      reservation_->distinct_handle_bytes(dummy_ ? dummy_->handle() : kNoHandle);
  const CopyOnWrite::Unsettled lanes = cow_->unsettled();
  MutexLock lock(mutex_);
  ArenaStats stats = counters_;
  const SlotTotals& t = totals_;
  stats.committed_bytes = t.committed_windows * window_bytes;
  stats.live_bytes = t.live_tokens * plan.bytes_per_token;
  stats.reclaimable_bytes = (t.finished_windows - t.finished_shared_windows) * window_bytes;
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
  stats.unconfirmed_slots = static_cast<std::uint32_t>(t.unconfirmed);
  stats.unconfirmed_lanes = lanes.lanes;
  stats.unconfirmed_bytes = t.unconfirmed_windows * window_bytes + lanes.bytes;
  return stats;
}

void ArenaState::SlotTotals::add(const Slot& slot, int sign) {
  // Unsigned arithmetic wraps: adding n * (2^64 - 1) takes n away.
  const std::uint64_t k = sign > 0 ? 1 : ~std::uint64_t{0};
  committed_windows += k * slot.windows;
  dummy_windows += k * (slot.dummy_to - slot.dummy_from);
  if (!slot.unconfirmed.empty()) {
    unconfirmed += k;
    unconfirmed_windows += k * slot.windows;
  }
  switch (slot.state) {
    case SlotState::kActive:
      active += k;
      active_windows += k * slot.windows;
      live_tokens += k * slot.tokens;
      readonly_windows += k * static_cast<std::uint64_t>(
                                  std::count(slot.readonly.begin(), slot.readonly.end(), true));
      break;
    case SlotState::kFinished: {
      finished += k;
      finished_windows += k * slot.windows;
      const auto first = slot.readonly.begin();
      const auto shared = static_cast<std::ptrdiff_t>(
          std::min<std::uint64_t>(slot.prefix_handles.size() / fragments, slot.readonly.size()));
      finished_shared_windows +=
          k * static_cast<std::uint64_t>(std::count(first, first + shared, true));
      break;
    }
    case SlotState::kQuarantined:
      quarantined += k;
      break;
    case SlotState::kFree:
      break;
  }
}

std::vector<const Reservation*> ArenaState::reservations() const {
  std::vector<const Reservation*> list{reservation_.get(), &cow_->scratch()};
  if (dummy_) list.push_back(&dummy_->home());
  return list;
}

void ArenaState::begin_capture() {
  MutexLock lock(mutex_);
  ++capture_depth_;  // from now on nothing new starts mapping or unmapping
  // Wait for map or unmap calls already in flight: none may run inside the capture.
  changed_.wait(lock.native(), [&]() KVVM_REQUIRES(mutex_) {
    return std::none_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.busy; });
  });
}

void ArenaState::end_capture() {
  {
    MutexLock lock(mutex_);
    --capture_depth_;
  }
  changed_.notify_all();
}

}  // namespace kvvm
