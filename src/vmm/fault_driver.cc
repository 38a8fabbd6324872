#include "kvvm/vmm/fault_driver.h"

#include <string>
#include <vector>

#include "base/format.h"

namespace kvvm {

void FaultDriver::fail_nth(DriverOp op, std::uint64_t k) {
  MutexLock lock(mutex_);
  plans_[static_cast<std::size_t>(op)].countdown = k;
}

void FaultDriver::fail_nth_call(std::uint64_t k) {
  MutexLock lock(mutex_);
  any_countdown_ = k;
}

void FaultDriver::fail_fraction(DriverOp op, double fraction, std::uint64_t seed) {
  MutexLock lock(mutex_);
  Plan& plan = plans_[static_cast<std::size_t>(op)];
  plan.fraction = fraction;
  plan.random.seed(seed);
}

void FaultDriver::hold_fences(bool on) {
  MutexLock lock(mutex_);
  holding_fences_ = on;
  if (!on) held_fences_.clear();
}

void FaultDriver::clear() {
  MutexLock lock(mutex_);
  for (Plan& plan : plans_) {
    plan.countdown = 0;
    plan.fraction = 0.0;
  }
  any_countdown_ = 0;
}

std::uint64_t FaultDriver::injected() const {
  MutexLock lock(mutex_);
  return injected_;
}

void FaultDriver::delay_copies(std::function<Status(Stream)> delay) {
  MutexLock lock(mutex_);
  delay_ = std::move(delay);
}

std::size_t FaultDriver::copies_in_flight() const {
  MutexLock lock(mutex_);
  return copies_.size();
}

std::vector<std::string> FaultDriver::in_flight_violations() const {
  MutexLock lock(mutex_);
  return violations_;
}

void FaultDriver::complete_before(Fence fence) {
  auto mark = marks_.find(fence);
  if (mark == marks_.end()) return;
  const FenceMark m = mark->second;
  std::erase_if(copies_, [&](const CopyInFlight& copy) {
    return copy.stream == m.stream && copy.number < m.copies_before;
  });
}

void FaultDriver::check_not_in_flight(std::string_view what, Address address, std::size_t bytes) {
  MutexLock lock(mutex_);
  const auto meets = [&](Address start, std::size_t len) {
    return start < address + bytes && address < start + len;
  };
  for (const CopyInFlight& copy : copies_) {
    const bool writes = meets(copy.destination, copy.bytes);
    const bool reads = meets(copy.source, copy.bytes);
    if (!writes && !reads) continue;
    violations_.push_back(std::string(what) + " [" + hex(address) + ", " + hex(address + bytes) +
                          ") while copy " + std::to_string(copy.number) + " (" +
                          std::to_string(copy.bytes) + " bytes, " + hex(copy.source) + " -> " +
                          hex(copy.destination) + ") still " + (writes ? "writes" : "reads") +
                          " it: no fence after it completed");
  }
}

Status FaultDriver::maybe_fail(DriverOp op) {
  MutexLock lock(mutex_);
  Plan& plan = plans_[static_cast<std::size_t>(op)];
  bool fail = false;
  // Every countdown advances on every call, so "the k-th call" means exactly that even when
  // several plans are armed at once.
  if (plan.countdown > 0 && --plan.countdown == 0) fail = true;
  if (any_countdown_ > 0 && --any_countdown_ == 0) fail = true;
  if (plan.fraction > 0.0) {
    std::uniform_real_distribution<double> draw(0.0, 1.0);
    if (draw(plan.random) < plan.fraction) fail = true;
  }
  if (!fail) return Status::Ok();
  ++injected_;
  const std::string name(to_string(op));
  return Status::DriverError("injected fault in " + name,
                             DriverFailure{name, "KVVM_INJECTED_FAULT", -1});
}

Result<Address> FaultDriver::do_reserve(std::size_t bytes, std::size_t alignment) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kReserve));
  return inner_.reserve(bytes, alignment);
}

Status FaultDriver::do_free(Address base, std::size_t bytes) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kFree));
  check_not_in_flight("free", base, bytes);
  return inner_.free(base, bytes);
}

Result<Handle> FaultDriver::do_create(std::size_t bytes) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kCreate));
  return inner_.create(bytes);
}

Status FaultDriver::do_release(Handle handle) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kRelease));
  return inner_.release(handle);
}

Status FaultDriver::do_map(Address address, std::size_t bytes, Handle handle,
                           std::size_t handle_offset) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kMap));
  return inner_.map(address, bytes, handle, handle_offset);
}

Status FaultDriver::do_set_access(Address address, std::size_t bytes, Access access) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kSetAccess));
  return inner_.set_access(address, bytes, access);
}

Status FaultDriver::do_unmap(Address address, std::size_t bytes) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kUnmap));
  check_not_in_flight("unmap", address, bytes);
  return inner_.unmap(address, bytes);
}

Status FaultDriver::do_synchronize() {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kSynchronize));
  Status synchronized = inner_.synchronize();
  MutexLock lock(mutex_);
  if (synchronized.ok()) copies_.clear();
  return synchronized;
}

Status FaultDriver::do_write(Address address, const void* source, std::size_t bytes) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kCopy));
  return inner_.write(address, source, bytes);
}

Status FaultDriver::do_read(void* destination, Address address, std::size_t bytes) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kCopy));
  return inner_.read(destination, address, bytes);
}

Result<Fence> FaultDriver::do_record_fence(Stream stream) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kFence));
  Result<Fence> fence = inner_.record_fence(stream);
  MutexLock lock(mutex_);
  if (fence.ok()) {
    if (holding_fences_) held_fences_.insert(*fence);
    marks_[*fence] = FenceMark{stream, copies_queued_};
  }
  return fence;
}

Result<bool> FaultDriver::do_fence_done(Fence fence) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kFence));
  Result<bool> done = inner_.fence_done(fence);
  MutexLock lock(mutex_);
  if (done.ok() && held_fences_.contains(fence)) return false;
  if (done.ok() && *done) complete_before(fence);
  return done;
}

Status FaultDriver::do_destroy_fence(Fence fence) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kFence));
  Status destroyed = inner_.destroy_fence(fence);
  MutexLock lock(mutex_);
  if (destroyed.ok()) {
    held_fences_.erase(fence);
    marks_.erase(fence);
  }
  return destroyed;
}

Status FaultDriver::do_copy(Address destination, Address source, std::size_t bytes, Stream stream) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kCopy));
  std::function<Status(Stream)> delay;
  {
    MutexLock lock(mutex_);
    delay = delay_;
  }
  if (delay) KVVM_RETURN_IF_ERROR(delay(stream));
  Status copied = inner_.copy(destination, source, bytes, stream);
  MutexLock lock(mutex_);
  if (copied.ok() && bytes > 0) {
    copies_.push_back({destination, source, bytes, stream, copies_queued_++});
  }
  return copied;
}

Status FaultDriver::do_wait_fence(Fence fence) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kFence));
  Status waited = inner_.wait_fence(fence);
  MutexLock lock(mutex_);
  if (waited.ok()) {
    held_fences_.erase(fence);
    complete_before(fence);
  }
  return waited;
}

Result<int> FaultDriver::do_export_handle(Handle handle) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kExport));
  return inner_.export_handle(handle);
}

Result<Handle> FaultDriver::do_import_handle(int fd, std::size_t bytes) {
  KVVM_RETURN_IF_ERROR(maybe_fail(DriverOp::kImport));
  return inner_.import_handle(fd, bytes);
}

}  // namespace kvvm
