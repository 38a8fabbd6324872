// Reservation: see reservation.h for the contract. The shape of every multi-step operation
// here is the same: validate everything first (a refused call changes nothing), take what can
// fail cheaply (handles) before what is costly to undo (mappings), and on failure undo in
// reverse order, recording anything that could not be undone instead of forgetting it.
#include "kvvm/vmm/reservation.h"

#include <algorithm>
#include <string>

#include "base/format.h"
#include "kvvm/base/bytes.h"
#include "kvvm/base/log.h"
#include "vmm/teardown_stats.h"

namespace kvvm {
namespace {

std::string range_text(std::size_t offset, std::size_t len) {
  char text[64];  // snprintf, not string concatenation: GCC 12 -Wrestrict false positive
  std::snprintf(text, sizeof text, "[%zu, %zu)", offset, offset + len);
  return text;
}

void append_range(std::string& list, std::size_t offset, std::size_t len) {
  if (!list.empty()) list += ", ";
  list += range_text(offset, len);
}

}  // namespace

Result<std::unique_ptr<Reservation>> Reservation::create(HandlePool& pool, std::size_t bytes,
                                                         ReservationOptions options) {
  const std::size_t granule = pool.granule();
  if (bytes == 0 || bytes % granule != 0) {
    return Status::InvalidArgument("reservation of " + std::to_string(bytes) +
                                   " bytes: not a positive multiple of the granule " +
                                   std::to_string(granule));
  }
  Result<Address> base = pool.driver().reserve(bytes);
  if (!base.ok()) {
    return base.status().with_context("reserving " + format_bytes(bytes) + " of addresses");
  }
  if (!options.teardown_synchronizer) {
    Driver* driver = &pool.driver();
    options.teardown_synchronizer = [driver] { return driver->synchronize(); };
  }
  return std::unique_ptr<Reservation>(new Reservation(pool, *base, bytes, std::move(options)));
}

Reservation::Reservation(HandlePool& pool, Address base, std::size_t size,
                         ReservationOptions options)
    : pool_(pool),
      driver_(pool.driver()),
      base_(base),
      size_(size),
      granule_(pool.granule()),
      options_(std::move(options)) {}

Reservation::~Reservation() {
  if (!blocks_.empty()) {
    Status synchronized = options_.teardown_synchronizer();
    if (!synchronized.ok()) {
      // A kernel may still read this memory: unmapping or reusing it could hand another
      // request's bytes to it. Leak it deliberately, keep it charged, and say so once.
      detail::note_leaked_reservation();
      detail::note_leaked_blocks(blocks_.size(), mapped_bytes());
      detail::note_leaked_addresses(size_);
      log(LogLevel::kWarning,
          "reservation teardown synchronization failed; leaving " + std::to_string(blocks_.size()) +
              " mapped block(s) (" + format_bytes(mapped_bytes()) + ") and " + format_bytes(size_) +
              " of addresses at " + hex(base_) +
              " to the driver's teardown rather than risking a read after free: " +
              synchronized.to_string());
      return;
    }
    // Unmap each run of adjacent healthy blocks; poisoned blocks stay as they are.
    auto it = blocks_.begin();
    while (it != blocks_.end()) {
      if (it->second.poisoned) {
        ++it;
        continue;
      }
      const std::size_t start = it->first;
      std::size_t end = start;
      while (it != blocks_.end() && !it->second.poisoned && it->first == end) {
        end += it->second.bytes;
        ++it;
      }
      const std::string failed = unmap_covered(start, end - start);
      if (!failed.empty()) {
        log(LogLevel::kWarning, "reservation teardown could not unmap " + failed);
      }
      it = blocks_.upper_bound(start);
    }
  }
  if (!blocks_.empty()) {
    // Poisoned blocks (or ones whose unmap failed just now) keep the range alive.
    detail::note_leaked_blocks(blocks_.size(), mapped_bytes());
    detail::note_leaked_addresses(size_);
    return;
  }
  Status freed = driver_.free(base_, size_);
  if (!freed.ok()) {
    detail::note_free_failure();
    detail::note_leaked_addresses(size_);
    log(LogLevel::kWarning,
        "freeing reservation at " + hex(base_) + " failed: " + freed.to_string());
  }
}

Status Reservation::check_range(std::string_view what, std::size_t offset, std::size_t len) const {
  // Messages are formatted only when a check fails: the commit path stays free of strings.
  const auto range = [&] { return std::string(what) + " " + range_text(offset, len); };
  if (len == 0) return Status::InvalidArgument(range() + ": empty range");
  if (offset % granule_ != 0 || len % granule_ != 0) {
    return Status::InvalidArgument(range() + ": offset and length must be multiples of the " +
                                   std::to_string(granule_) + "-byte granule");
  }
  if (offset > size_ || len > size_ - offset) {
    return Status::InvalidArgument(range() + ": outside the reservation of " +
                                   std::to_string(size_) + " bytes");
  }
  return Status::Ok();
}

Status Reservation::check_unmapped(std::string_view what, std::size_t offset,
                                   std::size_t len) const {
  auto it = blocks_.lower_bound(offset);
  if (it != blocks_.begin()) {
    auto previous = std::prev(it);
    if (previous->first + previous->second.bytes > offset) it = previous;
  }
  if (it != blocks_.end() && it->first < offset + len) {
    return Status::InvalidArgument(std::string(what) + " " + range_text(offset, len) +
                                   ": overlaps the mapped block " +
                                   range_text(it->first, it->second.bytes));
  }
  return check_not_pending(what, offset, len);
}

Status Reservation::check_not_pending(std::string_view what, std::size_t offset,
                                      std::size_t len) const {
  auto it = pending_.lower_bound(offset);
  if (it != pending_.begin()) {
    auto previous = std::prev(it);
    if (previous->first + previous->second > offset) it = previous;
  }
  if (it != pending_.end() && it->first < offset + len) {
    return Status::Unavailable(std::string(what) + " " + range_text(offset, len) + ": overlaps " +
                               range_text(it->first, it->second) +
                               ", which another call is committing or releasing now");
  }
  return Status::Ok();
}

void Reservation::unclaim(const std::vector<Range>& ranges) {
  MutexLock lock(mutex_);
  for (const Range& range : ranges) pending_.erase(range.offset);
}

Status Reservation::check_covered(std::string_view what, std::size_t offset,
                                  std::size_t len) const {
  const auto range = [&] { return std::string(what) + " " + range_text(offset, len); };
  auto it = blocks_.upper_bound(offset);
  if (it != blocks_.begin()) {
    auto previous = std::prev(it);
    if (previous->first < offset && previous->first + previous->second.bytes > offset) {
      return Status::InvalidArgument(range() + ": cuts the mapped block " +
                                     range_text(previous->first, previous->second.bytes));
    }
  }
  std::size_t cursor = offset;
  for (it = blocks_.lower_bound(offset); cursor < offset + len; ++it) {
    if (it == blocks_.end() || it->first != cursor) {
      return Status::InvalidArgument(range() + ": the window at offset " + std::to_string(cursor) +
                                     " is not mapped");
    }
    if (it->first + it->second.bytes > offset + len) {
      return Status::InvalidArgument(range() + ": cuts the mapped block " +
                                     range_text(it->first, it->second.bytes));
    }
    if (it->second.poisoned) {
      return Status::FailedPrecondition(range() + ": the block " +
                                        range_text(it->first, it->second.bytes) +
                                        " is poisoned (an earlier unmap failed)");
    }
    cursor += it->second.bytes;
  }
  return check_not_pending(what, offset, len);
}

void Reservation::poison(Block block) {
  block.poisoned = true;
  pool_.quarantine(block.handle, "unmap at offset " + std::to_string(block.offset) + " failed");
  MutexLock lock(mutex_);
  put_block(block);
}

void Reservation::put_block(const Block& block) {
  if (blocks_.count(block.offset) != 0) erase_block(block.offset);
  blocks_.emplace(block.offset, block);
  mapped_bytes_ += block.bytes;
  if (block.poisoned) residual_bytes_ += block.bytes;
  HandleUse& use = handle_use_[block.handle];
  if (use.blocks++ == 0) {
    use.bytes = block.bytes;
    distinct_bytes_ += use.bytes;
  }
}

void Reservation::erase_block(std::size_t offset) {
  auto it = blocks_.find(offset);
  if (it == blocks_.end()) return;
  const Block& block = it->second;
  mapped_bytes_ -= block.bytes;
  if (block.poisoned) residual_bytes_ -= block.bytes;
  auto use = handle_use_.find(block.handle);
  if (--use->second.blocks == 0) {
    distinct_bytes_ -= use->second.bytes;
    handle_use_.erase(use);
  }
  blocks_.erase(it);
}

std::string Reservation::roll_back(const std::vector<Block>& mapped,
                                   const std::vector<Taken>& taken) {
  const auto disposition = [&](std::size_t i) {
    return taken[i].created ? Disposition::kRelease : Disposition::kKeep;
  };
  std::string residual;
  for (std::size_t i = mapped.size(); i-- > 0;) {
    const Block& block = mapped[i];
    if (driver_.unmap(base_ + block.offset, block.bytes).ok()) {
      pool_.note_unmapped(block.handle, disposition(i));
    } else {
      poison(block);
      append_range(residual, block.offset, block.bytes);
    }
  }
  for (std::size_t i = mapped.size(); i < taken.size(); ++i) {
    pool_.give_back(taken[i].handle, disposition(i));
  }
  return residual;
}

Status Reservation::commit(std::size_t offset, std::size_t len, Grant* grant,
                           CommitOptions options) {
  return commit_ranges({Range{offset, len}}, grant, options);
}

Status Reservation::commit_ranges(const std::vector<Range>& ranges, Grant* grant,
                                  CommitOptions options) {
  if (ranges.empty()) return Status::InvalidArgument("commit of no range");
  const std::size_t handle_bytes = options.handle_bytes == 0 ? granule_ : options.handle_bytes;
  for (const Range& range : ranges) {
    KVVM_RETURN_IF_ERROR(check_range("commit", range.offset, range.len));
    if (handle_bytes % granule_ != 0) {
      return Status::InvalidArgument("commit " + range_text(range.offset, range.len) +
                                     ": handle size " + std::to_string(handle_bytes) +
                                     " is not a multiple of the granule " +
                                     std::to_string(granule_));
    }
  }
  {
    MutexLock lock(mutex_);
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      KVVM_RETURN_IF_ERROR(check_unmapped("commit", ranges[i].offset, ranges[i].len));
      for (std::size_t j = 0; j < i; ++j) {
        if (ranges[j].offset < ranges[i].offset + ranges[i].len &&
            ranges[i].offset < ranges[j].offset + ranges[j].len) {
          return Status::InvalidArgument(
              "commit " + range_text(ranges[i].offset, ranges[i].len) + " overlaps " +
              range_text(ranges[j].offset, ranges[j].len) + " of the same transaction");
        }
      }
    }
    for (const Range& range : ranges) pending_.emplace(range.offset, range.len);
  }
  // Built only on a failure path: a commit that succeeds formats nothing.
  const auto what = [&] {
    std::string text;
    for (std::size_t i = 0; i < ranges.size() && i < 4; ++i) {
      append_range(text, ranges[i].offset, ranges[i].len);
    }
    if (ranges.size() > 4) text += " and " + std::to_string(ranges.size() - 4) + " more ranges";
    return "commit " + text + " of the reservation at " + hex(base_);
  };

  // Every block this transaction will map, in order.
  std::vector<Block> planned;
  for (const Range& range : ranges) {
    const std::size_t end = range.offset + range.len;
    // Advance by what was planned, never by handle_bytes itself: a huge handle size must not
    // wrap the cursor around.
    for (std::size_t at = range.offset, bytes = 0; at < end; at += bytes) {
      bytes = std::min(handle_bytes, end - at);
      planned.push_back(Block{at, bytes, kNoHandle, 0, Access::kNone, false, false});
    }
  }

  // Take every handle first: running out here costs no unmap.
  std::vector<Taken> taken;
  taken.reserve(planned.size());
  for (const Block& block : planned) {
    Taken next;
    Result<Handle> handle = pool_.checkout(block.bytes, grant, &next.created);
    if (!handle.ok()) {
      (void)roll_back({}, taken);
      unclaim(ranges);
      return handle.status().with_context(what());
    }
    next.handle = *handle;
    taken.push_back(next);
  }

  std::vector<Block> mapped;
  mapped.reserve(taken.size());
  Status failure;
  for (std::size_t i = 0; i < taken.size() && failure.ok(); ++i) {
    failure = driver_.map(base_ + planned[i].offset, planned[i].bytes, taken[i].handle, 0);
    if (failure.ok()) {
      pool_.note_mapped(taken[i].handle);
      mapped.push_back(planned[i]);
      mapped.back().handle = taken[i].handle;
    }
  }
  // One access change per range: the driver call that costs most per granule.
  for (std::size_t r = 0; r < ranges.size() && failure.ok(); ++r) {
    failure = driver_.set_access(base_ + ranges[r].offset, ranges[r].len, options.access);
  }
  if (failure.ok()) {
    MutexLock lock(mutex_);
    for (Block& block : mapped) {
      block.access = options.access;
      put_block(block);
    }
    for (const Range& range : ranges) pending_.erase(range.offset);
    return Status::Ok();
  }

  const std::string residual = roll_back(mapped, taken);
  unclaim(ranges);
  std::string context = what() + " rolled back";
  if (!residual.empty()) {
    context += "; left mapped and poisoned because their unmap failed: " + residual;
  }
  return failure.with_context(context);
}

std::string Reservation::unmap_covered(std::size_t offset, std::size_t len,
                                       Disposition disposition) {
  // REQUIRES: the caller claimed [offset, offset + len) in pending_ (or owns the reservation
  // exclusively, as the destructor does), so no other call touches these blocks while the
  // driver calls below run without the lock.
  std::vector<Block> blocks;
  {
    MutexLock lock(mutex_);
    for (auto it = blocks_.lower_bound(offset); it != blocks_.lower_bound(offset + len); ++it) {
      blocks.push_back(it->second);
    }
  }
  const auto forget = [&](const Block& block) {
    MutexLock lock(mutex_);
    erase_block(block.offset);
  };
  if (driver_.unmap(base_ + offset, len).ok()) {
    for (const Block& block : blocks) {
      forget(block);
      pool_.note_unmapped(block.handle, disposition);
    }
    return {};
  }
  // The coalesced unmap failed: find out block by block what is still mapped.
  std::string failed;
  for (const Block& block : blocks) {
    if (driver_.unmap(base_ + block.offset, block.bytes).ok()) {
      forget(block);
      pool_.note_unmapped(block.handle, disposition);
    } else {
      poison(block);
      append_range(failed, block.offset, block.bytes);
    }
  }
  return failed;
}

Status Reservation::release(std::size_t offset, std::size_t len, Disposition disposition) {
  KVVM_RETURN_IF_ERROR(check_range("release", offset, len));
  {
    MutexLock lock(mutex_);
    KVVM_RETURN_IF_ERROR(check_covered("release", offset, len));
    pending_.emplace(offset, len);
  }
  const std::string failed = unmap_covered(offset, len, disposition);
  unclaim({Range{offset, len}});
  if (failed.empty()) return Status::Ok();
  return Status::DriverError(
      "release " + range_text(offset, len) + " of the reservation at " + hex(base_) +
          ": unmap failed; left mapped and poisoned (never reused, still charged): " + failed,
      DriverFailure{"unmap", "UNMAP_FAILED", 0});
}

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
    return Status::InvalidArgument(what + ": handle range " + range_text(handle_offset, bytes) +
                                   " is not a granule-aligned part of its " +
                                   std::to_string(handle_bytes) + " bytes");
  }
  if ((handle_offset != 0 || bytes != handle_bytes) && !driver_.maps_handle_subranges()) {
    return Status::Unavailable(what + ": this driver maps whole handles only (part " +
                               range_text(handle_offset, bytes) + " of " +
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
                                     range_text(claimed.back().offset, claimed.back().len) +
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
      failure = failure.with_context("set_access " + range_text(mapped[first].offset, run));
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
  KVVM_RETURN_IF_ERROR(changed.with_context("set_access " + range_text(offset, len)));
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
      return Status::FailedPrecondition("replace " + range_text(offset, old.bytes) +
                                        ": the block is poisoned (an earlier unmap failed)");
    }
    KVVM_RETURN_IF_ERROR(check_not_pending("replace", offset, old.bytes));
    pending_.emplace(offset, old.bytes);
  }
  const std::vector<Range> claimed{Range{offset, old.bytes}};
  const std::string what = "replace " + range_text(offset, old.bytes) + " of the reservation at " +
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

std::vector<Block> Reservation::blocks_in(std::size_t offset, std::size_t len) const {
  MutexLock lock(mutex_);
  std::vector<Block> list;
  for (auto it = blocks_.lower_bound(offset); it != blocks_.end() && it->first < offset + len;
       ++it) {
    list.push_back(it->second);
  }
  return list;
}

std::vector<Block> Reservation::blocks() const {
  MutexLock lock(mutex_);
  std::vector<Block> list;
  list.reserve(blocks_.size());
  for (const auto& [offset, block] : blocks_) list.push_back(block);
  return list;
}

const Block* Reservation::block_at(std::size_t offset) const {
  MutexLock lock(mutex_);  // for the lookup; the pointer's contract is the caller's
  auto it = blocks_.upper_bound(offset);
  if (it == blocks_.begin()) return nullptr;
  --it;
  return offset < it->first + it->second.bytes ? &it->second : nullptr;
}

std::uint64_t Reservation::mapped_bytes() const {
  MutexLock lock(mutex_);
  return mapped_bytes_;
}

std::uint64_t Reservation::residual_bytes() const {
  MutexLock lock(mutex_);
  return residual_bytes_;
}

std::uint64_t Reservation::distinct_handle_bytes(Handle excluded) const {
  MutexLock lock(mutex_);
  auto it = excluded == kNoHandle ? handle_use_.end() : handle_use_.find(excluded);
  return distinct_bytes_ - (it == handle_use_.end() ? 0 : it->second.bytes);
}

std::uint64_t Reservation::mappings_of(Handle handle) const {
  MutexLock lock(mutex_);
  auto it = handle_use_.find(handle);
  return it == handle_use_.end() ? 0 : it->second.blocks;
}

}  // namespace kvvm
