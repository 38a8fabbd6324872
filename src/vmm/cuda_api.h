// The CUDA driver API as kvvm calls it: a table of function pointers filled once, at run
// time, from libcuda (dlopen + dlsym), and a few test-only probes.
//
// Why a table and not the functions cuda.h declares: kvvm never links libcuda (a binary
// built with CUDA must start on a machine without a driver), and cuda.h #defines many names
// to versioned symbols (cuMemGetInfo -> cuMemGetInfo_v2, ...). The table names the exact
// symbol it looks up next to each entry, so what is called is what is written here.
//
// Private to src/vmm and the tests. The table part needs <cuda.h> (types and constants only)
// and is visible only where that header is on the include path; the probes use plain types
// so that the test binary, which does not see the toolkit's headers, can call them.
#pragma once

#include <cstddef>
#include <string>

#include "kvvm/vmm/driver.h"

namespace kvvm::detail {

// What one raw CUDA call returned: the CUresult and its name ("CUDA_SUCCESS", ...).
struct CudaCallResult {
  int code = 0;
  std::string name;
  bool ok() const { return code == 0; }
};

// Test-only: what CUDA itself does with a copy the kvvm driver refuses. Copies `bytes` from
// host memory to `address` with cuMemcpyHtoD, bypassing CudaDriver's access check, in the
// primary context of device `ordinal`, then synchronizes the default stream (an asynchronous
// fault surfaces there) and the context. Meant to run in a child process: a fault may leave
// the context unusable for the rest of the process.
struct CudaRawCopyProbe {
  CudaCallResult copy;         // cuMemcpyHtoD
  CudaCallResult stream_sync;  // cuStreamSynchronize(default stream) after it
  CudaCallResult ctx_sync;     // cuCtxSynchronize after that
};
CudaRawCopyProbe cuda_raw_write_probe(int ordinal, Address address, const void* source,
                                      std::size_t bytes);

// Test-only: why libcuda cannot be used here ("" when it can).
std::string cuda_load_error();

}  // namespace kvvm::detail

#if defined(KVVM_HAS_CUDA) && __has_include(<cuda.h>)
#include <cuda.h>

namespace kvvm::detail {

// One entry per driver entry point kvvm uses. Own typedefs (not the PFN_ types of
// cudaTypedefs.h) keep the table independent of which versioned names a header maps to.
struct CudaApi {
  // Error reporting.
  using GetErrorName = CUresult (*)(CUresult, const char**);    // "cuGetErrorName"
  using GetErrorString = CUresult (*)(CUresult, const char**);  // "cuGetErrorString"
  // Initialization, devices, contexts.
  using Init = CUresult (*)(unsigned int);                   // "cuInit"
  using DriverGetVersion = CUresult (*)(int*);               // "cuDriverGetVersion"
  using DeviceGetCount = CUresult (*)(int*);                 // "cuDeviceGetCount"
  using DeviceGet = CUresult (*)(CUdevice*, int);            // "cuDeviceGet"
  using DeviceGetName = CUresult (*)(char*, int, CUdevice);  // "cuDeviceGetName"
  using DeviceGetAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  using DeviceTotalMem = CUresult (*)(std::size_t*, CUdevice);  // "cuDeviceTotalMem_v2"
  using PrimaryCtxRetain = CUresult (*)(CUcontext*, CUdevice);  // "cuDevicePrimaryCtxRetain"
  using PrimaryCtxRelease = CUresult (*)(CUdevice);             // "cuDevicePrimaryCtxRelease_v2"
  using CtxGetCurrent = CUresult (*)(CUcontext*);               // "cuCtxGetCurrent"
  using CtxSetCurrent = CUresult (*)(CUcontext);                // "cuCtxSetCurrent"
  using CtxSynchronize = CUresult (*)();                        // "cuCtxSynchronize"
  using StreamSynchronize = CUresult (*)(CUstream);  // "cuStreamSynchronize" (legacy stream)
  using MemGetInfo = CUresult (*)(std::size_t*, std::size_t*);  // "cuMemGetInfo_v2"
  // Virtual memory management.
  using MemGetAllocationGranularity = CUresult (*)(std::size_t*, const CUmemAllocationProp*,
                                                   CUmemAllocationGranularity_flags);
  using MemAddressReserve = CUresult (*)(CUdeviceptr*, std::size_t, std::size_t, CUdeviceptr,
                                         unsigned long long);
  using MemAddressFree = CUresult (*)(CUdeviceptr, std::size_t);
  using MemCreate = CUresult (*)(CUmemGenericAllocationHandle*, std::size_t,
                                 const CUmemAllocationProp*, unsigned long long);
  using MemRelease = CUresult (*)(CUmemGenericAllocationHandle);
  using MemMap = CUresult (*)(CUdeviceptr, std::size_t, std::size_t, CUmemGenericAllocationHandle,
                              unsigned long long);
  using MemUnmap = CUresult (*)(CUdeviceptr, std::size_t);
  using MemSetAccess = CUresult (*)(CUdeviceptr, std::size_t, const CUmemAccessDesc*, std::size_t);
  // Synchronous copies ("_v2": the legacy default stream, not per-thread).
  using MemcpyHtoD = CUresult (*)(CUdeviceptr, const void*, std::size_t);  // "cuMemcpyHtoD_v2"
  using MemcpyDtoH = CUresult (*)(void*, CUdeviceptr, std::size_t);        // "cuMemcpyDtoH_v2"

  GetErrorName get_error_name = nullptr;
  GetErrorString get_error_string = nullptr;
  Init init = nullptr;
  DriverGetVersion driver_get_version = nullptr;
  DeviceGetCount device_get_count = nullptr;
  DeviceGet device_get = nullptr;
  DeviceGetName device_get_name = nullptr;
  DeviceGetAttribute device_get_attribute = nullptr;
  DeviceTotalMem device_total_mem = nullptr;
  PrimaryCtxRetain primary_ctx_retain = nullptr;
  PrimaryCtxRelease primary_ctx_release = nullptr;
  CtxGetCurrent ctx_get_current = nullptr;
  CtxSetCurrent ctx_set_current = nullptr;
  CtxSynchronize ctx_synchronize = nullptr;
  StreamSynchronize stream_synchronize = nullptr;
  MemGetInfo mem_get_info = nullptr;
  MemGetAllocationGranularity mem_get_allocation_granularity = nullptr;
  MemAddressReserve mem_address_reserve = nullptr;
  MemAddressFree mem_address_free = nullptr;
  MemCreate mem_create = nullptr;
  MemRelease mem_release = nullptr;
  MemMap mem_map = nullptr;
  MemUnmap mem_unmap = nullptr;
  MemSetAccess mem_set_access = nullptr;
  MemcpyHtoD memcpy_htod = nullptr;
  MemcpyDtoH memcpy_dtoh = nullptr;
  using EventCreate = CUresult (*)(CUevent*, unsigned int);  // "cuEventCreate"
  using EventRecord = CUresult (*)(CUevent, CUstream);       // "cuEventRecord"
  using EventQuery = CUresult (*)(CUevent);                  // "cuEventQuery"
  using EventDestroy = CUresult (*)(CUevent);                // "cuEventDestroy_v2"
  EventCreate event_create = nullptr;
  EventRecord event_record = nullptr;
  EventQuery event_query = nullptr;
  EventDestroy event_destroy = nullptr;
  using EventSynchronize = CUresult (*)(CUevent);  // "cuEventSynchronize"
  using MemcpyDtoDAsync = CUresult (*)(CUdeviceptr, CUdeviceptr, std::size_t,
                                       CUstream);  // "cuMemcpyDtoDAsync_v2"
  EventSynchronize event_synchronize = nullptr;
  MemcpyDtoDAsync memcpy_dtod_async = nullptr;
  // Sharing a handle with another process through a POSIX file descriptor.
  using MemExportToShareableHandle = CUresult (*)(void*, CUmemGenericAllocationHandle,
                                                  CUmemAllocationHandleType, unsigned long long);
  using MemImportFromShareableHandle = CUresult (*)(CUmemGenericAllocationHandle*, void*,
                                                    CUmemAllocationHandleType);
  MemExportToShareableHandle mem_export_to_shareable_handle = nullptr;      // same name
  MemImportFromShareableHandle mem_import_from_shareable_handle = nullptr;  // same name
};

// libcuda, loaded and initialized once per process (thread-safe; the library stays open).
struct CudaLibrary {
  CudaApi api;
  std::string error;     // why CUDA cannot be used here; empty when it can
  int device_count = 0;  // valid when error is empty
  bool usable() const { return error.empty(); }
};
const CudaLibrary& cuda_library();

// "CUDA_ERROR_OUT_OF_MEMORY" for CUDA_ERROR_OUT_OF_MEMORY; "CUresult 123" when unnamed.
std::string cuda_error_name(const CudaApi& api, CUresult result);

}  // namespace kvvm::detail
#endif  // KVVM_HAS_CUDA && __has_include(<cuda.h>)
