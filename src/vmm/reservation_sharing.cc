// Reservation's mappings of handles it shares with others (map_shared, map_shared_many), access
// changes (set_access) and replacing one block's handle (replace): the operations sharing and
// copy-on-write are built on, in the shape reservation.cc describes.
#include <algorithm>
#include <string>
#include <vector>

#include "base/format.h"
#include "kvvm/vmm/reservation.h"

namespace kvvm {

Status Reservation::map_shared(std::size_t offset, const HandleInfo& handle, Access access,
                               std::size_t handle_offset, std::size_t bytes) {
  const std::string what = "map_shared of handle " + std::to_string(handle.handle) + " at offset " +
                           std::to_string(offset);
  if (handle.granule != granule_) {
    return Status::InvalidArgument(what + ": the handle's granule " +
                                   std::to_string(handle.granule) +
                                   " differs from this reservation's " + std::to_string(granule_));
  }
  const std::size_t handle_bytes = handle.bytes;
  if (bytes == 0 && handle_offset < handle_bytes) bytes = handle_bytes - handle_offset;
  if (handle_offset % granule_ != 0 || bytes == 0 || handle_offset + bytes > handle_bytes) {
    return Status::InvalidArgument(what + ": handle range " + byte_range(handle_offset, bytes) +
                                   " is not a granule-aligned part of its " +
                                   std::to_string(handle_bytes) + " bytes");
  }
  if ((handle_offset != 0 || bytes != handle_bytes) && !driver_.maps_handle_subranges()) {
    return Status::Unavailable(what + ": this driver maps whole handles only (part " +
                               byte_range(handle_offset, bytes) + " of " +
                               std::to_string(handle_bytes) +
                               " bytes asked); commit one granule per handle to share parts");
  }
  KVVM_RETURN_IF_ERROR(check_range(what, offset, bytes));
  {
    MutexLock lock(mutex_);
    KVVM_RETURN_IF_ERROR(check_unmapped(what, offset, bytes));
    pending_.emplace(offset, bytes);
  }
  const std::vector<Range> claimed{Range{offset, bytes}};
  // Counted before the map, atomically with the check that the handle is still the one
  // described: its last other mapping may go meanwhile, and this one must keep it.
  if (Status shared = pool_.share(handle.handle, handle_bytes, handle.epoch); !shared.ok()) {
    unclaim(claimed);
    return shared.with_context(what);
  }
  Status mapped = driver_.map(base_ + offset, bytes, handle.handle, handle_offset);
  if (!mapped.ok()) {
    pool_.note_unmapped(handle.handle);
    unclaim(claimed);
    return mapped.with_context(what);
  }
  Block block{offset, bytes, handle.handle, handle_offset, Access::kNone, true, false};
  Status access_set = driver_.set_access(base_ + offset, bytes, access);
  if (access_set.ok()) {
    block.access = access;
    MutexLock lock(mutex_);
    put_block(block);
    pending_.erase(offset);
    return Status::Ok();
  }
  // Withdraw this mapping only: the handle stays with its owner and its other sharers.
  const std::string residual = roll_back({block}, {Taken{handle.handle, false}});
  unclaim(claimed);
  std::string context = what + ": set_access failed, mapping withdrawn";
  if (!residual.empty()) context += "; its unmap failed too, left mapped and poisoned";
  return access_set.with_context(context);
}

Status Reservation::map_shared_many(const std::vector<SharedMapping>& mappings, Access access) {
  if (mappings.empty()) return Status::Ok();
  // In offset order: the runs of contiguous offsets, and the overlap check, read neighbours.
  std::vector<SharedMapping> sorted = mappings;
  std::sort(sorted.begin(), sorted.end(),
            [](const SharedMapping& a, const SharedMapping& b) { return a.offset < b.offset; });
  const auto what = [&](const SharedMapping& m) {
    return "map_shared of handle " + std::to_string(m.handle.handle) + " at offset " +
           std::to_string(m.offset);
  };
  std::vector<Range> claimed;
  claimed.reserve(sorted.size());
  for (const SharedMapping& m : sorted) {
    if (m.handle.granule != granule_) {
      return Status::InvalidArgument(
          what(m) + ": the handle's granule " + std::to_string(m.handle.granule) +
          " differs from this reservation's " + std::to_string(granule_));
    }
    KVVM_RETURN_IF_ERROR(check_range("map_shared", m.offset, m.handle.bytes));
    if (!claimed.empty() && claimed.back().offset + claimed.back().len > m.offset) {
      return Status::InvalidArgument(what(m) + ": overlaps " +
                                     byte_range(claimed.back().offset, claimed.back().len) +
                                     " of the same transaction");
    }
    claimed.push_back(Range{m.offset, m.handle.bytes});
  }
  {
    MutexLock lock(mutex_);
    for (const Range& range : claimed) {
      KVVM_RETURN_IF_ERROR(check_unmapped("map_shared", range.offset, range.len));
    }
    for (const Range& range : claimed) pending_.emplace(range.offset, range.len);
  }
  // Counted before each map, as map_shared does; `shared` handles are counted, `mapped` of
  // them mapped too.
  std::size_t shared = 0;
  Status failure;
  // Messages are built only on a failure path: a transaction that succeeds formats nothing.
  for (; shared < sorted.size(); ++shared) {
    const HandleInfo& h = sorted[shared].handle;
    Status counted = pool_.share(h.handle, h.bytes, h.epoch);
    if (!counted.ok()) {
      failure = counted.with_context(what(sorted[shared]));
      break;
    }
  }
  std::vector<Block> mapped;
  std::vector<Taken> taken;
  mapped.reserve(shared);
  for (std::size_t i = 0; i < shared && failure.ok(); ++i) {
    const SharedMapping& m = sorted[i];
    failure = driver_.map(base_ + m.offset, m.handle.bytes, m.handle.handle, 0);
    if (!failure.ok()) failure = failure.with_context(what(m));
    if (failure.ok()) {
      mapped.push_back(
          Block{m.offset, m.handle.bytes, m.handle.handle, 0, Access::kNone, true, false});
      taken.push_back(Taken{m.handle.handle, false});
    }
  }
  // One access change per run of contiguous windows.
  for (std::size_t first = 0; first < mapped.size() && failure.ok();) {
    std::size_t end = first + 1;
    while (end < mapped.size() &&
           mapped[end].offset == mapped[end - 1].offset + mapped[end - 1].bytes) {
      ++end;
    }
    const std::size_t run = mapped[end - 1].offset + mapped[end - 1].bytes - mapped[first].offset;
    failure = driver_.set_access(base_ + mapped[first].offset, run, access);
    if (!failure.ok()) {
      failure = failure.with_context("set_access " + byte_range(mapped[first].offset, run));
    }
    first = end;
  }
  if (failure.ok()) {
    MutexLock lock(mutex_);
    for (Block& block : mapped) {
      block.access = access;
      put_block(block);
    }
    for (const Range& range : claimed) pending_.erase(range.offset);
    return Status::Ok();
  }
  // Withdraw: the mapped blocks unmapped (poisoned where that fails), the counted but unmapped
  // handles uncounted; the handles stay with their owners and other sharers.
  const std::string residual = roll_back(mapped, taken);
  for (std::size_t i = mapped.size(); i < shared; ++i) pool_.note_unmapped(sorted[i].handle.handle);
  unclaim(claimed);
  std::string context = "map_shared of " + std::to_string(sorted.size()) + " handles withdrawn";
  if (!residual.empty()) {
    context += "; left mapped and poisoned because their unmap failed: " + residual;
  }
  return failure.with_context(context);
}

Status Reservation::set_access(std::size_t offset, std::size_t len, Access access) {
  KVVM_RETURN_IF_ERROR(check_range("set_access", offset, len));
  {
    MutexLock lock(mutex_);
    KVVM_RETURN_IF_ERROR(check_covered("set_access", offset, len));
    pending_.emplace(offset, len);
  }
  Status changed = driver_.set_access(base_ + offset, len, access);
  MutexLock lock(mutex_);
  pending_.erase(offset);
  KVVM_RETURN_IF_ERROR(changed.with_context("set_access " + byte_range(offset, len)));
  for (auto it = blocks_.lower_bound(offset); it != blocks_.lower_bound(offset + len); ++it) {
    it->second.access = access;
  }
  return Status::Ok();
}

Status Reservation::replace(std::size_t offset, Handle fresh, Access access) {
  Block old;
  {
    MutexLock lock(mutex_);
    auto it = blocks_.find(offset);
    if (it == blocks_.end()) {
      return Status::InvalidArgument("replace at offset " + std::to_string(offset) +
                                     ": no block starts there");
    }
    old = it->second;
    if (old.poisoned) {
      return Status::FailedPrecondition("replace " + byte_range(offset, old.bytes) +
                                        ": the block is poisoned (an earlier unmap failed)");
    }
    KVVM_RETURN_IF_ERROR(check_not_pending("replace", offset, old.bytes));
    pending_.emplace(offset, old.bytes);
  }
  const std::vector<Range> claimed{Range{offset, old.bytes}};
  const std::string what = "replace " + byte_range(offset, old.bytes) + " of the reservation at " +
                           hex(base_) + " (handle " + std::to_string(old.handle) + " -> " +
                           std::to_string(fresh) + ")";
  Result<HandleInfo> info = pool_.describe(fresh);
  if (!info.ok() || info->state != HandleState::kInUse || info->bytes != old.bytes) {
    unclaim(claimed);
    return Status::InvalidArgument(what + ": the new handle must be in use with " +
                                   std::to_string(old.bytes) + " bytes");
  }
  if (Status unmapped = driver_.unmap(base_ + offset, old.bytes); !unmapped.ok()) {
    poison(old);
    unclaim(claimed);
    return unmapped.with_context(what + ": the old mapping could not be unmapped; poisoned");
  }
  Status failure = driver_.map(base_ + offset, old.bytes, fresh, 0);
  const bool fresh_mapped = failure.ok();
  if (failure.ok()) failure = driver_.set_access(base_ + offset, old.bytes, access);
  if (failure.ok()) {
    pool_.note_mapped(fresh);
    pool_.note_unmapped(old.handle);
    MutexLock lock(mutex_);
    put_block(Block{offset, old.bytes, fresh, 0, access, false, false});
    pending_.erase(offset);
    return Status::Ok();
  }
  if (fresh_mapped && !driver_.unmap(base_ + offset, old.bytes).ok()) {
    // The new handle's mapping is stuck: it takes the old one's place, poisoned.
    pool_.note_mapped(fresh);
    pool_.note_unmapped(old.handle);
    poison(Block{offset, old.bytes, fresh, 0, access, false, false});
    unclaim(claimed);
    return failure.with_context(what +
                                "; the new mapping could not be unmapped either, left "
                                "mapped and poisoned (the old handle's mapping is gone)");
  }
  Status back = driver_.map(base_ + offset, old.bytes, old.handle, old.handle_offset);
  const bool back_mapped = back.ok();
  if (back.ok()) back = driver_.set_access(base_ + offset, old.bytes, old.access);
  if (back.ok()) {
    unclaim(claimed);
    return failure.with_context(what + " rolled back: the old mapping is back");
  }
  if (back_mapped && !driver_.unmap(base_ + offset, old.bytes).ok()) {
    poison(old);
    unclaim(claimed);
    return failure.with_context(what + "; mapping the old handle back failed (" + back.to_string() +
                                ") and so did unmapping it: poisoned");
  }
  pool_.note_unmapped(old.handle);
  {
    MutexLock lock(mutex_);
    erase_block(offset);
    pending_.erase(offset);
  }
  return failure.with_context(what + "; mapping the old handle back failed too (" +
                              back.to_string() + "): the window is left unmapped");
}

}  // namespace kvvm
