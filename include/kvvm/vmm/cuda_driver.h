// The CUDA driver: the driver seam over the CUDA driver API's virtual memory calls
// (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease,
// cuMemAddressFree).
//
// libcuda is opened at run time (dlopen), never linked, so every kvvm binary starts and the
// whole CPU suite runs on a machine with no GPU and no driver; make_cuda_driver then returns
// Unavailable with the reason.
#pragma once

#include <memory>

#include "kvvm/vmm/driver.h"

namespace kvvm {

struct CudaDriverOptions {
  int device = 0;  // device ordinal
};

// Unavailable when libcuda cannot be loaded, there is no such device, or the device has no
// virtual memory management support; DriverError when a CUDA call fails.
Result<std::unique_ptr<Driver>> make_cuda_driver(CudaDriverOptions options = {});

// True when make_cuda_driver would find a device (libcuda loads, cuInit succeeds, at least
// one device). Cheap after the first call.
bool cuda_available();

}  // namespace kvvm
