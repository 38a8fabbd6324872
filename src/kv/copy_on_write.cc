// CopyOnWrite: see copy_on_write.h.
#include "kv/copy_on_write.h"

#include <string>

namespace kvvm {

Result<std::unique_ptr<CopyOnWrite>> CopyOnWrite::create(HandlePool& pool, Governor& governor,
                                                         TierId tier, std::uint32_t lanes,
                                                         std::chrono::milliseconds wait) {
  // Addresses only: a lane's window is mapped only while a copy runs through it.
  Result<std::unique_ptr<Reservation>> scratch =
      Reservation::create(pool, pool.granule() * static_cast<std::size_t>(lanes));
  if (!scratch.ok()) return scratch.status().with_context("copy-on-write windows");
  return std::unique_ptr<CopyOnWrite>(
      new CopyOnWrite(pool, governor, tier, wait, std::move(scratch).value()));
}

Result<CopyOnWrite::Outcome> CopyOnWrite::make_writable(Reservation& target, std::size_t offset,
                                                        std::uint32_t lane, Stream stream) {
  const auto blocks = target.blocks_in(offset, target.granule());
  if (blocks.size() != 1 || blocks.front().poisoned) {
    return Status::FailedPrecondition("the window at offset " + std::to_string(offset) +
                                      " is not one healthy mapping");
  }
  const Block& block = blocks.front();
  if (block.access == Access::kReadWrite) return Outcome::kAlreadyWritable;
  KVVM_ASSIGN_OR_RETURN(HandleInfo info, pool_.describe(block.handle));
  if (info.mappings <= 1 && info.holds == 0 && info.state == HandleState::kInUse &&
      !info.crosses_processes) {
    // No one else maps it: write in place. References to its current content go stale.
    pool_.reissue(block.handle);
    KVVM_RETURN_IF_ERROR(target.set_access(offset, target.granule(), Access::kReadWrite));
    return Outcome::kInPlace;
  }
  KVVM_RETURN_IF_ERROR(copy(target, offset, lane, stream));
  return Outcome::kCopied;
}

Status CopyOnWrite::copy(Reservation& target, std::size_t offset, std::uint32_t lane,
                         Stream stream) {
  const std::uint64_t granule = target.granule();
  const std::string what = "copy-on-write at offset " + std::to_string(offset);
  KVVM_RETURN_IF_ERROR(settle(lane).with_context(what));
  Result<Grant> grant = governor_.prepare(tier_, granule, wait_);
  if (!grant.ok()) return grant.status().with_context(what);
  bool created = false;
  Result<Handle> fresh = pool_.checkout(granule, &*grant, &created);
  grant->commit_charged();
  if (!fresh.ok()) return fresh.status().with_context(what);
  const Disposition on_failure = created ? Disposition::kRelease : Disposition::kKeep;
  // A hold: the fresh handle stays checked out while its scratch mapping comes and goes; it is
  // dropped at the end, when on failure it was the last reference and the handle goes back as
  // the transaction found it (released if this call created it).
  pool_.hold(*fresh);
  Result<HandleInfo> info = pool_.describe(*fresh);
  const std::size_t scratch = static_cast<std::size_t>(lane) * granule;
  Status status =
      info.ok() ? scratch_->map_shared(scratch, *info, Access::kReadWrite) : info.status();
  const bool scratch_mapped = status.ok();
  Driver& driver = pool_.driver();
  bool queued = false;
  if (status.ok()) {
    status = driver.copy(scratch_->base() + scratch, target.base() + offset, granule, stream);
    queued = status.ok();
  }
  if (queued) status = driver.drain(stream);
  if (queued && !status.ok()) {
    // The copy may still write the fresh handle and read the target's window: the scratch
    // mapping and the hold stay (the target keeps its old mapping) until a fence confirms it.
    {
      MutexLock lock(mutex_);
      pending_[lane] = Pending{*fresh, on_failure, stream, false};
    }
    return status.with_context(what + ": the copy's completion is unknown, so scratch lane " +
                               std::to_string(lane) +
                               " keeps the fresh handle mapped, held and charged until a later "
                               "fence on its stream completes");
  }
  if (status.ok()) status = target.replace(offset, *fresh, Access::kReadWrite);
  Status unscratched = scratch_mapped ? scratch_->release(scratch, granule) : Status::Ok();
  pool_.unhold(*fresh, status.ok() ? Disposition::kKeep : on_failure);
  if (!status.ok()) return status.with_context(what);
  if (!unscratched.ok()) {
    // The window was copied and remapped, but the scratch mapping is stuck (poisoned, its
    // handle quarantined and still charged): say so; the window itself is writable.
    return unscratched.with_context(what + ": copied, but the scratch window stays mapped");
  }
  return Status::Ok();
}

CopyOnWrite::Unsettled CopyOnWrite::unsettled() const {
  MutexLock lock(mutex_);
  return Unsettled{static_cast<std::uint32_t>(pending_.size()),
                   pending_.size() * static_cast<std::uint64_t>(scratch_->granule())};
}

bool CopyOnWrite::unsettled(std::uint32_t lane) const {
  MutexLock lock(mutex_);
  return pending_.contains(lane);
}

Status CopyOnWrite::settle(std::uint32_t lane) {
  Pending pending;
  {
    MutexLock lock(mutex_);
    auto it = pending_.find(lane);
    if (it == pending_.end()) return Status::Ok();
    if (it->second.settling) {
      return Status::Unavailable("scratch lane " + std::to_string(lane) +
                                 " is being settled by another call");
    }
    it->second.settling = true;
    pending = it->second;
  }
  Status drained = pool_.driver().drain(pending.stream);
  if (!drained.ok()) {
    MutexLock lock(mutex_);
    pending_[lane].settling = false;
    return Status::Unavailable(
        "scratch lane " + std::to_string(lane) +
        " still holds a copy that no fence has confirmed complete: " + drained.to_string());
  }
  return release_lane(lane, pending);
}

Status CopyOnWrite::release_lane(std::uint32_t lane, const Pending& pending) {
  const std::size_t granule = scratch_->granule();
  // A failed unmap poisons the scratch window (its handle quarantined, still charged).
  Status released = scratch_->release(static_cast<std::size_t>(lane) * granule, granule);
  pool_.unhold(pending.fresh, pending.disposition);
  {
    MutexLock lock(mutex_);
    pending_.erase(lane);
  }
  return released.with_context("settling scratch lane " + std::to_string(lane));
}

CopyOnWrite::~CopyOnWrite() {
  std::vector<std::uint32_t> lanes;
  {
    MutexLock lock(mutex_);
    for (const auto& [lane, pending] : pending_) lanes.push_back(lane);
  }
  for (std::uint32_t lane : lanes) settle(lane).ignore();
  std::vector<std::pair<std::uint32_t, Pending>> left;
  {
    MutexLock lock(mutex_);
    left.assign(pending_.begin(), pending_.end());
  }
  if (left.empty()) return;
  // The last chance: a whole-device synchronization, as the reservation's teardown makes.
  if (pool_.driver().synchronize().ok()) {
    for (const auto& [lane, pending] : left) release_lane(lane, pending).ignore();
    return;
  }
  for (const auto& [lane, pending] : left) {
    pool_.quarantine(pending.fresh, "a copy-on-write copy through scratch lane " +
                                        std::to_string(lane) + " was never confirmed complete");
  }
}

}  // namespace kvvm
