// What the plain-main CUDA benches (fp8_gemm_bench, gemv_bench) share: failing loudly, device
// buffers, weight matrices in enough copies that no figure is the L2's, and event timing.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kvvm/base/status.h"

namespace kvvm::bench {

[[noreturn]] inline void die(const char* tool, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", tool, what.c_str());
  std::exit(1);
}
inline void check(cudaError_t error, const char* call) {
  if (error != cudaSuccess) die("bench", std::string(call) + ": " + cudaGetErrorString(error));
}
inline void check(const Status& status, const char* call) {
  if (!status.ok()) die("bench", std::string(call) + ": " + status.to_string());
}

inline void* device(std::uint64_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}

// `copies` copies of one matrix, together at least 2x the L2 (at least two): each call takes
// the next, so a timed loop reads from memory, not from the cache.
struct Copies {
  std::vector<void*> at;
  std::uint64_t bytes = 0;
  std::size_t next = 0;
  Copies(const std::vector<std::uint8_t>& host, std::uint64_t l2) : bytes(host.size()) {
    std::uint64_t count = (2 * l2 + bytes - 1) / bytes;
    if (count < 2) count = 2;
    for (std::uint64_t i = 0; i < count; ++i) {
      at.push_back(device(bytes));
      check(cudaMemcpy(at.back(), host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
  }
  Copies(const Copies&) = delete;
  Copies& operator=(const Copies&) = delete;
  ~Copies() {
    for (void* p : at) (void)cudaFree(p);
  }
  void* take() {
    void* p = at[next];
    next = (next + 1) % at.size();
    return p;
  }
};

// Microseconds per call of `run` on `stream`: three warm-up calls, then as many as fit about
// `budget_ms` (5 to 2,000) between two events.
inline double time_us(const std::function<void()>& run, cudaStream_t stream, double budget_ms) {
  for (int i = 0; i < 3; ++i) run();
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  run();
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float one = 0;
  check(cudaEventElapsedTime(&one, start, stop), "cudaEventElapsedTime");
  const int iterations = std::max(5, std::min(2000, static_cast<int>(budget_ms / (one + 1e-3))));
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int i = 0; i < iterations; ++i) run();
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float total = 0;
  check(cudaEventElapsedTime(&total, start, stop), "cudaEventElapsedTime");
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  return 1000.0 * total / iterations;
}

}  // namespace kvvm::bench
