#include "kvvm/driver.h"

namespace kvvm {

std::string_view to_string(Access access) {
  switch (access) {
    case Access::kNone:
      return "none";
    case Access::kReadOnly:
      return "read-only";
    case Access::kReadWrite:
      return "read-write";
  }
  return "unknown";
}

std::string_view to_string(DriverOp op) {
  switch (op) {
    case DriverOp::kReserve:
      return "reserve";
    case DriverOp::kFree:
      return "free";
    case DriverOp::kCreate:
      return "create";
    case DriverOp::kRelease:
      return "release";
    case DriverOp::kMap:
      return "map";
    case DriverOp::kSetAccess:
      return "set_access";
    case DriverOp::kUnmap:
      return "unmap";
    case DriverOp::kSynchronize:
      return "synchronize";
    case DriverOp::kCopy:
      return "copy";
    case DriverOp::kFence:
      return "fence";
  }
  return "unknown";
}

std::uint64_t DriverCallCounts::total() const {
  std::uint64_t sum = 0;
  for (std::uint64_t n : calls) sum += n;
  return sum;
}

Status Driver::count(DriverOp op, Status status) {
  const auto index = static_cast<std::size_t>(op);
  calls_[index].fetch_add(1, std::memory_order_relaxed);
  if (!status.ok()) failures_[index].fetch_add(1, std::memory_order_relaxed);
  return status;
}

Result<Address> Driver::reserve(std::size_t bytes, std::size_t alignment) {
  return count(DriverOp::kReserve, do_reserve(bytes, alignment == 0 ? granule() : alignment));
}

Status Driver::free(Address base, std::size_t bytes) {
  return count(DriverOp::kFree, do_free(base, bytes));
}

Result<Handle> Driver::create(std::size_t bytes) {
  return count(DriverOp::kCreate, do_create(bytes));
}

Status Driver::release(Handle handle) { return count(DriverOp::kRelease, do_release(handle)); }

Status Driver::map(Address address, std::size_t bytes, Handle handle, std::size_t handle_offset) {
  return count(DriverOp::kMap, do_map(address, bytes, handle, handle_offset));
}

Status Driver::set_access(Address address, std::size_t bytes, Access access) {
  return count(DriverOp::kSetAccess, do_set_access(address, bytes, access));
}

Status Driver::unmap(Address address, std::size_t bytes) {
  return count(DriverOp::kUnmap, do_unmap(address, bytes));
}

Status Driver::synchronize() { return count(DriverOp::kSynchronize, do_synchronize()); }

Status Driver::write(Address address, const void* source, std::size_t bytes) {
  return count(DriverOp::kCopy, do_write(address, source, bytes));
}

Status Driver::read(void* destination, Address address, std::size_t bytes) {
  return count(DriverOp::kCopy, do_read(destination, address, bytes));
}

Result<Fence> Driver::record_fence(Stream stream) {
  return count(DriverOp::kFence, do_record_fence(stream));
}

Result<bool> Driver::fence_done(Fence fence) {
  return count(DriverOp::kFence, do_fence_done(fence));
}

Status Driver::destroy_fence(Fence fence) {
  return count(DriverOp::kFence, do_destroy_fence(fence));
}

Status Driver::copy(Address destination, Address source, std::size_t bytes, Stream stream) {
  return count(DriverOp::kCopy, do_copy(destination, source, bytes, stream));
}

Status Driver::wait_fence(Fence fence) { return count(DriverOp::kFence, do_wait_fence(fence)); }

DriverCallCounts Driver::counts() const {
  DriverCallCounts counts;
  for (std::size_t i = 0; i < kDriverOpCount; ++i) {
    counts.calls[i] = calls_[i].load(std::memory_order_relaxed);
    counts.failures[i] = failures_[i].load(std::memory_order_relaxed);
  }
  return counts;
}

}  // namespace kvvm
