// `kvvm bench decode`: see bench_decode_attention.h. Why an arena on the CUDA driver rather than a
// cudaMalloc'd tensor: the figures are meant for the cache as kvvm holds it (slots in one
// reservation, windows mapped under them), read through the KvView's strides.
#include "bench_decode_attention.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <sstream>

#include "base/json_reader.h"
#include "cli_common.h"
#include "kvvm/attention.h"
#include "kvvm/layout.h"
#include "text_table.h"

#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>

#include "kvvm/arena.h"
#include "kvvm/cuda_driver.h"
#include "kvvm/governor.h"
#include "kvvm/handle_pool.h"
#endif

namespace kvvm::cli {
namespace {

// Bounds of the token options: a prefill's scores are quadratic in its length.
constexpr std::uint64_t kMaxPrefillTokens = std::uint64_t{1} << 20;
constexpr std::uint64_t kMaxChunkTokens = std::uint64_t{1} << 20;

const char* const kDefaultShapes[] = {"1,32768,32/8,128", "16,4096,32/8,128", "64,4096,32/8,128",
                                      "256,2048,32/8,128", "32,8192,14/2,64"};

[[maybe_unused]] std::string shape_key(const DecodeShape& s) {
  return std::to_string(s.batch) + "," + std::to_string(s.context) + "," +
         std::to_string(s.qo_heads) + "/" + std::to_string(s.kv_heads) + "," +
         std::to_string(s.head_dim);
}

[[maybe_unused]] std::uint64_t kv_bytes(const DecodeShape& s) {
  return std::uint64_t{s.batch} * s.context * 2 * s.kv_heads * s.head_dim * 2;
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

class Device {
 public:
  ~Device() {
    for (void* pointer : owned_) (void)cudaFree(pointer);
  }
  Result<void*> alloc(std::size_t bytes) {
    void* pointer = nullptr;
    BENCH_CHECK(cudaMalloc(&pointer, std::max<std::size_t>(bytes, 16)));
    owned_.push_back(pointer);
    return pointer;
  }
  template <typename T>
  Result<void*> upload(const std::vector<T>& host) {
    Result<void*> pointer = alloc(host.size() * sizeof(T));
    if (!pointer.ok()) return pointer;
    BENCH_CHECK(cudaMemcpy(*pointer, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return pointer;
  }

 private:
  std::vector<void*> owned_;
};

std::vector<std::uint16_t> random_fp16(std::size_t count, std::mt19937_64& random, float scale) {
  std::vector<std::uint16_t> values(count);
  std::uniform_real_distribution<float> draw(-scale, scale);
  for (auto& value : values) float_to_element(DType::kFp16, draw(random), &value);
  return values;
}

// Median milliseconds of one call of `launch`, timed as `iterations` back-to-back calls
// between two events, `samples` times, after a warm-up.
template <typename Launch>
Result<double> time_ms(const Launch& launch, const BenchDecodeOptions& options) {
  for (int i = 0; i < 3; ++i) KVVM_RETURN_IF_ERROR(launch());
  BENCH_CHECK(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (std::uint32_t s = 0; s < options.samples; ++s) {
    BENCH_CHECK(cudaEventRecord(start));
    for (std::uint32_t i = 0; i < options.iterations; ++i) KVVM_RETURN_IF_ERROR(launch());
    BENCH_CHECK(cudaEventRecord(stop));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms / options.iterations);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Device-to-device copy of 2 GiB, counting bytes read plus written.
Result<double> copy_bandwidth(const BenchDecodeOptions& options) {
  Device device;
  const std::size_t bytes = std::size_t{2} << 30;
  Result<void*> a = device.alloc(bytes), b = device.alloc(bytes);
  if (!a.ok()) return a.status();
  if (!b.ok()) return b.status();
  BENCH_CHECK(cudaMemset(*a, 0x3c, bytes));
  BenchDecodeOptions few = options;
  few.iterations = 5;
  Result<double> ms = time_ms(
      [&]() -> Status {
        BENCH_CHECK(cudaMemcpyAsync(*b, *a, bytes, cudaMemcpyDeviceToDevice));
        return Status::Ok();
      },
      few);
  if (!ms.ok()) return ms.status();
  return 2.0 * bytes / (*ms * 1e-3);
}

struct Cache {
  std::unique_ptr<Governor> governor;
  std::unique_ptr<HandlePool> pool;
  std::unique_ptr<Arena> arena;
  std::vector<std::uint32_t> slots;
};

// An arena of `sequences` slots of `context` tokens, every live token filled with random K/V
// through append_kv_cuda (so the figures are read from data, not zeros).
Result<Cache> make_cache(Driver& driver, const DecodeShape& s, Layout layout,
                         const BenchDecodeOptions& options, std::uint32_t sequences,
                         std::uint32_t context, std::mt19937_64& random) {
  Cache cache;
  auto plan = plan_layout(Geometry{"bench", options.layers, s.kv_heads, s.head_dim, DType::kFp16},
                          layout, driver.granule(), context);
  if (!plan.ok()) return plan.status();
  const std::uint64_t bytes = plan->slot_stride * sequences;
  cache.governor = std::make_unique<Governor>();
  const TierId tier = cache.governor->add_tier("gpu", bytes + driver.granule());
  cache.pool = std::make_unique<HandlePool>(driver, PoolOptions{.max_pooled_bytes = 0},
                                            cache.governor.get(), tier);
  auto arena =
      Arena::create(*cache.pool, *cache.governor, ArenaOptions{*plan, sequences, tier, 0, {}});
  if (!arena.ok()) return arena.status();
  cache.arena = std::move(arena).value();
  constexpr std::uint32_t kChunk = 2048;
  Device device;
  const std::size_t rows = std::size_t{kChunk} * s.kv_heads * s.head_dim;
  Result<void*> k = device.upload(random_fp16(rows, random, 1.0f));
  Result<void*> v = device.upload(random_fp16(rows, random, 1.0f));
  if (!k.ok()) return k.status();
  if (!v.ok()) return v.status();
  for (std::uint32_t b = 0; b < sequences; ++b) {
    auto slot = cache.arena->admit(context);
    if (!slot.ok()) return slot.status();
    cache.slots.push_back(*slot);
    for (std::uint32_t start = 0; start < context; start += kChunk) {
      AppendParams append;
      append.view = cache.arena->view();
      append.layer = 1 % options.layers;
      append.kv_heads = s.kv_heads;
      append.tokens = std::min(kChunk, context - start);
      append.k = *k;
      append.v = *v;
      append.slot = *slot;
      append.start = start;
      KVVM_RETURN_IF_ERROR(append_kv_cuda(append, nullptr));
    }
  }
  BENCH_CHECK(cudaDeviceSynchronize());
  return cache;
}

struct DecodeRow {
  DecodeShape shape;
  Layout layout = Layout::kTokenMajor;
  DecodePlan plan;
  double ms = 0;
  double bytes_per_second = 0;
};

Result<DecodeRow> bench_decode(Driver& driver, const DecodeShape& s, Layout layout,
                               const BenchDecodeOptions& options, std::mt19937_64& random) {
  Result<Cache> cache = make_cache(driver, s, layout, options, s.batch, s.context, random);
  if (!cache.ok()) return cache.status();
  Device device;
  std::vector<std::uint32_t> lengths(s.batch, s.context);
  Result<void*> q =
      device.upload(random_fp16(std::size_t{s.batch} * s.qo_heads * s.head_dim, random, 2.0f));
  Result<void*> slots = device.upload(cache->slots);
  Result<void*> dlengths = device.upload(lengths);
  Result<void*> out = device.alloc(std::size_t{s.batch} * s.qo_heads * s.head_dim * 2);
  for (auto* r : {&q, &slots, &dlengths, &out}) {
    if (!r->ok()) return r->status();
  }
  DecodeParams params;
  params.view = cache->arena->view();
  params.layer = 1 % options.layers;
  params.qo_heads = s.qo_heads;
  params.kv_heads = s.kv_heads;
  params.batch = s.batch;
  params.q = *q;
  params.slots = static_cast<const std::uint32_t*>(*slots);
  params.lengths = static_cast<const std::uint32_t*>(*dlengths);
  params.max_length = s.context;
  params.chunk_tokens = options.chunk_tokens;
  params.out = *out;
  DecodeRow row;
  row.shape = s;
  row.layout = layout;
  auto plan = plan_decode_cuda(params);
  if (!plan.ok()) return plan.status();
  row.plan = *plan;
  Result<void*> workspace = device.alloc(plan->workspace_bytes);
  if (!workspace.ok()) return workspace.status();
  BENCH_CHECK(cudaMemset(*workspace, 0, std::max<std::size_t>(plan->workspace_bytes, 16)));
  Result<double> ms = time_ms(
      [&] { return decode_attention_cuda(params, *workspace, plan->workspace_bytes, nullptr); },
      options);
  if (!ms.ok()) return ms.status();
  row.ms = *ms;
  row.bytes_per_second = kv_bytes(s) / (row.ms * 1e-3);
  return row;
}

// A causal prefill of `tokens` tokens (one chunk, from position 0) for the shape's heads.
Result<double> bench_prefill(Driver& driver, const DecodeShape& s,
                             const BenchDecodeOptions& options, std::mt19937_64& random) {
  const std::uint32_t tokens = options.prefill_tokens;
  Result<Cache> cache = make_cache(driver, s, Layout::kTokenMajor, options, 1, tokens, random);
  if (!cache.ok()) return cache.status();
  Device device;
  Result<void*> q =
      device.upload(random_fp16(std::size_t{tokens} * s.qo_heads * s.head_dim, random, 2.0f));
  Result<void*> out = device.alloc(std::size_t{tokens} * s.qo_heads * s.head_dim * 2);
  if (!q.ok()) return q.status();
  if (!out.ok()) return out.status();
  PrefillParams params;
  params.view = cache->arena->view();
  params.layer = 1 % options.layers;
  params.qo_heads = s.qo_heads;
  params.kv_heads = s.kv_heads;
  params.slot = cache->slots[0];
  params.tokens = tokens;
  params.q = *q;
  params.out = *out;
  BenchDecodeOptions few = options;
  few.iterations = 3;
  few.samples = 5;
  return time_ms([&] { return prefill_attention_cuda(params, nullptr); }, few);
}

#endif  // KVVM_HAS_CUDA_KERNELS

[[maybe_unused]] std::map<std::string, double> read_baseline(const std::string& path,
                                                             std::ostream& err) {
  std::map<std::string, double> ms;
  if (path.empty()) return ms;
  Result<nlohmann::json> read = read_json_file(path);
  if (!read.ok()) {
    err << "kvvm bench decode: could not read the baseline: " << read.status().message() << "\n";
    return ms;
  }
  try {
    for (const auto& row : read->at("rows")) {
      ms[row.at("shape").get<std::string>()] = row.at("ms").get<double>();
    }
  } catch (const std::exception& error) {
    err << "kvvm bench decode: could not read the baseline " << path << ": " << error.what()
        << "\n";
  }
  return ms;
}

}  // namespace

bool parse_decode_shape(const std::string& text, DecodeShape& shape, std::string& error) {
  unsigned batch = 0, context = 0, qo = 0, kv = 0, dim = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%u,%u,%u/%u,%u%c", &batch, &context, &qo, &kv, &dim, &tail) != 5 ||
      batch == 0 || context == 0 || qo == 0 || kv == 0 || dim == 0 || qo % kv != 0) {
    error = "shape '" + text +
            "' is not batch,context,query-heads/kv-heads,head-dim with positive values and "
            "query heads a multiple of KV heads (e.g. 32,8192,14/2,64)";
    return false;
  }
  shape = DecodeShape{batch, context, qo, kv, dim};
  return true;
}

CLI::App* add_bench_decode_command(CLI::App& bench, BenchDecodeOptions& options) {
  CLI::App* decode = bench.add_subcommand(
      "decode",
      "Time the CUDA decode attention kernel (fp16, split-K, grouped-query) over a CUDA arena for "
      "five decode shapes an engine meets (batch 1 at 32K to batch 256 at 2K) in every layout, a "
      "causal prefill, and the device copy bandwidth.");
  decode->add_option("--device", options.device, "CUDA device ordinal (default 0)")
      ->transform(count_validator(0, kMaxDeviceOrdinal));
  decode->add_option(
      "--shape", options.shapes,
      "batch,context,qo/kv,dim; repeatable (default: 1,32768,32/8,128 16,4096,32/8,128 "
      "64,4096,32/8,128 256,2048,32/8,128 32,8192,14/2,64)");
  decode->add_option("--layout", options.layout,
                     "head-major, seq-major, token-major or all (default all)");
  decode->add_option("--layers", options.layers, "Layers in the cache; layer 1 is read (default 2)")
      ->transform(count_validator(1, 256));
  decode->add_option("--iterations", options.iterations, "Launches per timed sample (default 20)")
      ->transform(count_validator(1, 100000));
  decode->add_option("--samples", options.samples, "Timed samples; the median is reported")
      ->transform(count_validator(1, 10000));
  decode
      ->add_option("--prefill-tokens", options.prefill_tokens,
                   "Prompt length of the prefill row (0: none; default 4096)")
      ->transform(count_validator(0, kMaxPrefillTokens));
  decode
      ->add_option("--chunk", options.chunk_tokens,
                   "Decode split size in tokens (default 0: planned from the device and shape)")
      ->transform(count_validator(0, kMaxChunkTokens));
  decode->add_option("--baseline", options.baseline,
                     "JSON written by bench/sdpa_baseline.py --json, for the ratio column");
  decode->add_option("--json", options.json_out, "Also write the results to this JSON file");
  return decode;
}

int run_bench_decode(const BenchDecodeOptions& options, std::ostream& out, std::ostream& err) {
  std::vector<DecodeShape> shapes;
  std::vector<std::string> texts = options.shapes;
  if (texts.empty()) texts.assign(std::begin(kDefaultShapes), std::end(kDefaultShapes));
  for (const std::string& text : texts) {
    DecodeShape shape;
    std::string error;
    if (!parse_decode_shape(text, shape, error)) {
      err << "kvvm bench decode: " << error << "\n";
      return kExitUsage;
    }
    shapes.push_back(shape);
  }
  std::vector<Layout> layouts = all_layouts();
  if (options.layout != "all") {
    Result<Layout> layout = parse_layout(options.layout);
    if (!layout.ok()) {
      err << "kvvm bench decode: " << layout.status().message() << "\n";
      return kExitUsage;
    }
    layouts = {*layout};
  }
#if !defined(KVVM_HAS_CUDA_KERNELS)
  (void)out;
  err << "kvvm bench decode: needs the CUDA kernels (this build has no nvcc)\n";
  return kExitFailure;
#else
  auto made = make_cuda_driver(CudaDriverOptions{options.device});
  if (!made.ok()) {
    err << "kvvm bench decode: " << made.status().to_string() << "\n";
    return kExitUsage;
  }
  std::unique_ptr<Driver> driver = std::move(made).value();
  std::mt19937_64 random(20261129);
  const auto baseline = read_baseline(options.baseline, err);
  Result<double> copy = copy_bandwidth(options);
  if (!copy.ok()) {
    err << "kvvm bench decode: copy bandwidth: " << copy.status().to_string() << "\n";
    return kExitFailure;
  }
  nlohmann::ordered_json json;
  json["benchmark"] = "decode";
  json["device"] = driver->info().device_name;
  json["layers"] = options.layers;
  json["copy_bytes_per_second"] = *copy;
  out << "device: " << driver->info().device_name << "\n"
      << "device-to-device copy: " << fixed(*copy / 1e12, 2) << " TB/s (read + write)\n\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-12s %-20s %7s %7s %9s %8s %7s %9s %7s\n", "layout", "shape",
                "chunks", "chunk", "ms", "TB/s", "%copy", "torch ms", "ratio");
  out << line;
  for (Layout layout : layouts) {
    for (const DecodeShape& shape : shapes) {
      Result<DecodeRow> row = bench_decode(*driver, shape, layout, options, random);
      if (!row.ok()) {
        err << "kvvm bench decode: " << shape_key(shape) << " " << to_string(layout) << ": "
            << row.status().to_string() << "\n";
        return kExitFailure;
      }
      const auto found = baseline.find(shape_key(shape));
      const double torch_ms = found == baseline.end() ? 0 : found->second;
      std::snprintf(line, sizeof line, "%-12s %-20s %7u %7u %9.4f %8.2f %6.1f%% %9s %7s\n",
                    std::string(to_string(layout)).c_str(), shape_key(shape).c_str(),
                    row->plan.chunks, row->plan.chunk_tokens, row->ms, row->bytes_per_second / 1e12,
                    100.0 * row->bytes_per_second / *copy,
                    torch_ms > 0 ? fixed(torch_ms, 4).c_str() : "-",
                    torch_ms > 0 ? fixed(torch_ms / row->ms, 2).c_str() : "-");
      out << line << std::flush;
      json["rows"].push_back({{"layout", to_string(layout)},
                              {"shape", shape_key(shape)},
                              {"chunks", row->plan.chunks},
                              {"chunk_tokens", row->plan.chunk_tokens},
                              {"ms", row->ms},
                              {"kv_bytes", kv_bytes(shape)},
                              {"bytes_per_second", row->bytes_per_second},
                              {"fraction_of_copy", row->bytes_per_second / *copy},
                              {"torch_ms", torch_ms},
                              {"ratio_torch_over_ours", torch_ms > 0 ? torch_ms / row->ms : 0}});
    }
  }
  if (options.prefill_tokens > 0) {
    const DecodeShape prefill_shape{1, options.prefill_tokens, 32, 8, 128};
    Result<double> ms = bench_prefill(*driver, prefill_shape, options, random);
    if (!ms.ok()) {
      err << "kvvm bench decode: prefill: " << ms.status().to_string() << "\n";
      return kExitFailure;
    }
    const double tokens_per_second = options.prefill_tokens / (*ms * 1e-3);
    // Causal: half the square of scores, two matrix products of 2 flops per multiply-add.
    const double flops = 2.0 * 2.0 * options.prefill_tokens * options.prefill_tokens / 2.0 *
                         prefill_shape.qo_heads * prefill_shape.head_dim;
    out << "\nprefill (token-major, one layer, 32/8 heads, head dim 128, fp16): "
        << options.prefill_tokens << " tokens in " << fixed(*ms, 3)
        << " ms = " << fixed(tokens_per_second, 0) << " tokens/s, "
        << fixed(flops / (*ms * 1e-3) / 1e12, 2) << " TFLOP/s\n";
    json["prefill"] = {{"tokens", options.prefill_tokens},
                       {"ms", *ms},
                       {"tokens_per_second", tokens_per_second},
                       {"tflops", flops / (*ms * 1e-3) / 1e12}};
  }
  if (!options.json_out.empty()) {
    Status written = write_file(options.json_out, "--json",
                                [&json](std::ostream& file) { file << dump_json(json) << "\n"; });
    if (!written.ok()) {
      err << "kvvm bench decode: " << written.to_string() << "\n";
      return kExitFailure;
    }
  }
  return kExitOk;
#endif
}

}  // namespace kvvm::cli
