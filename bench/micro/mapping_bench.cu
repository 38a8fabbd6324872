// Whether the GPU work of a step costs more with more memory mapped: the calls an engine step
// makes (kernel launches, eager and from a graph; a stream synchronisation; a small
// host-to-device copy) and a kernel whose reads are spread over the mapped span (address
// translation), each timed with N granule-sized handles mapped, every one its own physical
// allocation as the arena's granules are, beside the same bytes in one handle. A preallocated
// engine of 16 sequences of 8,192 Llama-3-8B tokens maps 8,192 such handles; the arena maps the
// few hundred its live tokens need.
//
// Rows, in microseconds:
//   launch   an empty kernel launched 2,000 times back to back, host time to the end of the
//            last, per launch
//   graph    a graph of 100 empty kernels launched 20 times, per kernel
//   sync     one empty kernel then cudaStreamSynchronize, per round trip
//   copy     4 KiB of pinned host memory to the device then cudaStreamSynchronize
//   spread   a kernel reading 16 bytes from each of 4,096 granules spread evenly over the
//            mapped span (one read per granule when 4,096 or fewer are mapped), per kernel
// Usage: mapping_bench [most handles, default 16384]
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cuda_timing.h"
#include "kvvm/vmm/cuda_driver.h"
#include "kvvm/vmm/driver.h"

namespace {

using kvvm::bench::check;
using kvvm::bench::die;

__global__ void empty_kernel() {}

// Each thread reads 16 bytes at base + i * stride (i < count); the sum is written only when
// impossible, so the reads are not removed.
__global__ void spread_kernel(const unsigned char* base, std::uint64_t stride, unsigned count,
                              unsigned* sink) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const uint4 v = *reinterpret_cast<const uint4*>(base + i * stride);
  if ((v.x ^ v.y ^ v.z ^ v.w) == 0x9e3779b9u) *sink = i;
}

double host_us_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

struct Figures {
  double launch = 0, graph = 0, sync = 0, copy = 0, spread = 0;
};

Figures measure(cudaStream_t stream, kvvm::Address base, std::uint64_t bytes, std::uint64_t granule,
                unsigned* sink, void* pinned, void* landing) {
  Figures f;
  for (int i = 0; i < 100; ++i) empty_kernel<<<1, 32, 0, stream>>>();
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  constexpr int kLaunches = 2000;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kLaunches; ++i) empty_kernel<<<1, 32, 0, stream>>>();
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  f.launch = host_us_since(start) / kLaunches;

  constexpr int kNodes = 100, kGraphLaunches = 20;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  for (int i = 0; i < kNodes; ++i) empty_kernel<<<1, 32, 0, stream>>>();
  check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  start = std::chrono::steady_clock::now();
  for (int i = 0; i < kGraphLaunches; ++i) check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  f.graph = host_us_since(start) / (kNodes * kGraphLaunches);
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);

  constexpr int kRounds = 500;
  start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) {
    empty_kernel<<<1, 32, 0, stream>>>();
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  f.sync = host_us_since(start) / kRounds;

  start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) {
    check(cudaMemcpyAsync(landing, pinned, 4096, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  f.copy = host_us_since(start) / kRounds;

  if (bytes != 0) {
    const std::uint64_t granules = bytes / granule;
    const unsigned count = granules < 4096 ? static_cast<unsigned>(granules) : 4096u;
    const std::uint64_t stride = granules / count * granule;
    const auto* at = reinterpret_cast<const unsigned char*>(base);
    f.spread = kvvm::bench::time_us(
        [&] { spread_kernel<<<(count + 255) / 256, 256, 0, stream>>>(at, stride, count, sink); },
        stream, 20.0);
  }
  check(cudaGetLastError(), "kernel launch");
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const std::uint64_t most = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 16384;
  kvvm::Result<std::unique_ptr<kvvm::Driver>> made = kvvm::make_cuda_driver();
  if (!made.ok()) die("mapping_bench", made.status().to_string());
  kvvm::Driver& driver = **made;
  const std::uint64_t granule = driver.granule();
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  unsigned* sink = static_cast<unsigned*>(kvvm::bench::device(sizeof(unsigned)));
  void* landing = kvvm::bench::device(4096);
  void* pinned = nullptr;
  check(cudaMallocHost(&pinned, 4096), "cudaMallocHost");

  std::printf("granule %llu KiB; microseconds\n", static_cast<unsigned long long>(granule >> 10));
  std::printf("| mapped | handles | launch | graph (per kernel) | sync | copy 4 KiB | spread |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  const auto row = [&](std::uint64_t bytes, std::uint64_t handles, const Figures& f) {
    std::printf("| %.0f MiB | %llu | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
                static_cast<double>(bytes) / (1 << 20), static_cast<unsigned long long>(handles),
                f.launch, f.graph, f.sync, f.copy, f.spread);
    std::fflush(stdout);
  };
  row(0, 0, measure(stream, 0, 0, granule, sink, pinned, landing));
  for (std::uint64_t n : {512ull, 2048ull, 8192ull, 16384ull, 32768ull}) {
    if (n > most) break;
    const std::uint64_t bytes = n * granule;
    for (const bool one : {false, true}) {
      kvvm::Result<kvvm::Address> base = driver.reserve(bytes);
      check(base.status(), "reserve");
      std::vector<kvvm::Handle> handles;
      for (std::uint64_t i = 0; i < (one ? 1 : n); ++i) {
        const std::uint64_t size = one ? bytes : granule;
        kvvm::Result<kvvm::Handle> h = driver.create(size);
        check(h.status(), "create");
        handles.push_back(*h);
        check(driver.map(*base + i * size, size, *h, 0), "map");
      }
      check(driver.set_access(*base, bytes, kvvm::Access::kReadWrite), "set_access");
      check(cudaMemset(reinterpret_cast<void*>(*base), 1, bytes), "cudaMemset");
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      row(bytes, handles.size(), measure(stream, *base, bytes, granule, sink, pinned, landing));
      check(driver.synchronize(), "synchronize");
      check(driver.unmap(*base, bytes), "unmap");
      for (kvvm::Handle h : handles) check(driver.release(h), "release");
      check(driver.free(*base, bytes), "free");
    }
  }
  (void)cudaFreeHost(pinned);
  return 0;
}
