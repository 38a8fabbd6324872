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
  Result<HandleInfo> info = pool_.describe(block.handle);
  if (!info.ok()) return info.status();
  if (info->mappings <= 1 && info->holds == 0 && info->state == HandleState::kInUse) {
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
  if (status.ok()) {
    status = driver.copy(scratch_->base() + scratch, target.base() + offset, granule, stream);
  }
  if (status.ok()) {
    Result<Fence> fence = driver.record_fence(stream);
    status = fence.status();
    if (fence.ok()) {
      status = driver.wait_fence(*fence);
      driver.destroy_fence(*fence).ignore();
    }
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

}  // namespace kvvm
