// The CUDA driver: the driver seam over the CUDA driver API's virtual memory management.
//
// Why this shape (after PyTorch's ExpandableSegment in CUDACachingAllocator):
// - The driver API is looked up at run time through a table (cuda_api.h): libcuda is opened
//   with dlopen, never linked, so every kvvm binary starts, and the CPU suite runs, on a
//   machine with no GPU and no driver; make_cuda_driver then says why in an Unavailable.
// - Every call is one CUDA call with its arguments passed through: reserve is
//   cuMemAddressReserve, create is cuMemCreate (a handle may span several granules), map is
//   cuMemMap (a granule-aligned sub-range of a handle, at any offset), set_access is
//   cuMemSetAccess for this device, unmap is cuMemUnmap, release is cuMemRelease, free is
//   cuMemAddressFree. No tables of our own: the layers above keep the books, and CUDA's
//   own checks (no map over a mapping, no unmap of part of one) are the ones that count.
// - The device's primary context is retained for the driver's lifetime and made current at
//   the start of every call, because calls come from any thread (a scheduler, a background
//   commit worker) and a fresh thread has no current context.
// - Out of memory from cuMemCreate is ResourceExhausted with the numbers (requested, free,
//   total), not a DriverError, so callers can turn it into backpressure. Every other failure
//   is a DriverError naming the call, its arguments and CUDA's error name.
// - Copies are plain synchronous cuMemcpyHtoD / cuMemcpyDtoH. A copy into a read-only
//   mapping was measured on an H200 (driver 580, CUDA 13.0) to return
//   CUDA_ERROR_INVALID_VALUE with the bytes unchanged and the context still usable, so no
//   access check of our own is needed (and none is made: no hidden driver call).
// - map() takes whole handles only (maps_handle_subranges() is false): cuMemMap with a
//   non-zero offset answered CUDA_ERROR_NOT_SUPPORTED there.
// - Allocations are created with requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
//   where the device supports it: that is decided at creation, and a handle created without it
//   can never be exported (cuMemExportToShareableHandle) to another process.
//
// Thread-safety: everything here is immutable after construction; the CUDA driver API is
// thread-safe. No locks.
#include "kvvm/vmm/cuda_driver.h"

#include <memory>
#include <string>

#include "base/format.h"
#include "vmm/cuda_api.h"

#ifndef KVVM_HAS_CUDA

namespace kvvm {

Result<std::unique_ptr<Driver>> make_cuda_driver(CudaDriverOptions) {
  return Status::Unavailable("kvvm was built without CUDA (KVVM_ENABLE_CUDA=OFF or no toolkit)");
}

bool cuda_available() { return false; }

namespace detail {

CudaRawCopyProbe cuda_raw_write_probe(int, Address, const void*, std::size_t) {
  CudaCallResult none{-1, "kvvm was built without CUDA"};
  return {none, none, none};
}

std::string cuda_load_error() {
  return "kvvm was built without CUDA (KVVM_ENABLE_CUDA=OFF or no toolkit)";
}

}  // namespace detail
}  // namespace kvvm

#else  // KVVM_HAS_CUDA

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <utility>

namespace kvvm {
namespace detail {
namespace {

// Looks `name` up in `library` into `entry`; on failure leaves the reason in `error`.
template <typename Fn>
bool load_symbol(void* library, const char* name, Fn& entry, std::string& error) {
  void* symbol = ::dlsym(library, name);
  if (symbol == nullptr) {
    error = std::string("libcuda has no symbol ") + name + " (driver too old for kvvm?)";
    return false;
  }
  entry = reinterpret_cast<Fn>(symbol);
  return true;
}

bool load_table(void* library, CudaApi& api, std::string& error) {
  // The versioned names are what cuda.h's #defines resolve to; the table calls them directly.
  return load_symbol(library, "cuGetErrorName", api.get_error_name, error) &&
         load_symbol(library, "cuGetErrorString", api.get_error_string, error) &&
         load_symbol(library, "cuInit", api.init, error) &&
         load_symbol(library, "cuDriverGetVersion", api.driver_get_version, error) &&
         load_symbol(library, "cuDeviceGetCount", api.device_get_count, error) &&
         load_symbol(library, "cuDeviceGet", api.device_get, error) &&
         load_symbol(library, "cuDeviceGetName", api.device_get_name, error) &&
         load_symbol(library, "cuDeviceGetAttribute", api.device_get_attribute, error) &&
         load_symbol(library, "cuDeviceTotalMem_v2", api.device_total_mem, error) &&
         load_symbol(library, "cuDevicePrimaryCtxRetain", api.primary_ctx_retain, error) &&
         load_symbol(library, "cuDevicePrimaryCtxRelease_v2", api.primary_ctx_release, error) &&
         load_symbol(library, "cuCtxGetCurrent", api.ctx_get_current, error) &&
         load_symbol(library, "cuCtxSetCurrent", api.ctx_set_current, error) &&
         load_symbol(library, "cuCtxSynchronize", api.ctx_synchronize, error) &&
         load_symbol(library, "cuStreamSynchronize", api.stream_synchronize, error) &&
         load_symbol(library, "cuMemGetInfo_v2", api.mem_get_info, error) &&
         load_symbol(library, "cuMemGetAllocationGranularity", api.mem_get_allocation_granularity,
                     error) &&
         load_symbol(library, "cuMemAddressReserve", api.mem_address_reserve, error) &&
         load_symbol(library, "cuMemAddressFree", api.mem_address_free, error) &&
         load_symbol(library, "cuMemCreate", api.mem_create, error) &&
         load_symbol(library, "cuMemRelease", api.mem_release, error) &&
         load_symbol(library, "cuMemMap", api.mem_map, error) &&
         load_symbol(library, "cuMemUnmap", api.mem_unmap, error) &&
         load_symbol(library, "cuMemSetAccess", api.mem_set_access, error) &&
         load_symbol(library, "cuMemcpyHtoD_v2", api.memcpy_htod, error) &&
         load_symbol(library, "cuMemcpyDtoH_v2", api.memcpy_dtoh, error) &&
         load_symbol(library, "cuEventCreate", api.event_create, error) &&
         load_symbol(library, "cuEventRecord", api.event_record, error) &&
         load_symbol(library, "cuEventQuery", api.event_query, error) &&
         load_symbol(library, "cuEventDestroy_v2", api.event_destroy, error) &&
         load_symbol(library, "cuEventSynchronize", api.event_synchronize, error) &&
         load_symbol(library, "cuMemcpyDtoDAsync_v2", api.memcpy_dtod_async, error) &&
         load_symbol(library, "cuMemExportToShareableHandle", api.mem_export_to_shareable_handle,
                     error) &&
         load_symbol(library, "cuMemImportFromShareableHandle",
                     api.mem_import_from_shareable_handle, error);
}

CudaLibrary load_library() {
  CudaLibrary library;
  void* handle = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::string first = ::dlerror();
    handle = ::dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      library.error =
          "cannot load the CUDA driver library: " + first + " (is an NVIDIA driver installed?)";
      return library;
    }
  }
  // Kept open for the life of the process: contexts and mappings outlive any one driver.
  if (!load_table(handle, library.api, library.error)) return library;
  const CudaApi& api = library.api;
  if (CUresult r = api.init(0); r != CUDA_SUCCESS) {
    library.error = "cuInit failed: " + cuda_error_name(api, r);
    return library;
  }
  if (CUresult r = api.device_get_count(&library.device_count); r != CUDA_SUCCESS) {
    library.error = "cuDeviceGetCount failed: " + cuda_error_name(api, r);
    return library;
  }
  if (library.device_count <= 0) library.error = "no CUDA device (cuDeviceGetCount = 0)";
  return library;
}

}  // namespace

const CudaLibrary& cuda_library() {
  static std::once_flag once;
  static CudaLibrary* library = nullptr;  // never destroyed: the library stays loaded
  std::call_once(once, [] { library = new CudaLibrary(load_library()); });
  return *library;
}

std::string cuda_error_name(const CudaApi& api, CUresult result) {
  const char* name = nullptr;
  if (api.get_error_name != nullptr && api.get_error_name(result, &name) == CUDA_SUCCESS &&
      name != nullptr) {
    return name;
  }
  return "CUresult " + std::to_string(static_cast<int>(result));
}

std::string cuda_load_error() { return cuda_library().error; }

namespace {

CudaCallResult call_result(const CudaApi& api, CUresult r) {
  return {static_cast<int>(r), cuda_error_name(api, r)};
}

}  // namespace

CudaRawCopyProbe cuda_raw_write_probe(int ordinal, Address address, const void* source,
                                      std::size_t bytes) {
  CudaRawCopyProbe probe;
  const CudaLibrary& library = cuda_library();
  if (!library.usable()) {
    probe.copy = {-1, library.error};
    return probe;
  }
  const CudaApi& api = library.api;
  CUdevice device = 0;
  CUcontext context = nullptr;
  if (CUresult r = api.device_get(&device, ordinal); r != CUDA_SUCCESS) {
    probe.copy = call_result(api, r);
    return probe;
  }
  if (CUresult r = api.primary_ctx_retain(&context, device); r != CUDA_SUCCESS) {
    probe.copy = call_result(api, r);
    return probe;
  }
  if (CUresult r = api.ctx_set_current(context); r != CUDA_SUCCESS) {
    probe.copy = call_result(api, r);
  } else {
    probe.copy = call_result(api, api.memcpy_htod(address, source, bytes));
    probe.stream_sync = call_result(api, api.stream_synchronize(nullptr));
    probe.ctx_sync = call_result(api, api.ctx_synchronize());
  }
  (void)api.primary_ctx_release(device);
  return probe;
}

}  // namespace detail

namespace {

using detail::cuda_error_name;
using detail::CudaApi;

std::string describe(const CudaApi& api, CUresult result) {
  std::string text = cuda_error_name(api, result);
  const char* description = nullptr;
  if (api.get_error_string(result, &description) == CUDA_SUCCESS && description != nullptr) {
    text += std::string(" (") + description + ")";
  }
  return text;
}

// "<what> failed: CUDA_ERROR_... (description)", with the call and CUDA's error attached.
Status cuda_error(const CudaApi& api, const char* call, CUresult result, const std::string& what) {
  return Status::DriverError(
      what + " failed: " + describe(api, result),
      DriverFailure{call, cuda_error_name(api, result), static_cast<int>(result)});
}

const char* access_flag_name(CUmemAccess_flags flags) {
  switch (flags) {
    case CU_MEM_ACCESS_FLAGS_PROT_NONE:
      return "CU_MEM_ACCESS_FLAGS_PROT_NONE";
    case CU_MEM_ACCESS_FLAGS_PROT_READ:
      return "CU_MEM_ACCESS_FLAGS_PROT_READ";
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
      return "CU_MEM_ACCESS_FLAGS_PROT_READWRITE";
    default:
      return "CU_MEM_ACCESS_FLAGS_?";
  }
}

CUmemAccess_flags access_flags(Access access) {
  switch (access) {
    case Access::kReadWrite:
      return CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    case Access::kReadOnly:
      return CU_MEM_ACCESS_FLAGS_PROT_READ;
    case Access::kNone:
      break;
  }
  return CU_MEM_ACCESS_FLAGS_PROT_NONE;
}

std::string bytes_text(std::size_t bytes) { return std::to_string(bytes) + " bytes"; }

// What make_cuda_driver learns about the device once; free/total are asked on every info().
struct DeviceFacts {
  int ordinal = 0;
  CUdevice device = 0;
  std::string name;
  std::string driver_version;
  Granularity granularity;
  // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: allocations are created
  // exportable as file descriptors (the only way one can be exported later).
  bool posix_fd_handles = false;
};

class CudaDriver final : public Driver {
 public:
  CudaDriver(const CudaApi& api, DeviceFacts facts, CUcontext context)
      : api_(api), facts_(std::move(facts)), context_(context) {
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = facts_.ordinal;
    if (facts_.posix_fd_handles)
      prop_.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    location_.type = CU_MEM_LOCATION_TYPE_DEVICE;
    location_.id = facts_.ordinal;
  }

  // Releases the primary context reference taken by make_cuda_driver. Whatever the layers
  // above leaked stays as it is until the last reference goes (CUDA then resets the context).
  ~CudaDriver() override { (void)api_.primary_ctx_release(facts_.device); }

  DriverInfo info() const override {
    DriverInfo info;
    info.backend = "cuda";
    info.device_name = facts_.name;
    info.device_ordinal = facts_.ordinal;
    info.driver_version = facts_.driver_version;
    info.vmm_supported = true;  // make_cuda_driver refuses a device without it
    std::size_t free = 0;
    std::size_t total = 0;
    if (make_current("cuMemGetInfo").ok() && api_.mem_get_info(&free, &total) == CUDA_SUCCESS) {
      info.free_bytes = free;
      info.total_bytes = total;
    } else if (api_.device_total_mem(&total, facts_.device) == CUDA_SUCCESS) {
      info.total_bytes = total;
    }
    return info;
  }

  Granularity granularity() const override { return facts_.granularity; }
  bool maps_handle_subranges() const override { return false; }  // see the top of the file

 protected:
  Result<Address> do_reserve(std::size_t bytes, std::size_t alignment) override {
    if (alignment == 0) alignment = facts_.granularity.minimum;
    KVVM_RETURN_IF_ERROR(make_current("cuMemAddressReserve"));
    CUdeviceptr address = 0;
    if (CUresult r = api_.mem_address_reserve(&address, bytes, alignment, 0, 0);
        r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuMemAddressReserve", r,
                        "cuMemAddressReserve(" + bytes_text(bytes) + ", alignment " +
                            std::to_string(alignment) + ")");
    }
    return static_cast<Address>(address);
  }

  Status do_free(Address base, std::size_t bytes) override {
    KVVM_RETURN_IF_ERROR(make_current("cuMemAddressFree"));
    if (CUresult r = api_.mem_address_free(base, bytes); r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuMemAddressFree", r,
                        "cuMemAddressFree(" + hex(base) + ", " + bytes_text(bytes) + ")");
    }
    return Status::Ok();
  }

  Result<Handle> do_create(std::size_t bytes) override {
    KVVM_RETURN_IF_ERROR(make_current("cuMemCreate"));
    CUmemGenericAllocationHandle handle = 0;
    const std::string what =
        "cuMemCreate(" + bytes_text(bytes) + ", device " + std::to_string(facts_.ordinal) + ")";
    if (CUresult r = api_.mem_create(&handle, bytes, &prop_, 0); r != CUDA_SUCCESS) {
      if (r == CUDA_ERROR_OUT_OF_MEMORY) return out_of_memory(what, bytes);
      return cuda_error(api_, "cuMemCreate", r, what);
    }
    if (handle == kNoHandle) {  // never seen; kvvm reserves 0 for "no handle"
      (void)api_.mem_release(handle);
      return Status::Internal(what + " returned handle 0, which kvvm reserves for no handle");
    }
    return static_cast<Handle>(handle);
  }

  Status do_release(Handle handle) override {
    KVVM_RETURN_IF_ERROR(make_current("cuMemRelease"));
    if (CUresult r = api_.mem_release(handle); r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuMemRelease", r, "cuMemRelease(handle " + hex(handle) + ")");
    }
    return Status::Ok();
  }

  Status do_map(Address address, std::size_t bytes, Handle handle,
                std::size_t handle_offset) override {
    KVVM_RETURN_IF_ERROR(make_current("cuMemMap"));
    if (CUresult r = api_.mem_map(address, bytes, handle_offset, handle, 0); r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuMemMap", r,
                        "cuMemMap(" + hex(address) + ", " + bytes_text(bytes) + ", handle " +
                            hex(handle) + ", handle offset " + std::to_string(handle_offset) + ")");
    }
    return Status::Ok();
  }

  Status do_set_access(Address address, std::size_t bytes, Access access) override {
    KVVM_RETURN_IF_ERROR(make_current("cuMemSetAccess"));
    CUmemAccessDesc desc{};
    desc.location = location_;
    desc.flags = access_flags(access);
    if (CUresult r = api_.mem_set_access(address, bytes, &desc, 1); r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuMemSetAccess", r,
                        "cuMemSetAccess(" + hex(address) + ", " + bytes_text(bytes) + ", " +
                            access_flag_name(desc.flags) + ")");
    }
    return Status::Ok();
  }

  Status do_unmap(Address address, std::size_t bytes) override {
    KVVM_RETURN_IF_ERROR(make_current("cuMemUnmap"));
    if (CUresult r = api_.mem_unmap(address, bytes); r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuMemUnmap", r,
                        "cuMemUnmap(" + hex(address) + ", " + bytes_text(bytes) + ")");
    }
    return Status::Ok();
  }

  Status do_synchronize() override {
    KVVM_RETURN_IF_ERROR(make_current("cuCtxSynchronize"));
    if (CUresult r = api_.ctx_synchronize(); r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuCtxSynchronize", r,
                        "cuCtxSynchronize(device " + std::to_string(facts_.ordinal) + ")");
    }
    return Status::Ok();
  }

  Status do_write(Address address, const void* source, std::size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    KVVM_RETURN_IF_ERROR(make_current("cuMemcpyHtoD"));
    const std::string what = "cuMemcpyHtoD(" + hex(address) + ", " + bytes_text(bytes) + ")";
    if (CUresult r = api_.memcpy_htod(address, source, bytes); r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuMemcpyHtoD", r, what);
    }
    // From pageable memory the copy may return once the bytes are staged; wait for the DMA
    // so "synchronous" means the bytes are in device memory (and a late fault lands here).
    if (CUresult r = api_.stream_synchronize(nullptr); r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuStreamSynchronize", r,
                        "cuStreamSynchronize(default stream) after " + what);
    }
    return Status::Ok();
  }

  // A fence is a CUDA event without timing, recorded on the caller's stream.
  Result<Fence> do_record_fence(Stream stream) override {
    KVVM_RETURN_IF_ERROR(make_current("cuEventRecord"));
    CUevent event = nullptr;
    if (CUresult r = api_.event_create(&event, CU_EVENT_DISABLE_TIMING); r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuEventCreate", r, "cuEventCreate(CU_EVENT_DISABLE_TIMING)");
    }
    if (CUresult r = api_.event_record(event, static_cast<CUstream>(stream)); r != CUDA_SUCCESS) {
      (void)api_.event_destroy(event);
      return cuda_error(api_, "cuEventRecord", r,
                        "cuEventRecord(stream " + hex(reinterpret_cast<Address>(stream)) + ")");
    }
    return static_cast<Fence>(reinterpret_cast<std::uintptr_t>(event));
  }

  Result<bool> do_fence_done(Fence fence) override {
    KVVM_RETURN_IF_ERROR(make_current("cuEventQuery"));
    const CUresult r = api_.event_query(reinterpret_cast<CUevent>(fence));
    if (r == CUDA_SUCCESS) return true;
    if (r == CUDA_ERROR_NOT_READY) return false;
    return cuda_error(api_, "cuEventQuery", r, "cuEventQuery(fence " + std::to_string(fence) + ")");
  }

  Status do_destroy_fence(Fence fence) override {
    KVVM_RETURN_IF_ERROR(make_current("cuEventDestroy"));
    if (CUresult r = api_.event_destroy(reinterpret_cast<CUevent>(fence)); r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuEventDestroy", r,
                        "cuEventDestroy(fence " + std::to_string(fence) + ")");
    }
    return Status::Ok();
  }

  Status do_wait_fence(Fence fence) override {
    KVVM_RETURN_IF_ERROR(make_current("cuEventSynchronize"));
    if (CUresult r = api_.event_synchronize(reinterpret_cast<CUevent>(fence)); r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuEventSynchronize", r,
                        "cuEventSynchronize(fence " + std::to_string(fence) + ")");
    }
    return Status::Ok();
  }

  // Device to device, queued on the caller's stream (ordered after the kernels that wrote the
  // source there and before whatever the caller queues next).
  Status do_copy(Address destination, Address source, std::size_t bytes, Stream stream) override {
    if (bytes == 0) return Status::Ok();
    KVVM_RETURN_IF_ERROR(make_current("cuMemcpyDtoDAsync"));
    if (CUresult r =
            api_.memcpy_dtod_async(destination, source, bytes, static_cast<CUstream>(stream));
        r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuMemcpyDtoDAsync", r,
                        "cuMemcpyDtoDAsync(" + hex(destination) + " <- " + hex(source) + ", " +
                            bytes_text(bytes) + ")");
    }
    return Status::Ok();
  }

  Result<int> do_export_handle(Handle handle) override {
    const std::string what = "cuMemExportToShareableHandle(handle " + hex(handle) + ", POSIX fd)";
    if (!facts_.posix_fd_handles) {
      return Status::FailedPrecondition(
          what + ": device " + std::to_string(facts_.ordinal) +
          " does not support POSIX file descriptor handles, so its allocations are not exportable");
    }
    KVVM_RETURN_IF_ERROR(make_current("cuMemExportToShareableHandle"));
    int fd = -1;
    if (CUresult r = api_.mem_export_to_shareable_handle(
            &fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuMemExportToShareableHandle", r, what);
    }
    return fd;
  }

  Result<Handle> do_import_handle(int fd, std::size_t bytes) override {
    const std::string what = "cuMemImportFromShareableHandle(descriptor " + std::to_string(fd) +
                             ", " + bytes_text(bytes) + ")";
    KVVM_RETURN_IF_ERROR(make_current("cuMemImportFromShareableHandle"));
    CUmemGenericAllocationHandle handle = 0;
    // The descriptor travels in the pointer argument; CUDA does not take it over.
    void* os_handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd));
    if (CUresult r = api_.mem_import_from_shareable_handle(
            &handle, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuMemImportFromShareableHandle", r, what);
    }
    if (handle == kNoHandle) {
      (void)api_.mem_release(handle);
      return Status::Internal(what + " returned handle 0, which kvvm reserves for no handle");
    }
    return static_cast<Handle>(handle);
  }

  Status do_read(void* destination, Address address, std::size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    KVVM_RETURN_IF_ERROR(make_current("cuMemcpyDtoH"));
    const std::string what = "cuMemcpyDtoH(" + hex(address) + ", " + bytes_text(bytes) + ")";
    if (CUresult r = api_.memcpy_dtoh(destination, address, bytes); r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuMemcpyDtoH", r, what);
    }
    return Status::Ok();
  }

 private:
  // Makes the primary context current on the calling thread (calls come from any thread).
  Status make_current(const char* for_call) const {
    CUcontext current = nullptr;
    if (api_.ctx_get_current(&current) == CUDA_SUCCESS && current == context_) {
      return Status::Ok();
    }
    if (CUresult r = api_.ctx_set_current(context_); r != CUDA_SUCCESS) {
      return cuda_error(api_, "cuCtxSetCurrent", r,
                        std::string("cuCtxSetCurrent(primary context of device ") +
                            std::to_string(facts_.ordinal) + ") before " + for_call);
    }
    return Status::Ok();
  }

  Status out_of_memory(const std::string& what, std::size_t bytes) const {
    std::size_t free = 0;
    std::size_t total = 0;
    if (api_.mem_get_info(&free, &total) != CUDA_SUCCESS) {
      (void)api_.device_total_mem(&total, facts_.device);
    }
    return Status::ResourceExhausted(what + " failed: " + describe(api_, CUDA_ERROR_OUT_OF_MEMORY) +
                                         ": requested " + std::to_string(bytes) + " bytes, " +
                                         std::to_string(free) + " free of " + std::to_string(total),
                                     Exhaustion{bytes, free, total});
  }

  const CudaApi& api_;
  const DeviceFacts facts_;
  const CUcontext context_;
  CUmemAllocationProp prop_{};
  CUmemLocation location_{};
};

Result<Granularity> query_granularity(const CudaApi& api, int ordinal) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  Granularity granularity;
  const std::pair<CUmemAllocationGranularity_flags, std::size_t*> queries[] = {
      {CU_MEM_ALLOC_GRANULARITY_MINIMUM, &granularity.minimum},
      {CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, &granularity.recommended}};
  for (const auto& [option, out] : queries) {
    if (CUresult r = api.mem_get_allocation_granularity(out, &prop, option); r != CUDA_SUCCESS) {
      return cuda_error(
          api, "cuMemGetAllocationGranularity", r,
          "cuMemGetAllocationGranularity(device " + std::to_string(ordinal) + ", " +
              (option == CU_MEM_ALLOC_GRANULARITY_MINIMUM ? "MINIMUM" : "RECOMMENDED") + ")");
    }
  }
  if (granularity.minimum == 0) {
    return Status::Internal("cuMemGetAllocationGranularity(device " + std::to_string(ordinal) +
                            ", MINIMUM) returned 0");
  }
  if (granularity.recommended == 0) granularity.recommended = granularity.minimum;
  return granularity;
}

}  // namespace

Result<std::unique_ptr<Driver>> make_cuda_driver(CudaDriverOptions options) {
  const detail::CudaLibrary& library = detail::cuda_library();
  if (!library.usable()) return Status::Unavailable(library.error);
  const CudaApi& api = library.api;
  const int ordinal = options.device;
  if (ordinal < 0 || ordinal >= library.device_count) {
    return Status::Unavailable("device " + std::to_string(ordinal) + " of " +
                               std::to_string(library.device_count) + " does not exist");
  }

  DeviceFacts facts;
  facts.ordinal = ordinal;
  if (CUresult r = api.device_get(&facts.device, ordinal); r != CUDA_SUCCESS) {
    return cuda_error(api, "cuDeviceGet", r, "cuDeviceGet(" + std::to_string(ordinal) + ")");
  }
  int vmm = 0;
  if (CUresult r = api.device_get_attribute(
          &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, facts.device);
      r != CUDA_SUCCESS) {
    return cuda_error(api, "cuDeviceGetAttribute", r,
                      "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device " +
                          std::to_string(ordinal) + ")");
  }
  if (vmm == 0) {
    return Status::Unavailable("device " + std::to_string(ordinal) +
                               " does not support virtual memory management "
                               "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 0)");
  }
  char name[256] = {};
  if (api.device_get_name(name, static_cast<int>(sizeof(name)) - 1, facts.device) == CUDA_SUCCESS) {
    facts.name = name;
  }
  int version = 0;
  if (api.driver_get_version(&version) == CUDA_SUCCESS) {
    facts.driver_version =
        std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
  }
  int posix_fd = 0;
  facts.posix_fd_handles =
      api.device_get_attribute(&posix_fd,
                               CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                               facts.device) == CUDA_SUCCESS &&
      posix_fd != 0;
  KVVM_ASSIGN_OR_RETURN(Granularity granularity, query_granularity(api, ordinal));
  facts.granularity = granularity;

  CUcontext context = nullptr;
  if (CUresult r = api.primary_ctx_retain(&context, facts.device); r != CUDA_SUCCESS) {
    return cuda_error(api, "cuDevicePrimaryCtxRetain", r,
                      "cuDevicePrimaryCtxRetain(device " + std::to_string(ordinal) + ")");
  }
  return std::unique_ptr<Driver>(std::make_unique<CudaDriver>(api, std::move(facts), context));
}

bool cuda_available() { return detail::cuda_library().usable(); }

}  // namespace kvvm

#endif  // KVVM_HAS_CUDA
