#include <cuda_runtime.h>

#include <string>

#include "kernels/spin_reader.h"

namespace kvvm::kernels {
namespace {

Status cuda_status(const char* call, cudaError_t error) {
  if (error == cudaSuccess) return Status::Ok();
  return Status::DriverError(std::string(call) + " failed: " + cudaGetErrorString(error),
                             DriverFailure{call, cudaGetErrorName(error), static_cast<int>(error)});
}

// Reads the range word by word (so the memory is really accessed while it runs) until the
// deadline; globaltimer ticks in nanoseconds.
__global__ void spin_reader(const unsigned long long* words, unsigned long long count,
                            unsigned long long deadline_ns, unsigned long long* sum_out) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  unsigned long long sum = 0;
  unsigned long long now = start;
  do {
    for (unsigned long long i = threadIdx.x; i < count; i += blockDim.x) sum += words[i];
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < deadline_ns);
  if (sum_out != nullptr) atomicAdd(sum_out, sum);
}

}  // namespace

Result<void*> create_stream() {
  cudaStream_t stream = nullptr;
  Status created = cuda_status("cudaStreamCreateWithFlags",
                               cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (!created.ok()) return created;
  return static_cast<void*>(stream);
}

void destroy_stream(void* stream) { (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream)); }

Status launch_spin_reader(void* stream, std::uint64_t address, std::uint64_t bytes,
                          std::uint32_t microseconds, std::uint64_t sum_out) {
  spin_reader<<<1, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const unsigned long long*>(address), bytes / 8,
      static_cast<unsigned long long>(microseconds) * 1000ull,
      reinterpret_cast<unsigned long long*>(sum_out));
  return cuda_status("spin_reader<<<>>>", cudaGetLastError());
}

Status synchronize_stream(void* stream) {
  return cuda_status("cudaStreamSynchronize",
                     cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

}  // namespace kvvm::kernels
