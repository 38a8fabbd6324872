// Arena: see arena.h. Every operation on a slot follows one pattern: under mutex_, check the
// slot's state and claim it (a SlotClaim); without the lock, make the driver calls through the
// Reservation (which is safe for disjoint ranges); under mutex_ again, publish the new state
// and end the claim. So the scheduler never waits on a driver call it did not ask for, and the
// worker and the governor's reclaim never touch a slot someone else is changing.
//
// This file holds creation, admission, growth, finish and capture; the dummy tail, sharing,
// reclamation, commit-ahead and statistics have files of their own (arena_*.cc), and the
// parts with no slot state (DummyTail, CopyOnWrite, CommitAhead) are classes of their own.
#include "kvvm/arena.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>

#include "kv/arena_detail.h"
#include "kv/commit_ahead.h"
#include "kv/copy_on_write.h"
#include "kv/dummy_tail.h"
#include "kv/slot_claim.h"
#include "kvvm/log.h"

namespace kvvm {
namespace {

using detail::slot_text;

// More sequences than any engine runs at once; the slot table is allocated up front.
constexpr std::uint32_t kMaxSlots = 1u << 20;

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
  std::unique_ptr<DummyTail> dummy;
  if (options.padded_tokens > 0) {
    auto made = DummyTail::create(pool, governor, options.tier, options.budget_wait);
    if (!made.ok()) return made.status();
    dummy = std::move(made).value();
  }
  auto cow =
      CopyOnWrite::create(pool, governor, options.tier, options.max_slots, options.budget_wait);
  if (!cow.ok()) return cow.status().with_context("arena");
  return std::unique_ptr<Arena>(new Arena(pool, governor, std::move(options),
                                          std::move(reservation).value(), std::move(dummy),
                                          std::move(cow).value()));
}

Arena::Arena(HandlePool& pool, Governor& governor, ArenaOptions options,
             std::unique_ptr<Reservation> reservation, std::unique_ptr<DummyTail> dummy,
             std::unique_ptr<CopyOnWrite> cow)
    : pool_(pool),
      governor_(governor),
      options_(std::move(options)),
      reservation_(std::move(reservation)),
      dummy_(std::move(dummy)),
      cow_(std::move(cow)),
      slots_(options_.max_slots) {
  counters_.commit_latency_us_log2.assign(detail::kLatencyBuckets, 0);
  reclaimer_ = governor_.add_reclaimer(options_.tier,
                                       [this](std::uint64_t wanted) { return reclaim(wanted); });
  if (options_.commit_ahead_windows > 0) ahead_ = start_commit_ahead();
}

Arena::~Arena() {
  ahead_.reset();                         // stops the worker
  reclaimer_ = Governor::Registration();  // waits for a reclaim in progress
  for (SlotId id = 0; id < slots_.size(); ++id) drop_sources(id, 0);
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

Status Arena::check_slot(std::string_view what, SlotId slot) const {
  if (slot < slots_.size()) return Status::Ok();
  return Status::InvalidArgument(std::string(what) + " of " + slot_text(slot) + ": the arena has " +
                                 std::to_string(slots_.size()) + " slots");
}

Result<SlotId> Arena::admit(std::uint64_t tokens) {
  if (tokens > options_.plan.max_context) {
    return detail::beyond_context("admit of", tokens, options_.plan.max_context);
  }
  const std::uint64_t needed = options_.plan.windows_per_fragment(tokens);
  std::unique_lock lock(mutex_);
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
    Result<SlotId> emptied = take_empty_slot("admit of " + std::to_string(tokens) + " tokens");
    if (!emptied.ok()) return emptied.status();
    chosen = *emptied;
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
  ++counters_.admissions;
  if (previous == SlotState::kFinished) ++counters_.reused_admissions;
  return id;
}

std::optional<SlotId> Arena::best_admission_slot(std::uint64_t needed) const {
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
  for (SlotId id = 0; id < slots_.size() && !chosen; ++id) {
    if (slots_[id].state == SlotState::kFree && !slots_[id].busy) chosen = id;
  }
  return chosen;
}

Status Arena::fill_admitted(SlotId id, SlotState previous, std::uint64_t have, std::uint64_t needed,
                            std::uint64_t tokens) {
  if (have < needed) {
    Status committed = commit_windows(id, have, needed, options_.budget_wait);
    if (!committed.ok()) {
      const bool poisoned = has_poison(id);
      std::lock_guard lock(mutex_);
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
  std::lock_guard lock(mutex_);
  SlotEdit edit(*this, slots_[id]);
  slots_[id].windows = std::max(have, needed);
  if (previous != SlotState::kFinished) slots_[id].state = SlotState::kFinished;
  ++counters_.refusals;
  return covered.with_context("admit into " + slot_text(id) + ": mapping the dummy tail page");
}

void Arena::start_sequence(Slot& slot, std::uint64_t tokens) {
  slot.state = SlotState::kActive;
  slot.tokens = tokens;
  slot.last_used = ++tick_;
  slot.ahead_stalled = false;
  slot.occupancy = ++occupancies_;
}

void Arena::note_growth(Slot& slot, std::uint64_t tokens) {
  slot.tokens = tokens;
  slot.last_used = ++tick_;
  slot.ahead_stalled = false;
}

Status Arena::ensure(SlotId id, std::uint64_t tokens, Stream stream) {
  KVVM_RETURN_IF_ERROR(check_slot("ensure", id));
  if (tokens > options_.plan.max_context) {
    return detail::beyond_context("ensure of " + slot_text(id) + " to", tokens,
                                  options_.plan.max_context);
  }
  const std::uint64_t needed = options_.plan.windows_per_fragment(tokens);
  std::unique_lock lock(mutex_);
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
  if (!slot.shrinking && mapped && readonly_written(slot, slot.tokens, tokens).empty()) {
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
  const std::vector<std::uint64_t> shared = readonly_written(slot, slot.tokens, tokens);
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
  return grow_claimed(claim, lock, id, tokens, have, needed, shared, stream);
}

Status Arena::grow_claimed(SlotClaim& claim, std::unique_lock<std::mutex>& lock, SlotId id,
                           std::uint64_t tokens, std::uint64_t have, std::uint64_t needed,
                           const std::vector<std::uint64_t>& shared, Stream stream) {
  std::vector<std::uint64_t> made_writable;
  Status committed = write_and_grow(id, shared, have, needed, stream, made_writable);
  const bool broken = !committed.ok() && broken_after(id, shared, made_writable.size());
  lock.lock();
  {
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
  lock.unlock();
  claim.end();
  // The sequence no longer holds the boundary bytes of prefixes past the first rewritten window.
  const LayoutPlan& plan = options_.plan;
  if (!made_writable.empty()) {
    drop_sources(id, made_writable.front() * plan.granule / plan.contiguous_bytes_per_token);
  }
  return committed.ok() ? committed
                        : committed.with_context("ensure of " + slot_text(id) + " to " +
                                                 std::to_string(tokens) + " tokens");
}

Status Arena::write_and_grow(SlotId id, const std::vector<std::uint64_t>& shared,
                             std::uint64_t have, std::uint64_t needed, Stream stream,
                             std::vector<std::uint64_t>& made_writable) {
  // Copy-on-write first (the windows below the live end), then growth.
  for (std::uint64_t w : shared) {
    KVVM_RETURN_IF_ERROR(make_writable(id, w, stream));
    made_writable.push_back(w);
  }
  if (needed > have) return commit_windows(id, have, needed, options_.budget_wait);
  return Status::Ok();
}

bool Arena::broken_after(SlotId id, const std::vector<std::uint64_t>& shared,
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

// Mapping under the slots.

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
    SlotEdit edit(*this, s);
    s.dummy_from = std::max(s.dummy_from, to);
    if (s.dummy_from >= s.dummy_to) s.dummy_from = s.dummy_to = 0;
    return committed;
  }
  if (replaces_dummy) {
    Status restored = dummy_->map(*reservation_, window_ranges(slot, dummy_from, dummy_to));
    if (!restored.ok()) {
      // The tail below dummy_to is now a hole: say so, and keep the books true.
      std::lock_guard lock(mutex_);
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

Status Arena::finish(SlotId id, Stream stream) {
  KVVM_RETURN_IF_ERROR(check_slot("finish", id));
  std::unique_lock lock(mutex_);
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
  drop_sources(id, 0);
  lock.lock();
  SlotEdit edit(*this, slot);
  slot.fence = *fence;
  slot.state = SlotState::kFinished;
  slot.tokens = 0;
  slot.last_used = ++tick_;
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
  std::vector<const Reservation*> list{reservation_.get(), &cow_->scratch()};
  if (dummy_) list.push_back(&dummy_->home());
  return list;
}

Address Arena::slot_base(SlotId slot) const {
  return reservation_->base() + static_cast<Address>(slot) * options_.plan.slot_stride;
}

std::uint64_t Arena::tokens(SlotId slot) const {
  std::lock_guard lock(mutex_);
  return slot < slots_.size() ? slots_[slot].tokens : 0;
}

}  // namespace kvvm
