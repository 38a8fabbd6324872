// See bench/drivers/attention/cuda_support.h.
#include "bench/drivers/attention/cuda_support.h"

#include <algorithm>
#include <exception>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "base/json_reader.h"
#include "kvvm/kernels/attention.h"

#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>
#endif

namespace kvvm::cli {

Result<DType> parse_bench_element(const std::string& text) {
  if (text == "fp16") return DType::kFp16;
  if (text == "bf16") return DType::kBf16;
  return Status::InvalidArgument("element '" + text + "' is not fp16 or bf16");
}

std::map<std::string, BaselineRow> read_baseline(const std::string& path, const std::string& list,
                                                 const std::string& command, std::ostream& err) {
  std::map<std::string, BaselineRow> rows;
  if (path.empty()) return rows;
  Result<nlohmann::json> read = read_json_file(path);
  if (!read.ok()) {
    err << command << ": could not read the baseline: " << read.status().message() << "\n";
    return rows;
  }
  try {
    if (!read->contains(list)) {
      err << command << ": the baseline " << path << " has no \"" << list
          << "\" (written by an older bench/sdpa_baseline.py?)\n";
      return rows;
    }
    for (const auto& row : read->at(list)) {
      const std::string key = row.contains("key") ? row.at("key").get<std::string>()
                                                  : row.at("shape").get<std::string>();
      BaselineRow& entry = rows[key];
      entry.ms = row.at("ms").get<double>();
      if (row.contains("backend")) entry.backend = row.at("backend").get<std::string>();
    }
  } catch (const std::exception& error) {
    err << command << ": could not read the baseline " << path << ": " << error.what() << "\n";
    rows.clear();
  }
  return rows;
}

std::vector<std::uint16_t> random_elements(DType element, std::size_t count,
                                           std::mt19937_64& random, float scale) {
  std::vector<std::uint16_t> values(count);
  std::uniform_real_distribution<float> draw(-scale, scale);
  for (auto& value : values) float_to_element(element, draw(random), &value);
  return values;
}

#if defined(KVVM_HAS_CUDA_KERNELS)

#define BENCH_CHECK(expr)                                                                        \
  do {                                                                                           \
    cudaError_t bench_error_ = (expr);                                                           \
    if (bench_error_ != cudaSuccess) {                                                           \
      return Status::DriverError(                                                                \
          std::string(#expr) + ": " + cudaGetErrorString(bench_error_),                          \
          DriverFailure{#expr, cudaGetErrorName(bench_error_), static_cast<int>(bench_error_)}); \
    }                                                                                            \
  } while (0)

Device::~Device() {
  for (void* pointer : owned_) (void)cudaFree(pointer);
}

Result<void*> Device::alloc(std::size_t bytes) {
  void* pointer = nullptr;
  BENCH_CHECK(cudaMalloc(&pointer, std::max<std::size_t>(bytes, 16)));
  owned_.push_back(pointer);
  return pointer;
}

Result<void*> Device::alloc_zeroed(std::size_t bytes) {
  Result<void*> pointer = alloc(bytes);
  if (!pointer.ok()) return pointer;
  BENCH_CHECK(cudaMemset(*pointer, 0, std::max<std::size_t>(bytes, 16)));
  return pointer;
}

Result<void*> Device::upload(const void* host, std::size_t bytes) {
  Result<void*> pointer = alloc(bytes);
  if (!pointer.ok()) return pointer;
  BENCH_CHECK(cudaMemcpy(*pointer, host, bytes, cudaMemcpyHostToDevice));
  return pointer;
}

namespace {

// Events destroyed on every path out of time_ms.
class EventPair {
 public:
  ~EventPair() {
    if (start_ != nullptr) (void)cudaEventDestroy(start_);
    if (stop_ != nullptr) (void)cudaEventDestroy(stop_);
  }
  Status create() {
    BENCH_CHECK(cudaEventCreate(&start_));
    BENCH_CHECK(cudaEventCreate(&stop_));
    return Status::Ok();
  }
  cudaEvent_t start() const { return start_; }
  cudaEvent_t stop() const { return stop_; }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace

Result<double> time_ms(const std::function<Status()>& launch, const TimingOptions& timing) {
  for (int i = 0; i < 3; ++i) KVVM_RETURN_IF_ERROR(launch());
  BENCH_CHECK(cudaDeviceSynchronize());
  EventPair events;
  KVVM_RETURN_IF_ERROR(events.create());
  std::vector<double> times;
  for (std::uint32_t s = 0; s < timing.samples; ++s) {
    BENCH_CHECK(cudaEventRecord(events.start()));
    for (std::uint32_t i = 0; i < timing.iterations; ++i) KVVM_RETURN_IF_ERROR(launch());
    BENCH_CHECK(cudaEventRecord(events.stop()));
    BENCH_CHECK(cudaEventSynchronize(events.stop()));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, events.start(), events.stop()));
    times.push_back(ms / timing.iterations);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

Result<double> copy_bandwidth(std::uint32_t samples) {
  Device device;
  const std::size_t bytes = std::size_t{2} << 30;
  KVVM_ASSIGN_OR_RETURN(void* a, device.alloc(bytes));
  KVVM_ASSIGN_OR_RETURN(void* b, device.alloc(bytes));
  BENCH_CHECK(cudaMemset(a, 0x3c, bytes));
  Result<double> ms = time_ms(
      [&]() -> Status {
        BENCH_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        return Status::Ok();
      },
      TimingOptions{5, samples});
  if (!ms.ok()) return ms.status();
  return 2.0 * bytes / (*ms * 1e-3);
}

Result<BenchCache> make_cache(Driver& driver, const BenchCacheShape& shape, Layout layout,
                              std::uint32_t sequences, std::uint32_t context,
                              std::mt19937_64& random) {
  BenchCache cache;
  KVVM_ASSIGN_OR_RETURN(auto plan, plan_layout(Geometry{"bench", shape.layers, shape.kv_heads,
                                                        shape.head_dim, shape.element},
                                               layout, driver.granule(), context));
  const std::uint64_t bytes = plan.slot_stride * sequences;
  KVVM_ASSIGN_OR_RETURN(
      auto stack,
      ArenaStack::create(
          driver, ArenaStackOptions{.tier_name = "gpu",
                                    .budget_bytes = bytes + driver.granule(),
                                    .pool = PoolOptions{.max_pooled_bytes = 0},
                                    .arena = ArenaOptions{.plan = plan, .max_slots = sequences}}));
  cache.stack = std::move(stack);
  cache.arena = &cache.stack->arena();
  // The same random chunk is appended over and over: filling gigabytes from the host would
  // dominate the run, and the kernels' speed does not depend on which random values they read.
  constexpr std::uint32_t kChunk = 2048;
  Device device;
  const std::size_t rows = std::size_t{kChunk} * shape.kv_heads * shape.head_dim;
  const DType activations = shape.activations != DType::kUnset ? shape.activations : shape.element;
  Result<void*> k = device.upload(random_elements(activations, rows, random, 1.0f));
  Result<void*> v = device.upload(random_elements(activations, rows, random, 1.0f));
  if (!k.ok()) return k.status();
  if (!v.ok()) return v.status();
  for (std::uint32_t b = 0; b < sequences; ++b) {
    KVVM_ASSIGN_OR_RETURN(auto slot, cache.arena->admit(context));
    cache.slots.push_back(slot);
    for (std::uint32_t start = 0; start < context; start += kChunk) {
      AppendParams append;
      append.view = cache.arena->view();
      append.activations = shape.activations;
      append.layer = shape.layer();
      append.kv_heads = shape.kv_heads;
      append.tokens = std::min(kChunk, context - start);
      append.k = *k;
      append.v = *v;
      append.slot = slot;
      append.start = start;
      KVVM_RETURN_IF_ERROR(append_kv_cuda(append, nullptr));
    }
  }
  BENCH_CHECK(cudaDeviceSynchronize());
  return cache;
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace kvvm::cli
