#include <cuda_runtime.h>

#include <string>

#include "kernels/common.cuh"
#include "support/write_kernel.h"

namespace kvvm::testkit {
namespace {

__global__ void byte_writer(unsigned char* bytes, unsigned long long count, unsigned char value) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += gridDim.x * blockDim.x) {
    bytes[i] = value;
  }
}

__global__ void late_copier(uint4* destination, const uint4* source, unsigned long long vectors,
                            unsigned long long nanoseconds) {
  kernels::allow_next_kernel_to_start();
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
  for (unsigned long long i = threadIdx.x; i < vectors; i += blockDim.x) destination[i] = source[i];
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

Status copy_late_on_gpu(void* stream, void* destination, const void* source, std::uint64_t bytes,
                        unsigned microseconds) {
  late_copier<<<1, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<uint4*>(destination),
                                                                static_cast<const uint4*>(source),
                                                                bytes / 16, 1000ull * microseconds);
  return cuda_status("late_copier launch", cudaGetLastError());
}

}  // namespace kvvm::testkit
