#include "kvvm/vmm/driver.h"

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
    case DriverOp::kExport:
      return "export";
    case DriverOp::kImport:
      return "import";
  }
  return "unknown";
}

std::uint64_t DriverCallCounts::total() const {
  std::uint64_t sum = 0;
  for (std::uint64_t n : calls) sum += n;
  return sum;
}

Status Driver::count(DriverOp op, Clock::time_point start, Status status) {
  const auto index = static_cast<std::size_t>(op);
  const auto elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start);
  nanoseconds_[index].fetch_add(static_cast<std::uint64_t>(elapsed.count()),
                                std::memory_order_relaxed);
  calls_[index].fetch_add(1, std::memory_order_relaxed);
  if (!status.ok()) failures_[index].fetch_add(1, std::memory_order_relaxed);
  return status;
}

Result<Address> Driver::reserve(std::size_t bytes, std::size_t alignment) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kReserve, start,
               do_reserve(bytes, alignment == 0 ? granule() : alignment));
}

Status Driver::free(Address base, std::size_t bytes) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kFree, start, do_free(base, bytes));
}

Result<Handle> Driver::create(std::size_t bytes) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kCreate, start, do_create(bytes));
}

Status Driver::release(Handle handle) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kRelease, start, do_release(handle));
}

Status Driver::map(Address address, std::size_t bytes, Handle handle, std::size_t handle_offset) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kMap, start, do_map(address, bytes, handle, handle_offset));
}

Status Driver::set_access(Address address, std::size_t bytes, Access access) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kSetAccess, start, do_set_access(address, bytes, access));
}

Status Driver::unmap(Address address, std::size_t bytes) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kUnmap, start, do_unmap(address, bytes));
}

Status Driver::synchronize() {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kSynchronize, start, do_synchronize());
}

Status Driver::write(Address address, const void* source, std::size_t bytes) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kCopy, start, do_write(address, source, bytes));
}

Status Driver::read(void* destination, Address address, std::size_t bytes) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kCopy, start, do_read(destination, address, bytes));
}

Result<Fence> Driver::record_fence(Stream stream) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kFence, start, do_record_fence(stream));
}

Result<bool> Driver::fence_done(Fence fence) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kFence, start, do_fence_done(fence));
}

Status Driver::destroy_fence(Fence fence) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kFence, start, do_destroy_fence(fence));
}

Status Driver::copy(Address destination, Address source, std::size_t bytes, Stream stream) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kCopy, start, do_copy(destination, source, bytes, stream));
}

Status Driver::wait_fence(Fence fence) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kFence, start, do_wait_fence(fence));
}

Result<int> Driver::export_handle(Handle handle) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kExport, start, do_export_handle(handle));
}

Result<Handle> Driver::import_handle(int fd, std::size_t bytes) {
  const Clock::time_point start = Clock::now();
  return count(DriverOp::kImport, start, do_import_handle(fd, bytes));
}

Result<int> Driver::do_export_handle(Handle handle) {
  return Status::Unavailable("export of handle " + std::to_string(handle) + ": the " +
                             info().backend + " driver cannot share handles between processes");
}

Result<Handle> Driver::do_import_handle(int fd, std::size_t bytes) {
  return Status::Unavailable("import of " + std::to_string(bytes) + " bytes from descriptor " +
                             std::to_string(fd) + ": the " + info().backend +
                             " driver cannot share handles between processes");
}

bool context_lost(const Status& status) {
  const std::optional<DriverFailure>& failure = status.driver_failure();
  if (status.code() != StatusCode::kDriverError || !failure) return false;
  // The driver API's names and the runtime's for the same errors.
  static constexpr std::string_view kSticky[] = {
      "CUDA_ERROR_ILLEGAL_ADDRESS",
      "cudaErrorIllegalAddress",
      "CUDA_ERROR_LAUNCH_FAILED",
      "cudaErrorLaunchFailure",
      "CUDA_ERROR_ILLEGAL_INSTRUCTION",
      "cudaErrorIllegalInstruction",
      "CUDA_ERROR_MISALIGNED_ADDRESS",
      "cudaErrorMisalignedAddress",
      "CUDA_ERROR_INVALID_ADDRESS_SPACE",
      "cudaErrorInvalidAddressSpace",
      "CUDA_ERROR_INVALID_PC",
      "cudaErrorInvalidPc",
      "CUDA_ERROR_HARDWARE_STACK_ERROR",
      "cudaErrorHardwareStackError",
      "CUDA_ERROR_ASSERT",
      "cudaErrorAssert",
      "CUDA_ERROR_ECC_UNCORRECTABLE",
      "cudaErrorECCUncorrectable",
      "CUDA_ERROR_LAUNCH_TIMEOUT",
      "cudaErrorLaunchTimeout",
      "CUDA_ERROR_CONTEXT_IS_DESTROYED",
      "cudaErrorContextIsDestroyed",
      "CUDA_ERROR_DEVICE_UNAVAILABLE",
      "cudaErrorDevicesUnavailable",
      "CUDA_ERROR_EXTERNAL_DEVICE",
      "cudaErrorExternalDevice",
  };
  for (std::string_view name : kSticky) {
    if (failure->error_name == name) return true;
  }
  return false;
}

Status Driver::drain(Stream stream) {
  KVVM_ASSIGN_OR_RETURN(Fence fence, record_fence(stream));
  Status waited = wait_fence(fence);
  // A fence that cannot be destroyed leaks an event; the wait's answer stands either way.
  destroy_fence(fence).ignore();
  return waited;
}

DriverCallCounts Driver::counts() const {
  DriverCallCounts counts;
  for (std::size_t i = 0; i < kDriverOpCount; ++i) {
    counts.calls[i] = calls_[i].load(std::memory_order_relaxed);
    counts.failures[i] = failures_[i].load(std::memory_order_relaxed);
    counts.nanoseconds[i] = nanoseconds_[i].load(std::memory_order_relaxed);
  }
  return counts;
}

}  // namespace kvvm
