#include <cuda_runtime.h>

#include <string>

#include "support/write_kernel.h"

namespace kvvm::testkit {
namespace {

__global__ void byte_writer(unsigned char* bytes, unsigned long long count, unsigned char value) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += gridDim.x * blockDim.x) {
    bytes[i] = value;
  }
}

Status cuda_status(const char* call, cudaError_t error) {
  if (error == cudaSuccess) return Status::Ok();
  return Status::DriverError(std::string(call) + " failed: " + cudaGetErrorString(error),
                             DriverFailure{call, cudaGetErrorName(error), static_cast<int>(error)});
}

}  // namespace

Status write_bytes_on_gpu(void* stream, std::uint64_t address, std::uint64_t bytes,
                          std::uint8_t value) {
  auto* target = reinterpret_cast<unsigned char*>(address);
  byte_writer<<<64, 256, 0, static_cast<cudaStream_t>(stream)>>>(target, bytes, value);
  KVVM_RETURN_IF_ERROR(cuda_status("byte_writer launch", cudaGetLastError()));
  return cuda_status("cudaStreamSynchronize",
                     cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

}  // namespace kvvm::testkit
