// PrefixSharing: see prefix_sharing.h.
//
// Why windows and not tokens: the hardware protects whole granules, so only the windows lying
// wholly inside a prefix can be mapped read-only into several slots; the bytes of the prefix in
// the last, partial window are copied (the boundary copy). A token's bytes lie in the same
// window index of every fragment, so a window index is the unit of sharing and of
// copy-on-write across all fragments.
//
// Copy-on-write of one granule (in place, or through a scratch window) is CopyOnWrite's; this
// file decides which windows need it and keeps the slots' read-only flags.
#include "kv/prefix/prefix_sharing.h"

#include <algorithm>
#include <optional>
#include <string>

#include "kv/copy_on_write.h"
#include "kv/slot_claim.h"

namespace kvvm {
namespace {

using detail::slot_text;
using Slot = ArenaState::Slot;
using SlotEdit = ArenaState::SlotEdit;
using SlotState = ArenaState::SlotState;

}  // namespace

bool PrefixSharing::holds(std::uint32_t slot, std::uint64_t occupancy) const {
  MutexLock lock(state_.mutex_);
  return slot < state_.slots_.size() && state_.slots_[slot].state == SlotState::kActive &&
         state_.slots_[slot].occupancy == occupancy;
}

Status PrefixSharing::check_compatible(const SharedPrefix& prefix, std::string_view what) const {
  const LayoutPlan& mine = state_.options_.plan;
  const LayoutPlan& theirs = prefix.plan();
  const std::string head = std::string(what) + ": the prefix was published by an arena with ";
  if (theirs.granule != mine.granule) {
    return Status::InvalidArgument(head + "a " + std::to_string(theirs.granule) +
                                   "-byte granule; this one maps " + std::to_string(mine.granule) +
                                   "-byte granules");
  }
  if (theirs.layout != mine.layout || theirs.bytes_per_token != mine.bytes_per_token ||
      theirs.contiguous_bytes_per_token != mine.contiguous_bytes_per_token ||
      theirs.fragments != mine.fragments || theirs.fragment_stride != mine.fragment_stride) {
    return Status::InvalidArgument(
        head + "geometry " + theirs.geometry.name + " (" + std::string(to_string(theirs.layout)) +
        ", " + std::to_string(theirs.bytes_per_token) + " bytes per token, " +
        std::to_string(theirs.fragments) + " fragment(s) of " +
        std::to_string(theirs.fragment_stride) + " bytes); this one has " + mine.geometry.name +
        " (" + std::string(to_string(mine.layout)) + ", " + std::to_string(mine.bytes_per_token) +
        " bytes per token, " + std::to_string(mine.fragments) + " fragment(s) of " +
        std::to_string(mine.fragment_stride) + " bytes)");
  }
  if (&prefix.pool() != &state_.pool_) {
    return Status::InvalidArgument(head +
                                   "another handle pool (another driver or device): its "
                                   "handles cannot be mapped here");
  }
  return Status::Ok();
}

std::vector<std::uint64_t> PrefixSharing::readonly_written(const ArenaState& state,
                                                           const Slot& slot, std::uint64_t from,
                                                           std::uint64_t to) {
  std::vector<std::uint64_t> windows;
  if (slot.readonly.empty() || to <= from) return windows;
  const LayoutPlan& plan = state.options_.plan;
  const std::uint64_t first = from * plan.contiguous_bytes_per_token / plan.granule;
  const std::uint64_t end =
      std::min<std::uint64_t>(plan.windows_per_fragment(to), slot.readonly.size());
  for (std::uint64_t w = first; w < end; ++w) {
    if (slot.readonly[w]) windows.push_back(w);
  }
  return windows;
}

void PrefixSharing::drop_sources(SlotId slot, std::uint64_t keep_below) {
  std::vector<std::shared_ptr<const SharedPrefix>> dropped;
  {
    MutexLock lock(state_.mutex_);
    auto& list = state_.slots_[slot].sourcing;
    for (auto it = list.begin(); it != list.end();) {
      std::shared_ptr<const SharedPrefix> prefix = it->lock();
      if (!prefix || prefix->info().tokens > keep_below) {
        if (prefix) dropped.push_back(std::move(prefix));
        it = list.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& prefix : dropped) prefix->drop_source(this, slot);
}

Result<std::shared_ptr<SharedPrefix>> PrefixSharing::publish(SlotId id,
                                                             std::uint64_t prefix_tokens) {
  KVVM_RETURN_IF_ERROR(state_.check_slot("publish", id));
  const PrefixShareability share = prefix_shareability(state_.options_.plan, prefix_tokens);
  if (prefix_tokens > 0 && prefix_tokens <= state_.options_.plan.max_context && !share.shareable) {
    return Status::FailedPrecondition("publish of " + std::to_string(prefix_tokens) +
                                      " tokens of " + slot_text(id) + ": " + share.refusal_reason);
  }
  return publish_windows(id, prefix_tokens, nullptr);
}

Result<std::vector<HandleInfo>> PrefixSharing::seal_windows(SlotId id, std::uint64_t from,
                                                            std::uint64_t to,
                                                            std::vector<std::uint64_t>* newly) {
  const std::string what = "sealing windows [" + std::to_string(from) + ", " + std::to_string(to) +
                           ") of " + slot_text(id);
  if (id >= state_.options_.max_slots || from > to) {
    return Status::InvalidArgument(what + ": no such slot or range");
  }
  MutexLock lock(state_.mutex_);
  Slot& slot = state_.slots_[id];
  if (slot.state != SlotState::kActive) {
    return Status::FailedPrecondition(what + ": no active sequence there");
  }
  if (to > slot.windows) {
    return Status::InvalidArgument(what + ": only " + std::to_string(slot.windows) +
                                   " window(s) per fragment are committed");
  }
  if (state_.capture_depth_ > 0) return Status::Unavailable(what + " refused during graph capture");
  SlotClaim claim = SlotClaim::take(state_, id, lock);
  if (slot.state != SlotState::kActive) {
    return Status::FailedPrecondition(what + ": the slot was quarantined meanwhile");
  }
  std::vector<std::uint64_t> turned;
  for (std::uint64_t w = from; w < to; ++w) {
    if (w >= slot.readonly.size() || !slot.readonly[w]) turned.push_back(w);
  }
  lock.unlock();

  Status made = Status::Ok();
  std::vector<HandleInfo> handles;
  handles.reserve(state_.options_.plan.fragments * (to - from));
  if (to > from) {
    for (const Range& range : state_.window_ranges(id, from, to)) {
      made = state_.reservation_->set_access(range.offset, range.len, Access::kReadOnly);
      if (!made.ok()) break;
      for (const Block& block : state_.reservation_->blocks_in(range.offset, range.len)) {
        Result<HandleInfo> info = state_.pool_.describe(block.handle);
        if (!info.ok()) {
          made = info.status();
          break;
        }
        handles.push_back(*info);
      }
      if (!made.ok()) break;
    }
  }
  if (!made.ok()) {
    restore_writable(id, turned);
    return made.with_context(what);
  }
  lock.lock();
  SlotEdit edit(state_, slot);
  if (slot.readonly.size() < to) slot.readonly.resize(to, false);
  for (std::uint64_t w = from; w < to; ++w) slot.readonly[w] = true;
  if (newly != nullptr) *newly = std::move(turned);
  return handles;
}

Result<std::shared_ptr<SharedPrefix>> PrefixSharing::publish_windows(
    SlotId id, std::uint64_t tokens, std::vector<std::uint64_t>* newly) {
  const LayoutPlan& plan = state_.options_.plan;
  const std::string what = "publish of " + std::to_string(tokens) + " tokens of " + slot_text(id);
  {
    MutexLock lock(state_.mutex_);
    const Slot& slot = state_.slots_[id];
    if (slot.state != SlotState::kActive) {
      return Status::FailedPrecondition(what + ": no active sequence there");
    }
    if (tokens == 0 || tokens > slot.tokens) {
      return Status::InvalidArgument(what + ": the sequence has written " +
                                     std::to_string(slot.tokens) +
                                     " tokens; a prefix holds between 1 and that many");
    }
  }
  const std::uint64_t windows = tokens * plan.contiguous_bytes_per_token / plan.granule;
  Result<std::vector<HandleInfo>> handles = seal_windows(id, 0, windows, newly);
  if (!handles.ok()) return handles.status().with_context(what);
  SharedPrefixInfo info;
  info.tokens = tokens;
  info.fragments = plan.fragments;
  info.windows_per_fragment = windows;
  info.shared_bytes = plan.fragments * windows * plan.granule;
  info.boundary_bytes =
      plan.fragments * (tokens * plan.contiguous_bytes_per_token - windows * plan.granule);
  std::shared_ptr<SharedPrefix> prefix =
      SharedPrefix::create(state_.pool_, plan, info, std::move(handles).value());
  MutexLock lock(state_.mutex_);
  Slot& slot = state_.slots_[id];
  prefix->add_source({this, id, slot.occupancy, state_.slot_base(id)});
  slot.sourcing.push_back(prefix);
  ++state_.counters_.published_prefixes;
  return prefix;
}

void PrefixSharing::restore_writable(SlotId id, const std::vector<std::uint64_t>& windows) {
  // Best effort: a window that stays read-only is still correct (a later write copies it or
  // switches it in place), so the flags follow what the table says afterwards. One that another
  // slot still maps (a fork's child kept mapped because its boundary copy was left unconfirmed)
  // stays read-only: shared windows are read-only everywhere.
  const LayoutPlan& plan = state_.options_.plan;
  for (std::uint64_t w : windows) {
    for (const Range& range : state_.window_ranges(id, w, w + 1)) {
      const auto blocks = state_.reservation_->blocks_in(range.offset, range.len);
      if (blocks.empty() || blocks.front().access != Access::kReadOnly) continue;
      Result<HandleInfo> info = state_.pool_.describe(blocks.front().handle);
      if (!info.ok() || info->mappings > 1 || info->crosses_processes) continue;
      (void)state_.reservation_->set_access(range.offset, plan.granule, Access::kReadWrite);
    }
  }
  MutexLock lock(state_.mutex_);
  Slot& slot = state_.slots_[id];
  SlotEdit edit(state_, slot);
  for (std::uint64_t w : windows) {
    bool readonly = false;
    for (const Range& range : state_.window_ranges(id, w, w + 1)) {
      const auto blocks = state_.reservation_->blocks_in(range.offset, range.len);
      readonly = readonly || (!blocks.empty() && blocks.front().access == Access::kReadOnly);
    }
    if (w < slot.readonly.size()) slot.readonly[w] = readonly;
  }
}

Status PrefixSharing::install_prefix(SlotId id, const SharedPrefix& prefix, std::uint64_t tokens,
                                     std::uint64_t kept, Stream stream, bool* unconfirmed) {
  const LayoutPlan& plan = state_.options_.plan;
  const SharedPrefixInfo& info = prefix.info();
  const std::uint64_t k = info.windows_per_fragment;
  const std::uint64_t needed = plan.windows_per_fragment(tokens);
  // 1. The shared windows, read-only, at the same offsets: one transaction, whose access
  // changes cover each fragment's run of windows at once (all or nothing). A kept slot maps
  // them already.
  std::vector<std::size_t> mapped;
  if (kept == 0) {
    std::vector<Reservation::SharedMapping> shared;
    shared.reserve(plan.fragments * k);
    mapped.reserve(plan.fragments * k);
    for (std::uint64_t f = 0; f < plan.fragments; ++f) {
      for (std::uint64_t w = 0; w < k; ++w) {
        const std::size_t at = id * plan.slot_stride + f * plan.fragment_stride + w * plan.granule;
        shared.push_back({at, prefix.handles()[f * k + w]});
        mapped.push_back(at);
      }
    }
    Status status = state_.reservation_->map_shared_many(shared, Access::kReadOnly);
    if (!status.ok()) return status.with_context("mapping the prefix's windows");
  }
  const auto unmap_shared = [&] {
    for (std::size_t at : mapped) (void)state_.reservation_->release(at, plan.granule);  // poisons
  };
  // 2. Private windows for the rest, under a grant for those bytes only.
  const std::uint64_t first_private = std::max(k, kept);
  Status status = Status::Ok();
  if (needed > first_private) {
    status = state_.commit_windows(id, first_private, needed, state_.options_.budget_wait);
    if (!status.ok()) {
      unmap_shared();
      return status;
    }
  }
  const auto undo_all = [&] {
    if (needed > first_private) (void)state_.release_windows(id, first_private, needed);
    unmap_shared();
  };
  // 3. The boundary: the prefix's bytes in window k of each fragment. A copy whose completion
  // is unknown may still write them: then nothing is undone (see start_sharer()).
  if (info.boundary_bytes > 0) {
    status = copy_boundary(id, prefix, stream, unconfirmed);
    if (!status.ok()) {
      if (!*unconfirmed) undo_all();
      return status;
    }
  }
  // 4. The padded tail, as for any admission.
  if (state_.padded_windows() > 0) {
    status = state_.cover_tail(id, std::max(first_private, needed));
    if (!status.ok()) {
      undo_all();
      return status.with_context("mapping the dummy tail page");
    }
  }
  return Status::Ok();
}

Status PrefixSharing::copy_boundary(SlotId id, const SharedPrefix& prefix, Stream stream,
                                    bool* unconfirmed) {
  // From a sequence that holds the bytes intact, on the caller's stream; waited for, because
  // the source may leave as soon as this returns. Copies queued are always fenced, also after
  // a later one failed to queue: until a fence completes they may write this slot's windows
  // and read the source's.
  const LayoutPlan& plan = state_.options_.plan;
  const SharedPrefixInfo& info = prefix.info();
  const std::uint64_t k = info.windows_per_fragment;
  const std::uint64_t boundary = info.boundary_bytes / plan.fragments;
  std::optional<SharedPrefix::Source> source;
  for (const SharedPrefix::Source& candidate : prefix.sources()) {
    if (candidate.holder->holds(candidate.slot, candidate.occupancy)) {
      source = candidate;
      break;
    }
  }
  if (!source) {
    return Status::FailedPrecondition(
        "no sequence holds the prefix's boundary bytes any more (every user finished or "
        "rewound below " +
        std::to_string(info.tokens) + " tokens)");
  }
  const Address from = source->base;
  const Address to = state_.slot_base(id);
  Driver& driver = state_.pool_.driver();
  Status status = Status::Ok();
  std::uint64_t queued = 0;
  for (; queued < plan.fragments; ++queued) {
    const std::uint64_t at = queued * plan.fragment_stride + k * plan.granule;
    status = driver.copy(to + at, from + at, boundary, stream);
    if (!status.ok()) break;
  }
  if (queued > 0) {
    Status drained = driver.drain(stream);
    if (!drained.ok()) {
      // Whether the copies ended is unknown: this slot keeps its windows (start_sharer()), and
      // the source, when it is a slot of this arena, its own, until a later fence on `stream`
      // completes.
      *unconfirmed = true;
      MutexLock lock(state_.mutex_);
      if (source->holder == this) {
        Slot& from_slot = state_.slots_[source->slot];
        SlotEdit edit(state_, from_slot);
        state_.mark_unconfirmed(from_slot, stream);
      }
      return drained.with_context("copying the prefix's boundary bytes (" + std::to_string(queued) +
                                  " copies queued)");
    }
  }
  if (!status.ok()) return status.with_context("copying the prefix's boundary bytes");
  MutexLock lock(state_.mutex_);
  state_.counters_.boundary_copy_bytes += info.boundary_bytes;
  return Status::Ok();
}

Result<SlotId> PrefixSharing::admit_shared(const SharedPrefix& prefix, std::uint64_t tokens,
                                           Stream stream) {
  const LayoutPlan& plan = state_.options_.plan;
  const std::uint64_t p = prefix.info().tokens;
  const std::string what =
      "admit of " + std::to_string(tokens) + " tokens sharing a prefix of " + std::to_string(p);
  KVVM_RETURN_IF_ERROR(check_compatible(prefix, what));
  if (tokens < p || tokens > plan.max_context) {
    return Status::InvalidArgument(what + ": a sharer holds between " + std::to_string(p) +
                                   " and the max context of " + std::to_string(plan.max_context) +
                                   " tokens");
  }
  if (!prefix.usable()) {
    return Status::FailedPrecondition(what +
                                      ": the prefix is no longer usable (every sequence that "
                                      "mapped it has gone, or none holds its boundary bytes)");
  }
  // The last sharer of this prefix in a finished slot left it mapped: take that slot and
  // keep the mapping (no driver call for the shared windows, where unmapping them from one
  // slot and mapping them into another costs tens of microseconds a granule on a GPU).
  const std::uint64_t k = prefix.info().windows_per_fragment;
  std::vector<Handle> handles;
  handles.reserve(prefix.handles().size());
  for (const HandleInfo& info : prefix.handles()) handles.push_back(info.handle);
  if (std::optional<SlotId> mapping = take_slot_mapping(handles, k)) {
    MutexLock lock(state_.mutex_, std::defer_lock);
    SlotClaim claim = SlotClaim::adopt(state_, *mapping, lock);
    const std::uint64_t kept = keep_prefix_windows(*mapping, handles, k);
    if (kept > 0) {
      return start_sharer(*mapping, prefix, std::move(handles), tokens, kept, stream, what);
    }
  }
  KVVM_ASSIGN_OR_RETURN(SlotId taken, state_.take_empty_slot(what));
  MutexLock lock(state_.mutex_, std::defer_lock);
  SlotClaim claim = SlotClaim::adopt(state_, taken, lock);
  return start_sharer(taken, prefix, std::move(handles), tokens, 0, stream, what);
}

Result<SlotId> PrefixSharing::start_sharer(SlotId id, const SharedPrefix& prefix,
                                           std::vector<Handle> handles, std::uint64_t tokens,
                                           std::uint64_t kept, Stream stream,
                                           const std::string& what) {
  const LayoutPlan& plan = state_.options_.plan;
  bool unconfirmed = false;
  Status installed = install_prefix(id, prefix, tokens, kept, stream, &unconfirmed);
  const bool poisoned = !installed.ok() && state_.has_poison(id);
  MutexLock lock(state_.mutex_);  // released before the caller's claim ends
  Slot& slot = state_.slots_[id];
  SlotEdit edit(state_, slot);
  const std::uint64_t k = prefix.info().windows_per_fragment;
  const std::uint64_t windows = std::max({k, kept, plan.windows_per_fragment(tokens)});
  if (!installed.ok() && unconfirmed) {
    // The boundary copy may still write this slot: it stays finished with every window the
    // admission mapped (a sharer's finished slot), taken by no one until a fence confirms it.
    if (slot.state != SlotState::kFinished) slot.last_used = ++state_.tick_;
    slot.state = SlotState::kFinished;
    slot.tokens = 0;
    slot.windows = windows;
    if (slot.readonly.size() < k) slot.readonly.resize(k);
    std::fill(slot.readonly.begin(), slot.readonly.begin() + static_cast<std::ptrdiff_t>(k), true);
    slot.prefix_handles = std::move(handles);
    state_.mark_unconfirmed(slot, stream);
    ++state_.counters_.unconfirmed_copies;
    return installed.with_context(what + " into " + slot_text(id) +
                                  ": the slot keeps its windows mapped, finished, until a later "
                                  "fence on the copy's stream completes");
  }
  if (!installed.ok()) {
    // A kept slot stays finished with what it kept; an empty one stays empty.
    if (installed.code() == StatusCode::kResourceExhausted) ++state_.counters_.refusals;
    if (poisoned) slot.state = SlotState::kQuarantined;
    return installed.with_context(what + " into " + slot_text(id));
  }
  slot.windows = windows;
  state_.start_sequence(slot, tokens);
  if (slot.readonly.size() < k) slot.readonly.resize(k);
  std::fill(slot.readonly.begin(), slot.readonly.begin() + static_cast<std::ptrdiff_t>(k), true);
  slot.prefix_handles = std::move(handles);
  slot.sourcing.push_back(prefix.weak_from_this());
  prefix.add_source({this, id, slot.occupancy, state_.slot_base(id)});
  ++state_.counters_.admissions;
  ++state_.counters_.shared_admissions;
  if (kept > 0) ++state_.counters_.reused_admissions;
  return id;
}

std::optional<SlotId> PrefixSharing::take_slot_mapping(const std::vector<Handle>& handles,
                                                       std::uint64_t k) {
  if (k == 0) return std::nullopt;
  MutexLock lock(state_.mutex_);
  if (state_.capture_depth_ > 0) return std::nullopt;
  std::optional<SlotId> chosen;
  for (SlotId id = 0; id < state_.slots_.size(); ++id) {
    const Slot& slot = state_.slots_[id];
    if (slot.state != SlotState::kFinished || slot.busy || !slot.unconfirmed.empty() ||
        slot.prefix_handles != handles || state_.prefix_windows(slot) != k) {
      continue;
    }
    // The least recently used: its fence is the likeliest to have completed.
    if (!chosen || slot.last_used < state_.slots_[*chosen].last_used) chosen = id;
  }
  if (chosen) state_.slots_[*chosen].busy = true;
  return chosen;
}

std::uint64_t PrefixSharing::keep_prefix_windows(SlotId id, const std::vector<Handle>& handles,
                                                 std::uint64_t k) {
  const LayoutPlan& plan = state_.options_.plan;
  // The hint against what is mapped: window w of fragment f must be one block of the
  // prefix's handle, read-only.
  const std::vector<Range> ranges = state_.window_ranges(id, 0, k);
  for (std::uint64_t f = 0; f < ranges.size(); ++f) {
    const std::vector<Block> blocks =
        state_.reservation_->blocks_in(ranges[f].offset, ranges[f].len);
    if (blocks.size() != k) return 0;
    for (std::uint64_t w = 0; w < k; ++w) {
      const Block& block = blocks[w];
      if (block.offset != ranges[f].offset + w * plan.granule || block.bytes != plan.granule ||
          block.handle != handles[f * k + w] || block.access != Access::kReadOnly) {
        return 0;
      }
    }
  }
  std::uint64_t windows = 0;
  std::uint64_t keep = k;
  {
    MutexLock lock(state_.mutex_);
    const Slot& slot = state_.slots_[id];
    windows = slot.windows;
    while (keep < windows && !(keep < slot.readonly.size() && slot.readonly[keep])) ++keep;
  }
  if (keep == windows) return keep;
  // The windows after the kept ones: a kernel of the last sequence may still read them.
  if (!state_.fence_completed(id)) {
    MutexLock lock(state_.mutex_);
    ++state_.counters_.reuse_fence_pending;
    return 0;
  }
  Status released = state_.release_windows(id, keep, windows);
  const bool poisoned = !released.ok() && state_.has_poison(id);
  MutexLock lock(state_.mutex_);
  Slot& slot = state_.slots_[id];
  SlotEdit edit(state_, slot);
  if (!released.ok()) {
    if (poisoned) slot.state = SlotState::kQuarantined;
    return 0;
  }
  slot.windows = keep;
  if (slot.readonly.size() > keep) slot.readonly.resize(keep);
  while (!slot.readonly.empty() && !slot.readonly.back()) slot.readonly.pop_back();
  state_.counters_.reclaimed_bytes += plan.fragments * (windows - keep) * plan.granule;
  return keep;
}

Result<SlotId> PrefixSharing::fork(SlotId parent, std::uint64_t position, Stream stream) {
  KVVM_RETURN_IF_ERROR(state_.check_slot("fork", parent));
  const std::string what =
      "fork of " + slot_text(parent) + " at position " + std::to_string(position);
  std::vector<std::uint64_t> turned;
  Result<std::shared_ptr<SharedPrefix>> prefix = publish_windows(parent, position, &turned);
  if (!prefix.ok()) return prefix.status().with_context("fork");
  Result<SlotId> child = admit_shared(**prefix, position, stream);
  if (!child.ok()) {
    // Nothing changed: the parent's windows that this fork made read-only become writable.
    restore_writable(parent, turned);
    MutexLock lock(state_.mutex_);
    --state_.counters_.published_prefixes;
    return child.status().with_context(what);
  }
  MutexLock lock(state_.mutex_);
  --state_.counters_.published_prefixes;  // a fork's prefix is not a published one
  ++state_.counters_.forks;
  return child;
}

Status PrefixSharing::make_writable(SlotId id, std::uint64_t window, Stream stream) {
  for (const Range& range : state_.window_ranges(id, window, window + 1)) {
    Result<CopyOnWrite::Outcome> made =
        state_.cow_->make_writable(*state_.reservation_, range.offset, id, stream);
    if (!made.ok()) {
      if (state_.cow_->unsettled(id)) {
        // The copy may still read this slot's window: not unmapped before a fence confirms it.
        MutexLock lock(state_.mutex_);
        Slot& slot = state_.slots_[id];
        SlotEdit edit(state_, slot);
        state_.mark_unconfirmed(slot, stream);
        ++state_.counters_.unconfirmed_copies;
      }
      return made.status().with_context(slot_text(id) + ": window " + std::to_string(window));
    }
    MutexLock lock(state_.mutex_);
    if (*made == CopyOnWrite::Outcome::kInPlace) ++state_.counters_.cow_in_place;
    if (*made == CopyOnWrite::Outcome::kCopied) ++state_.counters_.cow_copies;
  }
  return Status::Ok();
}

}  // namespace kvvm
