// The host driver: the driver seam over Linux memory files and mmap (see host_driver.h).
//
// Why it keeps tables: Linux would happily mmap over a live mapping or "unmap" a range that
// holds nothing; the CUDA driver refuses both. Refusing them here too means a bookkeeping bug
// in the layers above fails the host tests instead of surviving until it meets a GPU.
#include "kvvm/vmm/host_driver.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/format.h"
#include "kvvm/base/mutex.h"
#include "vmm/host_chunks.h"

namespace kvvm {
namespace {

Status errno_status(std::string_view call, std::string message, int error) {
  return Status::DriverError(message + ": " + std::strerror(error),
                             DriverFailure{std::string(call), errno_name(error), error});
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  }
  return "host CPU";
}

std::uint64_t meminfo_bytes(std::string_view key) {
  std::ifstream meminfo("/proc/meminfo");
  std::string name;
  std::uint64_t kib = 0;
  std::string unit;
  while (meminfo >> name >> kib >> unit) {
    if (name.size() == key.size() + 1 && name.compare(0, key.size(), key) == 0) return kib << 10;
  }
  return 0;
}

class HostDriver final : public Driver {
 public:
  HostDriver(std::size_t granule, std::size_t chunk_bytes, bool populate, bool exportable)
      : granule_(granule), populate_(populate), exportable_(exportable), chunks_(chunk_bytes) {}

  // Whatever the layers above leaked deliberately stays mapped (it may still be read): the
  // chunks and the handles' own files only close their descriptors, which keeps live mappings
  // intact.
  ~HostDriver() override {
    MutexLock lock(mutex_);
    for (const auto& [id, handle] : handles_) {
      if (handle.range.chunk == kOwnFile) ::close(handle.range.fd);
    }
  }

  DriverInfo info() const override {
    DriverInfo info;
    info.backend = "host";
    info.device_name = cpu_model();
    utsname names{};
    if (uname(&names) == 0) info.driver_version = std::string("Linux ") + names.release;
    info.vmm_supported = true;
    info.free_bytes = meminfo_bytes("MemAvailable");
    info.total_bytes = meminfo_bytes("MemTotal");
    return info;
  }

  Granularity granularity() const override { return {granule_, granule_}; }
  bool maps_handle_subranges() const override { return true; }  // mmap takes any page offset

  HostDriverTables tables() const {
    MutexLock lock(mutex_);
    HostDriverTables tables{reservations_.size(), 0, mappings_.size(), 0};
    for (const auto& [id, handle] : handles_) {
      if (handle.released) continue;  // gone for the caller; its bytes wait for an unmap
      ++tables.handles;
      tables.handle_bytes += handle.range.bytes;
      if (handle.range.chunk == kOwnFile) ++tables.handle_files;
    }
    tables.files = chunks_.files();
    tables.resident_bytes = chunks_.resident_bytes();
    return tables;
  }

 private:
  struct HostHandle {
    ChunkRange range;
    std::size_t mappings = 0;  // entries of mappings_ that map it
    // release() was called while it was mapped: like cuMemRelease, the bytes stay until the
    // last mapping goes, but the handle is unknown to every call from now on.
    bool released = false;
  };
  struct Mapping {
    std::size_t bytes = 0;
    Handle handle = kNoHandle;
    std::size_t handle_offset = 0;
    Access access = Access::kNone;
  };

  // The chunk id of a handle that is a memory file of its own (exportable or imported); the
  // chunks number theirs from 1.
  static constexpr std::uint64_t kOwnFile = 0;

  bool aligned(std::size_t value) const { return value % granule_ == 0; }

  Status invalid(std::string_view call, std::string message) const {
    return Status::DriverError(std::move(message),
                               DriverFailure{std::string(call), "EINVAL", EINVAL});
  }

  // The reservation holding [address, address + bytes), or end().
  std::map<Address, std::size_t>::const_iterator find_reservation(Address address,
                                                                  std::size_t bytes) const
      KVVM_REQUIRES(mutex_) {
    auto it = reservations_.upper_bound(address);
    if (it == reservations_.begin()) return reservations_.end();
    --it;
    if (address + bytes > it->first + it->second) return reservations_.end();
    return it;
  }

  // True when [address, address + bytes) is exactly a run of whole adjacent mappings.
  bool covered_by_whole_mappings(Address address, std::size_t bytes) const KVVM_REQUIRES(mutex_) {
    Address cursor = address;
    auto it = mappings_.find(address);
    while (cursor < address + bytes) {
      if (it == mappings_.end() || it->first != cursor) return false;
      cursor += it->second.bytes;
      ++it;
    }
    return cursor == address + bytes;
  }

  Result<Address> do_reserve(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0 || !aligned(bytes) || alignment == 0 || !aligned(alignment) ||
        (alignment & (alignment - 1)) != 0) {
      return invalid("mmap", "reserve(" + std::to_string(bytes) + " bytes, alignment " +
                                 std::to_string(alignment) + "): size and alignment must be " +
                                 "positive multiples of the granule " + std::to_string(granule_) +
                                 " and the alignment a power of two");
    }
    const std::size_t span = bytes + alignment;
    void* raw =
        ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
      return errno_status("mmap", "reserve(" + std::to_string(bytes) + " bytes)", errno);
    }
    const auto start = reinterpret_cast<Address>(raw);
    const Address base = (start + alignment - 1) & ~(alignment - 1);
    if (base > start) ::munmap(raw, base - start);
    const Address end = start + span;
    if (end > base + bytes) ::munmap(reinterpret_cast<void*>(base + bytes), end - base - bytes);
    MutexLock lock(mutex_);
    reservations_.emplace(base, bytes);
    return base;
  }

  Status do_free(Address base, std::size_t bytes) override {
    {
      MutexLock lock(mutex_);
      auto it = reservations_.find(base);
      if (it == reservations_.end() || it->second != bytes) {
        return invalid("munmap", "free(" + hex(base) + ", " + std::to_string(bytes) +
                                     " bytes): not a reservation of that size");
      }
      auto mapped = mappings_.lower_bound(base);
      if (mapped != mappings_.end() && mapped->first < base + bytes) {
        return invalid("munmap", "free(" + hex(base) + "): mapping still at " + hex(mapped->first));
      }
      reservations_.erase(it);
    }
    if (::munmap(reinterpret_cast<void*>(base), bytes) != 0) {
      return errno_status("munmap", "free(" + hex(base) + ")", errno);
    }
    return Status::Ok();
  }

  Result<Handle> do_create(std::size_t bytes) override {
    if (bytes == 0 || !aligned(bytes)) {
      return invalid("memfd_create", "create(" + std::to_string(bytes) +
                                         " bytes): not a positive multiple of the granule " +
                                         std::to_string(granule_));
    }
    Result<ChunkRange> range = [&]() -> Result<ChunkRange> {
      if (exportable_) return own_file(bytes);
      MutexLock lock(mutex_);
      return chunks_.take(bytes);
    }();
    if (!range.ok())
      return range.status().with_context("create(" + std::to_string(bytes) + " bytes)");
    // Allocate the pages now: a commit that succeeded must have its bytes, not a SIGBUS later.
    // Unpopulated (simulations that never touch the bytes): pages on first touch.
    const int error = !populate_ || ::fallocate(range->fd, 0, static_cast<off_t>(range->offset),
                                                static_cast<off_t>(bytes)) == 0
                          ? 0
                          : errno;
    if (error != 0) {
      (void)retire(*range);  // what fallocate got before it failed goes back too
      if (error == ENOSPC || error == ENOMEM) {
        return Status::ResourceExhausted(
            "create(" + std::to_string(bytes) + " bytes): fallocate: " + std::strerror(error),
            Exhaustion{bytes, meminfo_bytes("MemAvailable"), meminfo_bytes("MemTotal")});
      }
      return errno_status("fallocate", "create(" + std::to_string(bytes) + " bytes)", error);
    }
    MutexLock lock(mutex_);
    const Handle id = next_handle_++;
    handles_.emplace(id, HostHandle{*range});
    return id;
  }

  Status do_release(Handle handle) override {
    ChunkRange range;
    {
      MutexLock lock(mutex_);
      auto it = handles_.find(handle);
      if (it == handles_.end() || it->second.released) {
        return invalid("fallocate",
                       "release(handle " + std::to_string(handle) + "): unknown handle");
      }
      // Like cuMemRelease: live mappings keep the memory until they are unmapped.
      if (it->second.mappings > 0) {
        it->second.released = true;
        return Status::Ok();
      }
      range = it->second.range;
      handles_.erase(it);
    }
    return retire(range).with_context("release(handle " + std::to_string(handle) + ")");
  }

  // A memory file of exactly `bytes` for one handle (sized, not yet populated).
  Result<ChunkRange> own_file(std::size_t bytes) {
    const int fd = ::memfd_create("kvvm-handle", MFD_CLOEXEC);
    if (fd < 0) return errno_status("memfd_create", "a memory file for one handle", errno);
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int error = errno;
      ::close(fd);
      return errno_status("ftruncate", "sizing a memory file to " + std::to_string(bytes), error);
    }
    return ChunkRange{kOwnFile, fd, 0, bytes};
  }

  // Gives a range's memory back to the system (punching its pages out of the file) and the
  // range back to the chunks, which close the file once nothing lives in it. Called without
  // mutex_: punching a large range takes time, and nobody else holds this range.
  // A handle's own file is only closed, never punched: another process may map it (exported
  // or imported), and the kernel frees it once the last descriptor and mapping go.
  Status retire(const ChunkRange& range) {
    if (range.chunk == kOwnFile) {
      ::close(range.fd);
      return Status::Ok();
    }
    if (::fallocate(range.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    static_cast<off_t>(range.offset), static_cast<off_t>(range.bytes)) != 0) {
      // Keep the range taken: its stale bytes must never reach the next handle.
      return errno_status("fallocate",
                          "punching " + std::to_string(range.bytes) + " bytes out of a memory file",
                          errno);
    }
    MutexLock lock(mutex_);
    chunks_.give_back(range);
    return Status::Ok();
  }

  Status do_map(Address address, std::size_t bytes, Handle handle,
                std::size_t handle_offset) override {
    MutexLock lock(mutex_);
    const std::string what = "map(" + hex(address) + ", " + std::to_string(bytes) +
                             " bytes, handle " + std::to_string(handle) + " offset " +
                             std::to_string(handle_offset) + ")";
    if (bytes == 0 || !aligned(address) || !aligned(bytes) || !aligned(handle_offset)) {
      return invalid("mmap",
                     what + ": not granule-aligned (granule " + std::to_string(granule_) + ")");
    }
    auto h = handles_.find(handle);
    if (h == handles_.end() || h->second.released) {
      return invalid("mmap", what + ": unknown handle");
    }
    const ChunkRange& range = h->second.range;
    if (handle_offset + bytes > range.bytes) {
      return invalid("mmap",
                     what + ": beyond the handle's " + std::to_string(range.bytes) + " bytes");
    }
    if (find_reservation(address, bytes) == reservations_.end()) {
      return invalid("mmap", what + ": not inside one reservation");
    }
    auto next = mappings_.lower_bound(address);
    if (next != mappings_.end() && next->first < address + bytes) {
      return invalid("mmap", what + ": overlaps the mapping at " + hex(next->first));
    }
    if (next != mappings_.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second.bytes > address) {
        return invalid("mmap", what + ": overlaps the mapping at " + hex(previous->first));
      }
    }
    void* placed =
        ::mmap(reinterpret_cast<void*>(address), bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, range.fd,
               static_cast<off_t>(range.offset + handle_offset));
    if (placed == MAP_FAILED) return errno_status("mmap", what, errno);
    mappings_.emplace(address, Mapping{bytes, handle, handle_offset, Access::kNone});
    ++h->second.mappings;
    return Status::Ok();
  }

  Status do_set_access(Address address, std::size_t bytes, Access access) override {
    MutexLock lock(mutex_);
    const std::string what = "set_access(" + hex(address) + ", " + std::to_string(bytes) +
                             " bytes, " + std::string(to_string(access)) + ")";
    if (!covered_by_whole_mappings(address, bytes)) {
      return invalid("mprotect", what + ": not a run of whole mappings");
    }
    const int protection = access == Access::kReadWrite  ? PROT_READ | PROT_WRITE
                           : access == Access::kReadOnly ? PROT_READ
                                                         : PROT_NONE;
    if (::mprotect(reinterpret_cast<void*>(address), bytes, protection) != 0) {
      return errno_status("mprotect", what, errno);
    }
    for (auto it = mappings_.find(address); it != mappings_.end() && it->first < address + bytes;
         ++it) {
      it->second.access = access;
    }
    return Status::Ok();
  }

  Status do_unmap(Address address, std::size_t bytes) override {
    const std::string what = "unmap(" + hex(address) + ", " + std::to_string(bytes) + " bytes)";
    std::vector<ChunkRange> orphans;  // released handles whose last mapping this was
    {
      MutexLock lock(mutex_);
      if (!covered_by_whole_mappings(address, bytes)) {
        return invalid("mmap", what + ": not a run of whole mappings");
      }
      // Put the PROT_NONE placeholder back: the addresses stay reserved.
      void* placed = ::mmap(reinterpret_cast<void*>(address), bytes, PROT_NONE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
      if (placed == MAP_FAILED) return errno_status("mmap", what, errno);
      const auto first = mappings_.find(address);
      const auto last = mappings_.lower_bound(address + bytes);
      for (auto it = first; it != last; ++it) {
        auto h = handles_.find(it->second.handle);
        if (--h->second.mappings == 0 && h->second.released) {
          orphans.push_back(h->second.range);
          handles_.erase(h);
        }
      }
      mappings_.erase(first, last);
    }
    Status status = Status::Ok();
    for (const ChunkRange& range : orphans) {
      Status retired = retire(range);
      if (status.ok() && !retired.ok()) status = retired.with_context(what);
    }
    return status;
  }

  Result<int> do_export_handle(Handle handle) override {
    const std::string what = "export of handle " + std::to_string(handle);
    MutexLock lock(mutex_);
    auto it = handles_.find(handle);
    if (it == handles_.end() || it->second.released) {
      return invalid("fcntl", what + ": unknown handle");
    }
    if (it->second.range.chunk != kOwnFile) {
      return Status::FailedPrecondition(
          what +
          ": it lives in a memory file shared with other handles (make the host driver "
          "with exportable_handles to give each handle a file of its own)");
    }
    const int fd = ::fcntl(it->second.range.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return errno_status("fcntl", what + ": F_DUPFD_CLOEXEC", errno);
    return fd;
  }

  Result<Handle> do_import_handle(int fd, std::size_t bytes) override {
    const std::string what =
        "import of " + std::to_string(bytes) + " bytes from descriptor " + std::to_string(fd);
    if (bytes == 0 || !aligned(bytes)) {
      return invalid("fcntl",
                     what + ": not a positive multiple of the granule " + std::to_string(granule_));
    }
    // Only memory files carry seals: anything else (a socket, a disk file) is refused.
    if (::fcntl(fd, F_GET_SEALS) < 0) {
      return errno_status("fcntl", what + ": F_GET_SEALS: not a memory file", errno);
    }
    struct stat file {};
    if (::fstat(fd, &file) != 0) return errno_status("fstat", what, errno);
    if (static_cast<std::uint64_t>(file.st_size) < bytes) {
      return invalid("fstat",
                     what + ": the file holds only " + std::to_string(file.st_size) + " bytes");
    }
    // A descriptor of our own: the caller closes theirs, and the handle maps at any time.
    const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) return errno_status("fcntl", what + ": F_DUPFD_CLOEXEC", errno);
    MutexLock lock(mutex_);
    const Handle id = next_handle_++;
    handles_.emplace(id, HostHandle{ChunkRange{kOwnFile, own, 0, bytes}});
    return id;
  }

  Status do_synchronize() override { return Status::Ok(); }  // host work is synchronous

  // Host work is synchronous, so a fence is complete when it is recorded; the ids are still
  // tracked so a fence used after it was destroyed is refused, as CUDA would.
  Result<Fence> do_record_fence(Stream) override {
    MutexLock lock(mutex_);
    const Fence fence = next_fence_++;
    fences_.insert(fence);
    return fence;
  }
  Result<bool> do_fence_done(Fence fence) override {
    MutexLock lock(mutex_);
    if (!fences_.contains(fence)) {
      return invalid("fence", "fence_done(" + std::to_string(fence) + "): unknown fence");
    }
    return true;
  }
  Status do_wait_fence(Fence fence) override {
    MutexLock lock(mutex_);
    if (!fences_.contains(fence)) {
      return invalid("fence", "wait_fence(" + std::to_string(fence) + "): unknown fence");
    }
    return Status::Ok();
  }
  Status do_destroy_fence(Fence fence) override {
    MutexLock lock(mutex_);
    if (fences_.erase(fence) == 0) {
      return invalid("fence", "destroy_fence(" + std::to_string(fence) + "): unknown fence");
    }
    return Status::Ok();
  }

  bool mapped(Address address, std::size_t bytes) const KVVM_REQUIRES(mutex_) {
    auto it = mappings_.upper_bound(address);
    if (it == mappings_.begin()) return false;
    --it;
    Address cursor = address;
    while (it != mappings_.end() && it->first <= cursor && cursor < address + bytes) {
      cursor = it->first + it->second.bytes;
      ++it;
    }
    return cursor >= address + bytes;
  }

  Status do_write(Address address, const void* source, std::size_t bytes) override {
    {
      MutexLock lock(mutex_);
      if (!mapped(address, bytes)) {
        return invalid("memcpy", "write(" + hex(address) + ", " + std::to_string(bytes) +
                                     " bytes): not mapped");
      }
    }
    // A read-only mapping faults here, as a GPU kernel's write would.
    std::memcpy(reinterpret_cast<void*>(address), source, bytes);
    return Status::Ok();
  }

  Status do_copy(Address destination, Address source, std::size_t bytes, Stream) override {
    {
      MutexLock lock(mutex_);
      if (!mapped(destination, bytes) || !mapped(source, bytes)) {
        return invalid("memcpy", "copy(" + hex(destination) + " <- " + hex(source) + ", " +
                                     std::to_string(bytes) + " bytes): not mapped");
      }
    }
    // memmove: the two ranges may be one handle mapped twice.
    std::memmove(reinterpret_cast<void*>(destination), reinterpret_cast<const void*>(source),
                 bytes);
    return Status::Ok();
  }

  Status do_read(void* destination, Address address, std::size_t bytes) override {
    {
      MutexLock lock(mutex_);
      if (!mapped(address, bytes)) {
        return invalid("memcpy", "read(" + hex(address) + ", " + std::to_string(bytes) +
                                     " bytes): not mapped");
      }
    }
    std::memcpy(destination, reinterpret_cast<const void*>(address), bytes);
    return Status::Ok();
  }

  const std::size_t granule_;
  const bool populate_;
  const bool exportable_;
  mutable Mutex mutex_;                        // a leaf lock
  HostChunks chunks_ KVVM_GUARDED_BY(mutex_);  // where the handles' bytes live
  std::map<Address, std::size_t> reservations_ KVVM_GUARDED_BY(mutex_);
  std::map<Handle, HostHandle> handles_ KVVM_GUARDED_BY(mutex_);
  std::map<Address, Mapping> mappings_ KVVM_GUARDED_BY(mutex_);
  Handle next_handle_ KVVM_GUARDED_BY(mutex_) = 1;
  std::set<Fence> fences_ KVVM_GUARDED_BY(mutex_);
  Fence next_fence_ KVVM_GUARDED_BY(mutex_) = 1;
};

}  // namespace

Result<std::unique_ptr<Driver>> make_host_driver(HostDriverOptions options) {
  const long page = ::sysconf(_SC_PAGESIZE);
  const std::size_t page_size = page > 0 ? static_cast<std::size_t>(page) : 4096;
  const std::size_t granule = options.granule == 0 ? page_size : options.granule;
  if (granule % page_size != 0) {
    return Status::InvalidArgument("host granule " + std::to_string(granule) +
                                   " bytes is not a positive multiple of the page size " +
                                   std::to_string(page_size));
  }
  std::size_t chunk_bytes = options.chunk_bytes;
  if (chunk_bytes == 0) {
    chunk_bytes = (kDefaultHostChunkBytes + granule - 1) / granule * granule;
  } else if (chunk_bytes % granule != 0) {
    return Status::InvalidArgument("host chunk of " + std::to_string(chunk_bytes) +
                                   " bytes is not a positive multiple of the granule " +
                                   std::to_string(granule));
  }
  return std::unique_ptr<Driver>(
      new HostDriver(granule, chunk_bytes, options.populate, options.exportable_handles));
}

HostDriverTables host_driver_tables(const Driver& driver) {
  const auto* host = dynamic_cast<const HostDriver*>(&driver);
  return host == nullptr ? HostDriverTables{} : host->tables();
}

std::uint64_t host_available_bytes() { return meminfo_bytes("MemAvailable"); }

}  // namespace kvvm
