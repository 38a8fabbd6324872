// `kvvm bench decode`: see bench/drivers/attention/decode_attention.h.
#include "bench/drivers/attention/decode_attention.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>

#include "bench/drivers/attention/cuda_support.h"
#include "kit/cli_common.h"
#include "kit/text_table.h"
#include "kvvm/kernels/attention.h"
#include "kvvm/kv/layout.h"

#if defined(KVVM_HAS_CUDA_KERNELS)
#include "kvvm/vmm/cuda_driver.h"
#endif

namespace kvvm::cli {
namespace {

constexpr std::uint64_t kMaxChunkTokens = std::uint64_t{1} << 20;

const char* const kDefaultShapes[] = {"1,32768,32/8,128", "16,4096,32/8,128",  "8,16384,32/8,128",
                                      "64,4096,32/8,128", "256,2048,32/8,128", "64,2048,64/8,128",
                                      "32,8192,14/2,64",  "128,1024,14/2,64"};

[[maybe_unused]] std::string shape_key(const DecodeShape& s) {
  return std::to_string(s.batch) + "," + std::to_string(s.context) + "," +
         std::to_string(s.qo_heads) + "/" + std::to_string(s.kv_heads) + "," +
         std::to_string(s.head_dim);
}

[[maybe_unused]] std::uint64_t kv_bytes(const DecodeShape& s, DType cache) {
  return std::uint64_t{s.batch} * s.context * 2 * s.kv_heads * s.head_dim * element_bytes(cache);
}

#if defined(KVVM_HAS_CUDA_KERNELS)

struct DecodeRow {
  DecodeShape shape;
  Layout layout = Layout::kTokenMajor;
  DecodePlan plan;
  double ms = 0;
  double bytes_per_second = 0;
};

Result<DecodeRow> bench_decode(Driver& driver, const DecodeShape& s, Layout layout, DType element,
                               DType cache_element, const BenchDecodeOptions& options,
                               std::mt19937_64& random) {
  const BenchCacheShape cache_shape{options.layers, s.kv_heads, s.head_dim, cache_element,
                                    cache_element == DType::kFp8 ? element : DType::kUnset};
  KVVM_ASSIGN_OR_RETURN(BenchCache cache,
                        make_cache(driver, cache_shape, layout, s.batch, s.context, random));
  Device device;
  std::vector<std::uint32_t> lengths(s.batch, s.context);
  Result<void*> q = device.upload(
      random_elements(element, std::size_t{s.batch} * s.qo_heads * s.head_dim, random, 2.0f));
  Result<void*> slots = device.upload(cache.slots);
  Result<void*> dlengths = device.upload(lengths);
  Result<void*> out = device.alloc(std::size_t{s.batch} * s.qo_heads * s.head_dim * 2);
  for (auto* r : {&q, &slots, &dlengths, &out}) {
    if (!r->ok()) return r->status();
  }
  DecodeParams params;
  params.view = cache.arena->view();
  params.activations = cache_shape.activations;
  params.layer = cache_shape.layer();
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
  KVVM_ASSIGN_OR_RETURN(auto plan, plan_decode_cuda(params));
  row.plan = plan;
  KVVM_ASSIGN_OR_RETURN(void* workspace, device.alloc_zeroed(plan.workspace_bytes));
  Result<double> ms = time_ms(
      [&] { return decode_attention_cuda(params, workspace, plan.workspace_bytes, nullptr); },
      TimingOptions{options.iterations, options.samples});
  if (!ms.ok()) return ms.status();
  row.ms = *ms;
  row.bytes_per_second = kv_bytes(s, cache_element) / (row.ms * 1e-3);
  return row;
}

#endif  // KVVM_HAS_CUDA_KERNELS

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
      "Time the CUDA decode attention kernel (split-K, grouped-query) over a CUDA arena for eight "
      "decode shapes an engine meets (batch 1 at 32K to batch 256 at 2K) in every layout, and "
      "the device copy bandwidth; with --baseline, beside PyTorch SDPA (bench/sdpa_baseline.py). "
      "The causal prefill is 'kvvm bench prefill'.");
  decode->add_option("--device", options.device, "CUDA device ordinal (default 0)")
      ->transform(count_validator(0, kMaxDeviceOrdinal));
  decode->add_option("--shape", options.shapes,
                     "batch,context,qo/kv,dim; repeatable (default: 1,32768,32/8,128 "
                     "16,4096,32/8,128 8,16384,32/8,128 64,4096,32/8,128 256,2048,32/8,128 "
                     "64,2048,64/8,128 32,8192,14/2,64 128,1024,14/2,64)");
  decode->add_option("--layout", options.layout,
                     "head-major, seq-major, token-major or all (default all)");
  decode
      ->add_option("--element", options.element,
                   "K, V, query and output type (default fp16; the PyTorch baseline is fp16)")
      ->check(CLI::IsMember({"fp16", "bf16"}));
  decode
      ->add_option("--kv-dtype", options.kv_dtype,
                   "The cache's element type: the --element's (default), or fp8 (e4m3 at scale 1, "
                   "read with --element queries and outputs; half the bytes per token)")
      ->check(CLI::IsMember({"fp16", "bf16", "fp8"}));
  decode->add_option("--layers", options.layers, "Layers in the cache; layer 1 is read (default 2)")
      ->transform(count_validator(1, 256));
  decode->add_option("--iterations", options.iterations, "Launches per timed sample (default 20)")
      ->transform(count_validator(1, 100000));
  decode->add_option("--samples", options.samples, "Timed samples; the median is reported")
      ->transform(count_validator(1, 10000));
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
  Result<DType> element = parse_bench_element(options.element);
  if (!element.ok()) {
    err << "kvvm bench decode: " << element.status().message() << "\n";
    return kExitUsage;
  }
  const DType cache = options.kv_dtype == "fp8" ? DType::kFp8 : *element;
  if (!options.kv_dtype.empty() && options.kv_dtype != "fp8" &&
      options.kv_dtype != options.element) {
    err << "kvvm bench decode: --kv-dtype " << options.kv_dtype << " with --element "
        << options.element << ": a 16-bit cache holds the activations' type\n";
    return kExitUsage;
  }
#if !defined(KVVM_HAS_CUDA_KERNELS)
  (void)out;
  (void)cache;
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
  const auto baseline = read_baseline(options.baseline, "rows", "kvvm bench decode", err);
  Result<double> copy = copy_bandwidth(options.samples);
  if (!copy.ok()) {
    err << "kvvm bench decode: copy bandwidth: " << copy.status().to_string() << "\n";
    return kExitFailure;
  }
  nlohmann::ordered_json json;
  json["benchmark"] = "decode";
  json["device"] = driver->info().device_name;
  json["layers"] = options.layers;
  json["element"] = to_string(*element);
  json["kv_dtype"] = to_string(cache);
  json["copy_bytes_per_second"] = *copy;
  out << "device: " << driver->info().device_name << ", " << to_string(*element)
      << (cache == DType::kFp8 ? " with an fp8 (e4m3) cache" : "") << "\n"
      << "device-to-device copy: " << fixed(*copy / 1e12, 2) << " TB/s (read + write)\n\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-12s %-20s %7s %7s %9s %8s %7s %9s %7s\n", "layout", "shape",
                "chunks", "chunk", "ms", "TB/s", "%copy", "torch ms", "ratio");
  out << line;
  for (Layout layout : layouts) {
    for (const DecodeShape& shape : shapes) {
      Result<DecodeRow> row =
          bench_decode(*driver, shape, layout, *element, cache, options, random);
      if (!row.ok()) {
        err << "kvvm bench decode: " << shape_key(shape) << " " << to_string(layout) << ": "
            << row.status().to_string() << "\n";
        return kExitFailure;
      }
      const auto found = baseline.find(shape_key(shape));
      const double torch_ms = found == baseline.end() ? 0 : found->second.ms;
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
                              {"kv_bytes", kv_bytes(shape, cache)},
                              {"bytes_per_second", row->bytes_per_second},
                              {"fraction_of_copy", row->bytes_per_second / *copy},
                              {"torch_ms", torch_ms},
                              {"ratio_torch_over_ours", torch_ms > 0 ? torch_ms / row->ms : 0}});
    }
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
