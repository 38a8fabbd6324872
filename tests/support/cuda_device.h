// Whether a CUDA device is usable here: the CUDA tests skip without one (CI has no GPU).
#pragma once

#include <cuda_runtime_api.h>

namespace kvvm::testing {

inline bool have_cuda_device() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();  // clear the error the probe left
    return false;
  }
  return true;
}

}  // namespace kvvm::testing
