// What the attention benchmarks (`kvvm bench decode`, `kvvm bench prefill`) share: random
// element data, device buffers freed with the benchmark, a timing loop between CUDA events, the
// device copy bandwidth as the memory ceiling, and a KV cache in an arena on the CUDA driver
// filled through append_kv_cuda.
//
// Why an arena rather than a cudaMalloc'd tensor: the figures are meant for the cache as kvvm
// holds it (slots in one reservation, windows mapped under them), read through the KvView's
// strides. Why random data: a kernel reading zeros runs on power-saving paths that real K/V
// never takes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvvm/base/dtype.h"
#include "kvvm/base/status.h"
#include "kvvm/kv/layout.h"

#if defined(KVVM_HAS_CUDA_KERNELS)
#include "kvvm/kv/arena.h"
#include "kvvm/kv/arena_stack.h"
#include "kvvm/vmm/driver.h"
#endif

namespace kvvm::cli {

// "fp16" or "bf16" (the element types of the CUDA kernels); InvalidArgument naming the text.
Result<DType> parse_bench_element(const std::string& text);

// One row of bench/sdpa_baseline.py's JSON: PyTorch's median milliseconds and the SDPA backend
// it ran on.
struct BaselineRow {
  double ms = 0;
  std::string backend;
};

// The rows of list `list` ("rows": decode, "prefill_rows": prefill) of the baseline at `path`,
// by their "key" (or "shape", the decode rows' key). Empty when `path` is empty; a file that
// cannot be read or parsed is reported on `err` (prefixed with `command`) and gives no rows, so
// the benchmark still runs without its ratio column.
std::map<std::string, BaselineRow> read_baseline(const std::string& path, const std::string& list,
                                                 const std::string& command, std::ostream& err);

// `count` values drawn uniformly from [-scale, scale] in `element` (fp16 or bf16), as raw bits.
std::vector<std::uint16_t> random_elements(DType element, std::size_t count,
                                           std::mt19937_64& random, float scale);

// Launches per timed sample and samples per figure.
struct TimingOptions {
  std::uint32_t iterations = 20;
  std::uint32_t samples = 15;
};

#if defined(KVVM_HAS_CUDA_KERNELS)

// Device buffers freed when the Device goes away.
class Device {
 public:
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device();
  Result<void*> alloc(std::size_t bytes);
  // Zeroed: a decode workspace's counters must start at zero (attention.h).
  Result<void*> alloc_zeroed(std::size_t bytes);
  Result<void*> upload(const void* host, std::size_t bytes);
  template <typename T>
  Result<void*> upload(const std::vector<T>& host) {
    return upload(host.data(), host.size() * sizeof(T));
  }

 private:
  std::vector<void*> owned_;
};

// Median milliseconds of one call of `launch`, timed as `iterations` back-to-back calls
// between two events, `samples` times, after a warm-up of three calls.
Result<double> time_ms(const std::function<Status()>& launch, const TimingOptions& timing);

// Device-to-device copy of 2 GiB in bytes per second, counting bytes read plus written
// (median of `samples` samples of 5 copies).
Result<double> copy_bandwidth(std::uint32_t samples);

struct BenchCache {
  std::unique_ptr<ArenaStack> stack;
  Arena* arena = nullptr;  // stack's
  std::vector<std::uint32_t> slots;
};

// What a benchmark's cache holds: `layers` layers (layer 1 % layers is written and read) of
// `kv_heads` x `head_dim` elements of `element` per token.
struct BenchCacheShape {
  std::uint32_t layers = 2;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;
  DType element = DType::kFp16;       // of the cache
  DType activations = DType::kUnset;  // of the K / V appended; kUnset: the cache's
  std::uint32_t layer() const { return 1 % layers; }
};

// An arena of `sequences` slots of `context` tokens in `layout`, every token of the read layer
// filled with random K/V through append_kv_cuda.
Result<BenchCache> make_cache(Driver& driver, const BenchCacheShape& shape, Layout layout,
                              std::uint32_t sequences, std::uint32_t context,
                              std::mt19937_64& random);

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace kvvm::cli
