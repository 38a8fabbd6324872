// Arena: see arena.h. Every operation on a slot follows one pattern: under mutex_, check the
// slot's state and claim it (busy); without the lock, make the driver calls through the
// Reservation (which is safe for disjoint ranges); under mutex_ again, publish the new state
// and release the claim. So the scheduler never waits on a driver call it did not ask for,
// and the worker and the governor's reclaim never touch a slot someone else is changing.
#include "kvvm/arena.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>

namespace kvvm {
namespace {

constexpr std::size_t kLatencyBuckets = 24;  // 2^24 µs = 16.8 s
// More sequences than any engine runs at once; the slot table is allocated up front.
constexpr std::uint32_t kMaxSlots = 1u << 20;

std::string slot_text(SlotId slot) { return "slot " + std::to_string(slot); }

}  // namespace

Result<std::unique_ptr<Arena>> Arena::create(HandlePool& pool, Governor& governor,
                                             ArenaOptions options) {
  const LayoutPlan& plan = options.plan;
  if (plan.granule != pool.granule()) {
    return Status::InvalidArgument("arena plan granule " + std::to_string(plan.granule) +
                                   " differs from the driver's granule " +
                                   std::to_string(pool.granule()));
  }
  if (options.max_slots == 0 || options.max_slots > kMaxSlots) {
    return Status::InvalidArgument("arena with " + std::to_string(options.max_slots) +
                                   " slots: between 1 and " + std::to_string(kMaxSlots));
  }
  if (plan.slot_stride == 0 || plan.fragments == 0) {
    return Status::InvalidArgument("arena plan has a zero slot stride (plan_layout not run?)");
  }
  if (plan.slot_stride > std::numeric_limits<std::uint64_t>::max() / options.max_slots) {
    return Status::InvalidArgument(std::to_string(options.max_slots) + " slots of " +
                                   std::to_string(plan.slot_stride) +
                                   " bytes overflow the address space");
  }
  if (options.padded_tokens > plan.max_context) {
    return Status::InvalidArgument("padded length " + std::to_string(options.padded_tokens) +
                                   " tokens is beyond the max context of " +
                                   std::to_string(plan.max_context));
  }
  const std::uint64_t bytes = plan.slot_stride * options.max_slots;
  Result<std::unique_ptr<Reservation>> reservation = Reservation::create(pool, bytes);
  if (!reservation.ok()) {
    return reservation.status().with_context("arena of " + std::to_string(options.max_slots) +
                                             " slots x " + std::to_string(plan.slot_stride) +
                                             " bytes (too many slots for the address space?)");
  }
  std::unique_ptr<Reservation> dummy_home;
  if (options.padded_tokens > 0) {
    // The dummy granule: committed once (billed once), zeroed, then made read-only.
    auto home = Reservation::create(pool, plan.granule);
    if (!home.ok()) return home.status().with_context("dummy tail page");
    Result<Grant> grant = governor.prepare(options.tier, plan.granule, options.budget_wait);
    if (!grant.ok()) return grant.status().with_context("dummy tail page");
    Status made = (*home)->commit(0, plan.granule, &*grant);
    grant->commit_charged();
    const std::vector<std::uint8_t> zeros(plan.granule, 0);
    if (made.ok()) made = pool.driver().write((*home)->base(), zeros.data(), zeros.size());
    if (made.ok()) made = (*home)->set_access(0, plan.granule, Access::kReadOnly);
    if (!made.ok()) return made.with_context("dummy tail page");
    dummy_home = std::move(home).value();
  }
  // Addresses only: one window per slot for copy-on-write to map a fresh handle at.
  Result<std::unique_ptr<Reservation>> scratch =
      Reservation::create(pool, plan.granule * options.max_slots);
  if (!scratch.ok()) return scratch.status().with_context("arena copy-on-write windows");
  return std::unique_ptr<Arena>(new Arena(pool, governor, std::move(options),
                                          std::move(reservation).value(), std::move(dummy_home),
                                          std::move(scratch).value()));
}

Arena::Arena(HandlePool& pool, Governor& governor, ArenaOptions options,
             std::unique_ptr<Reservation> reservation, std::unique_ptr<Reservation> dummy_home,
             std::unique_ptr<Reservation> scratch)
    : pool_(pool),
      governor_(governor),
      options_(std::move(options)),
      reservation_(std::move(reservation)),
      dummy_home_(std::move(dummy_home)),
      scratch_(std::move(scratch)),
      slots_(options_.max_slots) {
  counters_.commit_latency_us_log2.assign(kLatencyBuckets, 0);
  if (dummy_home_) {
    const auto blocks = dummy_home_->blocks();
    if (!blocks.empty()) {
      if (auto info = pool_.describe(blocks.front().handle); info.ok()) dummy_ = *info;
    }
  }
  reclaimer_ = governor_.add_reclaimer(options_.tier,
                                       [this](std::uint64_t wanted) { return reclaim(wanted); });
  if (options_.commit_ahead_windows > 0) worker_ = std::thread([this] { worker_loop(); });
}

Arena::~Arena() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
  reclaimer_ = Governor::Registration();  // waits for a reclaim in progress
  for (SlotId id = 0; id < slots_.size(); ++id) drop_sources(id, 0);
  for (Slot& slot : slots_) {
    if (slot.fence != 0) {
      Status destroyed = pool_.driver().destroy_fence(slot.fence);
      if (!destroyed.ok()) {
        std::fprintf(stderr, "kvvm: arena teardown: %s\n", destroyed.to_string().c_str());
      }
      slot.fence = 0;
    }
  }
  // The reservation's destructor synchronizes before unmapping (or leaks deliberately); the
  // dummy granule goes after every slot's mapping of it.
  reservation_.reset();
  dummy_home_.reset();
}

std::vector<Range> Arena::window_ranges(SlotId slot, std::uint64_t from, std::uint64_t to) const {
  const LayoutPlan& plan = options_.plan;
  std::vector<Range> ranges;
  ranges.reserve(plan.fragments);
  for (std::uint64_t f = 0; f < plan.fragments; ++f) {
    ranges.push_back(Range{slot * plan.slot_stride + f * plan.fragment_stride + from * plan.granule,
                           (to - from) * plan.granule});
  }
  return ranges;
}

void Arena::note_latency(std::chrono::steady_clock::duration elapsed) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(elapsed).count();
  const std::size_t bucket =
      us < 2 ? 0
             : std::min<std::size_t>(std::bit_width(static_cast<std::uint64_t>(us)) - 1,
                                     kLatencyBuckets - 1);
  std::lock_guard lock(mutex_);
  ++counters_.commit_latency_us_log2[bucket];
}

Status Arena::commit_windows(SlotId slot, std::uint64_t from, std::uint64_t to,
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
    std::lock_guard lock(mutex_);
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
    std::lock_guard lock(mutex_);
    Slot& s = slots_[slot];
    s.dummy_from = std::max(s.dummy_from, to);
    if (s.dummy_from >= s.dummy_to) s.dummy_from = s.dummy_to = 0;
    return committed;
  }
  if (replaces_dummy) {
    Status restored = map_dummy(slot, dummy_from, dummy_to);
    if (!restored.ok()) {
      // The tail below dummy_to is now a hole: say so, and keep the books true.
      std::lock_guard lock(mutex_);
      counters_.dummy_restore_failures += plan.fragments * (dummy_to - dummy_from);
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

Status Arena::release_windows(SlotId slot, std::uint64_t from, std::uint64_t to) {
  Status result;
  for (const Range& range : window_ranges(slot, from, to)) {
    Status released = reservation_->release(range.offset, range.len);
    if (!released.ok() && result.ok()) result = released;
  }
  return result;
}

bool Arena::has_poison(SlotId slot) const {
  const std::uint64_t begin = slot * options_.plan.slot_stride;
  const std::uint64_t end = begin + options_.plan.slot_stride;
  for (const Block& block : reservation_->blocks()) {
    if (block.poisoned && block.offset >= begin && block.offset < end) return true;
  }
  return false;
}

void Arena::claim(std::unique_lock<std::mutex>& lock, Slot& slot) {
  changed_.wait(lock, [&] { return !slot.busy; });
  slot.busy = true;
}

void Arena::unclaim(SlotId slot) {
  {
    std::lock_guard lock(mutex_);
    slots_[slot].busy = false;
    slots_[slot].shrinking = false;
  }
  changed_.notify_all();
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
    std::fprintf(stderr, "kvvm: %s\n", destroyed.to_string().c_str());
  }
  std::lock_guard lock(mutex_);
  slots_[id].fence = 0;
  return true;
}

std::uint64_t Arena::ahead_target(const Slot& slot) const {
  const std::uint64_t max_windows = options_.plan.fragment_stride / options_.plan.granule;
  return std::min(options_.plan.windows_per_fragment(slot.tokens) + options_.commit_ahead_windows,
                  max_windows);
}

Result<SlotId> Arena::admit(std::uint64_t tokens) {
  const LayoutPlan& plan = options_.plan;
  if (tokens > plan.max_context) {
    return Status::InvalidArgument("admit of " + std::to_string(tokens) +
                                   " tokens: beyond the max context of " +
                                   std::to_string(plan.max_context));
  }
  const std::uint64_t needed = plan.windows_per_fragment(tokens);
  std::unique_lock lock(mutex_);
  if (capture_depth_ > 0) {
    return Status::Unavailable("admit of " + std::to_string(tokens) +
                               " tokens refused during graph capture");
  }
  // Best fit among finished slots: the fewest mapped windows that still cover the request,
  // else the most; a free slot only when no finished one is idle.
  std::optional<SlotId> chosen;
  for (SlotId id = 0; id < slots_.size(); ++id) {
    const Slot& slot = slots_[id];
    // A sequence's shared (read-only) windows cannot be written by the next one.
    if (slot.state != SlotState::kFinished || slot.busy || !slot.readonly.empty()) continue;
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
  if (!chosen) {
    for (SlotId id = 0; id < slots_.size() && !chosen; ++id) {
      if (slots_[id].state == SlotState::kFree && !slots_[id].busy) chosen = id;
    }
  }
  if (!chosen) {
    // Only finished slots with shared windows are left: empty one.
    lock.unlock();
    Result<SlotId> emptied = take_empty_slot("admit of " + std::to_string(tokens) + " tokens");
    if (!emptied.ok()) return emptied.status();
    chosen = *emptied;
    lock.lock();
  }
  const SlotId id = *chosen;
  Slot& slot = slots_[id];
  const SlotState previous = slot.state;
  slot.busy = true;
  const std::uint64_t have = slot.windows;
  lock.unlock();

  if (have < needed) {
    Status committed = commit_windows(id, have, needed, options_.budget_wait);
    if (!committed.ok()) {
      const bool poisoned = has_poison(id);
      lock.lock();
      if (committed.code() == StatusCode::kResourceExhausted) ++counters_.refusals;
      if (poisoned) slots_[id].state = SlotState::kQuarantined;
      slots_[id].busy = false;
      lock.unlock();
      changed_.notify_all();
      return committed.with_context("admit of " + std::to_string(tokens) + " tokens into " +
                                    slot_text(id));
    }
  }
  // A reused slot keeps its old fence until its next finish (or reclaim) destroys it: admission
  // into mapped windows makes no driver call at all.
  if (padded_windows() > 0) {
    Status covered = cover_tail(id, std::max(have, needed));
    if (!covered.ok()) {
      lock.lock();
      slots_[id].windows = std::max(have, needed);
      if (previous != SlotState::kFinished) slots_[id].state = SlotState::kFinished;
      slots_[id].busy = false;
      ++counters_.refusals;
      lock.unlock();
      changed_.notify_all();
      return covered.with_context("admit into " + slot_text(id) + ": mapping the dummy tail page");
    }
  }
  lock.lock();
  slot.windows = std::max(have, needed);
  slot.state = SlotState::kActive;
  slot.tokens = tokens;
  slot.last_used = ++tick_;
  slot.ahead_stalled = false;
  slot.occupancy = ++occupancies_;
  slot.busy = false;
  ++counters_.admissions;
  if (previous == SlotState::kFinished) ++counters_.reused_admissions;
  lock.unlock();
  changed_.notify_all();
  return id;
}

Status Arena::ensure(SlotId id, std::uint64_t tokens, Stream stream) {
  const LayoutPlan& plan = options_.plan;
  if (id >= slots_.size()) {
    return Status::InvalidArgument("ensure of " + slot_text(id) + ": the arena has " +
                                   std::to_string(slots_.size()) + " slots");
  }
  if (tokens > plan.max_context) {
    return Status::InvalidArgument("ensure of " + slot_text(id) + " to " + std::to_string(tokens) +
                                   " tokens: beyond the max context of " +
                                   std::to_string(plan.max_context));
  }
  const std::uint64_t needed = plan.windows_per_fragment(tokens);
  std::unique_lock lock(mutex_);
  Slot& slot = slots_[id];
  if (slot.state != SlotState::kActive) {
    return Status::FailedPrecondition("ensure of " + slot_text(id) + ": no active sequence there");
  }
  ++counters_.ensures;
  // The decode path: already mapped, no driver call. Not while a reclaim holds the slot (it
  // may be unmapping the very windows this length needs); a commit in flight (the worker's)
  // only adds windows, so the decode path need not wait for it.
  // Writing the new tokens must not land in a read-only (shared) window: those go the slow way.
  const bool writes_shared =
      !slot.readonly.empty() && !readonly_written(slot, slot.tokens, tokens).empty();
  if (!slot.shrinking && slot.windows >= needed && !writes_shared) {
    slot.tokens = tokens;
    slot.last_used = ++tick_;
    slot.ahead_stalled = false;
    // Wake the worker only when this growth gave it something to do.
    const bool wake = options_.commit_ahead_windows > 0 && slot.windows < ahead_target(slot);
    lock.unlock();
    if (wake) changed_.notify_all();
    return Status::Ok();
  }
  claim(lock, slot);
  if (slot.state != SlotState::kActive) {  // changed (quarantined) while we waited
    lock.unlock();
    unclaim(id);
    return Status::FailedPrecondition("ensure of " + slot_text(id) +
                                      ": the slot was quarantined while this call waited for it");
  }
  const std::vector<std::uint64_t> shared = readonly_written(slot, slot.tokens, tokens);
  const std::uint64_t missing = needed > slot.windows ? needed - slot.windows : 0;
  if (missing == 0 && shared.empty()) {  // mapped meanwhile (by the worker): as the fast path
    slot.tokens = tokens;
    slot.last_used = ++tick_;
    slot.ahead_stalled = false;
    lock.unlock();
    unclaim(id);
    return Status::Ok();
  }
  if (capture_depth_ > 0) {
    lock.unlock();
    unclaim(id);
    return Status::Unavailable("ensure of " + slot_text(id) + " to " + std::to_string(tokens) +
                               " tokens needs " + std::to_string(missing) +
                               " more window(s) per fragment and " + std::to_string(shared.size()) +
                               " shared window(s) copied: refused during graph capture");
  }
  ++counters_.ensures_committing;
  const std::uint64_t have = slot.windows;
  lock.unlock();
  // Copy-on-write first (the windows below the live end), then growth.
  Status committed = Status::Ok();
  std::vector<std::uint64_t> made_writable;
  for (std::uint64_t w : shared) {
    committed = make_writable(id, w, stream);
    if (!committed.ok()) break;
    made_writable.push_back(w);
  }
  if (committed.ok() && missing > 0) {
    committed = commit_windows(id, have, needed, options_.budget_wait);
  }
  // A failed remap may have left a window unmapped: the slot can no longer be trusted.
  bool broken = !committed.ok() && has_poison(id);
  if (!committed.ok() && !broken && made_writable.size() < shared.size()) {
    for (const Range& range :
         window_ranges(id, shared[made_writable.size()], shared[made_writable.size()] + 1)) {
      broken = broken || reservation_->blocks_in(range.offset, range.len).empty();
    }
  }
  lock.lock();
  for (std::uint64_t w : made_writable) slot.readonly[w] = false;
  while (!slot.readonly.empty() && !slot.readonly.back()) slot.readonly.pop_back();
  if (committed.ok()) {
    slot.windows = std::max(have, needed);
    slot.tokens = tokens;
    slot.last_used = ++tick_;
    slot.ahead_stalled = false;
  } else {
    if (committed.code() == StatusCode::kResourceExhausted) ++counters_.refusals;
    if (broken) slot.state = SlotState::kQuarantined;
  }
  slot.busy = false;
  lock.unlock();
  changed_.notify_all();
  if (!made_writable.empty())
    drop_sources(id, made_writable.front() * options_.plan.granule /
                         options_.plan.contiguous_bytes_per_token);
  return committed.ok() ? committed
                        : committed.with_context("ensure of " + slot_text(id) + " to " +
                                                 std::to_string(tokens) + " tokens");
}

Status Arena::finish(SlotId id, Stream stream) {
  if (id >= slots_.size()) {
    return Status::InvalidArgument("finish of " + slot_text(id) + ": the arena has " +
                                   std::to_string(slots_.size()) + " slots");
  }
  std::unique_lock lock(mutex_);
  Slot& slot = slots_[id];
  if (slot.state != SlotState::kActive) {
    return Status::FailedPrecondition("finish of " + slot_text(id) + ": no active sequence there");
  }
  if (capture_depth_ > 0) {
    return Status::Unavailable("finish of " + slot_text(id) + " refused during graph capture");
  }
  claim(lock, slot);
  if (slot.state != SlotState::kActive) {  // changed (quarantined) while we waited
    lock.unlock();
    unclaim(id);
    return Status::FailedPrecondition("finish of " + slot_text(id) +
                                      ": the slot was quarantined while this call waited for it");
  }
  const Fence old = slot.fence;
  lock.unlock();
  Result<Fence> fence = pool_.driver().record_fence(stream);
  if (!fence.ok()) {
    unclaim(id);
    return fence.status().with_context("finish of " + slot_text(id));
  }
  if (old != 0) (void)pool_.driver().destroy_fence(old);
  drop_sources(id, 0);
  lock.lock();
  slot.fence = *fence;
  slot.state = SlotState::kFinished;
  slot.tokens = 0;
  slot.last_used = ++tick_;
  slot.busy = false;
  lock.unlock();
  changed_.notify_all();
  return Status::Ok();
}

Arena::CaptureGuard Arena::begin_capture() {
  std::unique_lock lock(mutex_);
  ++capture_depth_;  // from now on nothing new starts mapping or unmapping
  // Wait for map or unmap calls already in flight: none may run inside the capture.
  changed_.wait(lock, [&] {
    return std::none_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.busy; });
  });
  return CaptureGuard(this);
}

Arena::CaptureGuard::~CaptureGuard() {
  if (arena_ == nullptr) return;
  {
    std::lock_guard lock(arena_->mutex_);
    --arena_->capture_depth_;
  }
  arena_->changed_.notify_all();
}

std::vector<const Reservation*> Arena::reservations() const {
  std::vector<const Reservation*> list{reservation_.get(), scratch_.get()};
  if (dummy_home_) list.push_back(dummy_home_.get());
  return list;
}

Address Arena::slot_base(SlotId slot) const {
  return reservation_->base() + static_cast<Address>(slot) * options_.plan.slot_stride;
}

std::uint64_t Arena::tokens(SlotId slot) const {
  std::lock_guard lock(mutex_);
  return slot < slots_.size() ? slots_[slot].tokens : 0;
}

ArenaStats Arena::stats() const {
  const LayoutPlan& plan = options_.plan;
  const std::uint64_t window_bytes = plan.fragments * plan.granule;
  // Each handle mapped under the slots once (the dummy page is billed on its own line).
  std::uint64_t physical = 0;
  {
    std::vector<Block> blocks = reservation_->blocks();
    std::sort(blocks.begin(), blocks.end(),
              [](const Block& a, const Block& b) { return a.handle < b.handle; });
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i].handle == dummy_.handle && dummy_.handle != kNoHandle) continue;
      if (i > 0 && blocks[i].handle == blocks[i - 1].handle) continue;
      physical += blocks[i].bytes;
    }
  }
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
  stats.dummy_bytes = dummy_.handle == kNoHandle ? 0 : plan.granule;
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

void Arena::worker_loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    std::optional<SlotId> next;
    changed_.wait(lock, [&] {
      if (stopping_) return true;
      if (capture_depth_ > 0) return false;  // wait until capture ends
      for (SlotId id = 0; id < slots_.size(); ++id) {
        const Slot& s = slots_[id];
        if (s.state == SlotState::kActive && !s.busy && !s.ahead_stalled &&
            s.windows < ahead_target(s)) {
          next = id;
          return true;
        }
      }
      return false;
    });
    if (stopping_) return;
    Slot& slot = slots_[*next];
    slot.busy = true;
    const std::uint64_t from = slot.windows;
    const std::uint64_t to = ahead_target(slot);
    lock.unlock();
    // Never wait for budget: commit-ahead is a convenience, not a claim on memory.
    committing_ahead_ = true;
    Status committed = commit_windows(*next, from, to, std::chrono::milliseconds(0));
    committing_ahead_ = false;
    const bool poisoned = !committed.ok() && has_poison(*next);
    lock.lock();
    if (committed.ok()) {
      slot.windows = to;
      ++counters_.ahead_commits;
    } else {
      slot.ahead_stalled = true;  // retried when the sequence grows again
      if (poisoned) slot.state = SlotState::kQuarantined;
    }
    slot.busy = false;
    changed_.notify_all();
  }
}

// Set while the commit-ahead worker commits: its grant must not evict anything (commit-ahead
// is a convenience, not a claim on memory), or two sequences' leads would evict each other
// forever when the budget holds only one.
thread_local bool Arena::committing_ahead_ = false;

}  // namespace kvvm
