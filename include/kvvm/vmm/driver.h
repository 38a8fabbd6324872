// The driver seam: the only place in kvvm that talks to a memory driver.
//
// Why one small interface: the CUDA driver's virtual memory API and Linux memory files with
// mmap offer the same operations (reserve addresses, create physical memory, map it, set
// access, unmap, release, free the addresses), so everything above this seam runs unchanged
// on a GPU and on the host, and a fault-injecting driver can sit in between to force every
// rollback path in tests.
//
// RMM-style: the public entry points are non-virtual and count every call by kind, with the
// time it took (so no driver call, and none of its cost, is hidden from the bookkeeping);
// implementations override the protected do_*.
//
// Thread-safety: implementations are safe to call from several threads at once; the call
// counters are atomic.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvvm/base/status.h"

namespace kvvm {

// A physical allocation, opaque to everything above the driver. Never 0 when valid.
using Handle = std::uint64_t;
inline constexpr Handle kNoHandle = 0;

// A virtual address (CUdeviceptr on CUDA, a host pointer on the host).
using Address = std::uintptr_t;

// The stream whose work reads the KV cache (a CUstream on CUDA, ignored on the host);
// nullptr is the default stream.
using Stream = void*;
// A point in a stream's work (a CUDA event); completes when all work before it has.
using Fence = std::uint64_t;

// Access of a mapping. kNone: mapped but not accessible (what a fresh map gives).
enum class Access { kNone, kReadOnly, kReadWrite };
std::string_view to_string(Access access);

// The mapping unit, queried from the driver; never hard-coded above the seam.
struct Granularity {
  std::size_t minimum = 0;      // every map, size and offset is a multiple of this
  std::size_t recommended = 0;  // what the driver suggests for performance
};

// What a driver can say about itself, for `kvvm info` and logs.
struct DriverInfo {
  std::string backend;      // "cuda" or "host"
  std::string device_name;  // GPU name or CPU model
  int device_ordinal = 0;
  std::string driver_version;
  bool vmm_supported = false;
  std::uint64_t free_bytes = 0;
  std::uint64_t total_bytes = 0;
};

// Whether a failed call's error is one a CUDA context does not survive (a sticky error: an
// illegal address, a kernel that faulted or trapped, an uncorrectable ECC error, a device that
// fell off the bus or a destroyed context), named by the driver API or the runtime. Every later
// call on the context fails the same way: whatever ran on it is gone, and only a new process
// (or a device reset) serves again.
bool context_lost(const Status& status);

// Every kind of driver call, for counters and fault injection.
enum class DriverOp {
  kReserve,
  kFree,
  kCreate,
  kRelease,
  kMap,
  kSetAccess,
  kUnmap,
  kSynchronize,
  kCopy,    // test and data-path copies between host memory and mapped addresses
  kFence,   // record, poll or destroy a fence
  kExport,  // a handle exported as a file descriptor another process can import
  kImport,  // a handle imported from such a descriptor
};
inline constexpr std::size_t kDriverOpCount = 12;
std::string_view to_string(DriverOp op);

// Calls made so far, by kind, how many of them failed, and the wall time they took (summed
// over every calling thread: the cost of mapping on a GPU is the driver's, tens of
// microseconds a granule, and where it is paid is what an engine's step time hides).
struct DriverCallCounts {
  std::array<std::uint64_t, kDriverOpCount> calls{};
  std::array<std::uint64_t, kDriverOpCount> failures{};
  std::array<std::uint64_t, kDriverOpCount> nanoseconds{};
  std::uint64_t of(DriverOp op) const { return calls[static_cast<std::size_t>(op)]; }
  std::uint64_t failed(DriverOp op) const { return failures[static_cast<std::size_t>(op)]; }
  double seconds(DriverOp op) const {
    return static_cast<double>(nanoseconds[static_cast<std::size_t>(op)]) * 1e-9;
  }
  std::uint64_t total() const;
};

class Driver {
 public:
  Driver() = default;
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;
  virtual ~Driver() = default;

  virtual DriverInfo info() const = 0;
  virtual Granularity granularity() const = 0;
  // Whether map() accepts a part of a handle (a non-zero handle offset, or fewer bytes than
  // the handle has). The host driver does; the CUDA driver does not (cuMemMap answers
  // CUDA_ERROR_NOT_SUPPORTED for a non-zero offset on driver 580 / CUDA 13.0, and its header
  // says the offset "currently must be zero"), so handles that will be shared in parts must
  // be created one granule each there.
  virtual bool maps_handle_subranges() const = 0;
  // The granule every kvvm size is rounded to: granularity().minimum.
  std::size_t granule() const { return granularity().minimum; }

  // Reserves `bytes` of addresses aligned to `alignment` (0: the granule). No memory.
  Result<Address> reserve(std::size_t bytes, std::size_t alignment = 0);
  // Gives a reservation back. REQUIRES: nothing mapped in it.
  Status free(Address base, std::size_t bytes);
  // Creates a physical allocation of `bytes` (a multiple of the granule); the bytes exist
  // once this returns (no lazy commit that could fail later).
  Result<Handle> create(std::size_t bytes);
  Status release(Handle handle);
  // Maps `bytes` of `handle` starting at `handle_offset` at `address`. The new mapping has
  // Access::kNone until set_access.
  Status map(Address address, std::size_t bytes, Handle handle, std::size_t handle_offset);
  Status set_access(Address address, std::size_t bytes, Access access);
  Status unmap(Address address, std::size_t bytes);
  // Waits until all work that may read mapped memory has completed.
  Status synchronize();
  // Synchronous copies between host memory and mapped addresses (a write into a read-only
  // mapping fails on CUDA and faults on the host, exactly as a kernel's would).
  Status write(Address address, const void* source, std::size_t bytes);
  Status read(void* destination, Address address, std::size_t bytes);
  // Copies `bytes` between two mapped ranges (device to device on CUDA), ordered on `stream`
  // after the work queued there; returns once queued (use a fence to wait). The copies of
  // copy-on-write and of shared-prefix boundaries.
  Status copy(Address destination, Address source, std::size_t bytes, Stream stream);
  // Records a fence after the work queued so far on `stream` (stream-ordered release: memory
  // is unmapped only once a fence recorded after its last reader completes).
  Result<Fence> record_fence(Stream stream);
  // Whether the fence completed; polls, never blocks.
  Result<bool> fence_done(Fence fence);
  Status destroy_fence(Fence fence);
  // Blocks until the fence completed.
  Status wait_fence(Fence fence);
  // Records a fence after the work queued so far on `stream`, waits for it and destroys it.
  // OK: every earlier piece of work on the stream completed. An error: their completion is
  // unknown, so whatever they read or write must stay mapped (invariant 6).
  Status drain(Stream stream);

  // Exports `handle` as a POSIX file descriptor (close-on-exec) that another process passes to
  // import_handle (over a unix socket, SCM_RIGHTS); the caller owns it and closes it. The memory
  // then lives while any process maps it or holds a handle or descriptor of it: releasing the
  // handle here never frees what an importer still maps. FailedPrecondition when the handle was
  // not created exportable (host: handles in a shared memory file; CUDA: an allocation made
  // without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR); Unavailable from a driver that cannot.
  Result<int> export_handle(Handle handle);
  // A handle of this driver for the `bytes` (a positive multiple of the granule) that `fd`, a
  // descriptor from export_handle, names. The descriptor is not taken: the caller closes it.
  // The handle maps, unmaps and releases like any other; its release drops this process's
  // reference only.
  Result<Handle> import_handle(int fd, std::size_t bytes);

  DriverCallCounts counts() const;

 protected:
  virtual Result<Address> do_reserve(std::size_t bytes, std::size_t alignment) = 0;
  virtual Status do_free(Address base, std::size_t bytes) = 0;
  virtual Result<Handle> do_create(std::size_t bytes) = 0;
  virtual Status do_release(Handle handle) = 0;
  virtual Status do_map(Address address, std::size_t bytes, Handle handle,
                        std::size_t handle_offset) = 0;
  virtual Status do_set_access(Address address, std::size_t bytes, Access access) = 0;
  virtual Status do_unmap(Address address, std::size_t bytes) = 0;
  virtual Status do_synchronize() = 0;
  virtual Status do_write(Address address, const void* source, std::size_t bytes) = 0;
  virtual Status do_read(void* destination, Address address, std::size_t bytes) = 0;
  virtual Result<Fence> do_record_fence(Stream stream) = 0;
  virtual Result<bool> do_fence_done(Fence fence) = 0;
  virtual Status do_destroy_fence(Fence fence) = 0;
  virtual Status do_copy(Address destination, Address source, std::size_t bytes, Stream stream) = 0;
  virtual Status do_wait_fence(Fence fence) = 0;
  // Defaults for drivers that cannot share handles between processes: Unavailable.
  virtual Result<int> do_export_handle(Handle handle);
  virtual Result<Handle> do_import_handle(int fd, std::size_t bytes);

 private:
  using Clock = std::chrono::steady_clock;
  // Counts a call that started at `start` (taken before the call: the arguments of one
  // expression are evaluated in no set order).
  Status count(DriverOp op, Clock::time_point start, Status status);
  template <typename T>
  Result<T> count(DriverOp op, Clock::time_point start, Result<T> result) {
    count(op, start, result.ok() ? Status::Ok() : result.status()).ignore();
    return result;
  }

  std::array<std::atomic<std::uint64_t>, kDriverOpCount> calls_{};
  std::array<std::atomic<std::uint64_t>, kDriverOpCount> failures_{};
  std::array<std::atomic<std::uint64_t>, kDriverOpCount> nanoseconds_{};
};

}  // namespace kvvm
