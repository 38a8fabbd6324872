// A CUDA runtime call's error as a Status, for the CUDA model's host code (g++, not nvcc).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "kvvm/base/status.h"

namespace kvvm::model::detail {

inline Status cuda_call(const char* call, cudaError_t error) {
  if (error == cudaSuccess) return Status::Ok();
  return Status::DriverError(std::string(call) + " failed: " + cudaGetErrorString(error),
                             DriverFailure{call, cudaGetErrorName(error), static_cast<int>(error)});
}

}  // namespace kvvm::model::detail
