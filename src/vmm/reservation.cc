// Reservation: see reservation.h for the contract. The shape of every multi-step operation
// here is the same: validate everything first (a refused call changes nothing), take what can
// fail cheaply (handles) before what is costly to undo (mappings), and on failure undo in
// reverse order, recording anything that could not be undone instead of forgetting it.
// Mapping handles another mapping holds, access changes and replacement: reservation_sharing.cc.
#include "kvvm/vmm/reservation.h"

#include <algorithm>
#include <string>

#include "base/format.h"
#include "kvvm/base/bytes.h"
#include "kvvm/base/log.h"
#include "vmm/teardown_stats.h"

namespace kvvm {
namespace {

void append_range(std::string& list, std::size_t offset, std::size_t len) {
  if (!list.empty()) list += ", ";
  list += byte_range(offset, len);
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
  const auto range = [&] { return std::string(what) + " " + byte_range(offset, len); };
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
    return Status::InvalidArgument(std::string(what) + " " + byte_range(offset, len) +
                                   ": overlaps the mapped block " +
                                   byte_range(it->first, it->second.bytes));
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
    return Status::Unavailable(std::string(what) + " " + byte_range(offset, len) + ": overlaps " +
                               byte_range(it->first, it->second) +
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
  const auto range = [&] { return std::string(what) + " " + byte_range(offset, len); };
  auto it = blocks_.upper_bound(offset);
  if (it != blocks_.begin()) {
    auto previous = std::prev(it);
    if (previous->first < offset && previous->first + previous->second.bytes > offset) {
      return Status::InvalidArgument(range() + ": cuts the mapped block " +
                                     byte_range(previous->first, previous->second.bytes));
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
                                     byte_range(it->first, it->second.bytes));
    }
    if (it->second.poisoned) {
      return Status::FailedPrecondition(range() + ": the block " +
                                        byte_range(it->first, it->second.bytes) +
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
      return Status::InvalidArgument("commit " + byte_range(range.offset, range.len) +
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
              "commit " + byte_range(ranges[i].offset, ranges[i].len) + " overlaps " +
              byte_range(ranges[j].offset, ranges[j].len) + " of the same transaction");
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
      "release " + byte_range(offset, len) + " of the reservation at " + hex(base_) +
          ": unmap failed; left mapped and poisoned (never reused, still charged): " + failed,
      DriverFailure{"unmap", "UNMAP_FAILED", 0});
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
