// `kvvm bench prefill`: see bench/drivers/attention/prefill_attention.h.
#include "bench/drivers/attention/prefill_attention.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <string_view>

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

constexpr const char* kBenchPrefill = "kvvm bench prefill";

// The default rows: full prefills of 1K, 4K and 16K tokens, and a 512-token chunk after 4K.
constexpr PrefillCase kDefaultRows[] = {{0, 1024}, {0, 4096}, {0, 16384}, {4096, 512}};

// "32/8" -> 32 query heads, 8 KV heads; false when `text` is not that.
bool parse_heads(const std::string& text, std::uint32_t& qo_heads, std::uint32_t& kv_heads,
                 std::string& error) {
  const std::size_t slash = text.find('/');
  if (slash != std::string::npos) {
    Result<std::uint64_t> qo = parse_count(std::string_view(text).substr(0, slash), 1, 1024);
    Result<std::uint64_t> kv = parse_count(std::string_view(text).substr(slash + 1), 1, 1024);
    if (qo.ok() && kv.ok() && *qo % *kv == 0) {
      qo_heads = static_cast<std::uint32_t>(*qo);
      kv_heads = static_cast<std::uint32_t>(*kv);
      return true;
    }
  }
  error = "heads '" + text +
          "' is not QUERY/KV with counts in [1, 1024] and query heads a multiple of KV heads "
          "(e.g. 32/8)";
  return false;
}

struct PrefillSetup {
  std::vector<PrefillCase> rows;
  std::vector<Layout> layouts;
  std::uint32_t qo_heads = 0;
  std::uint32_t kv_heads = 0;
  DType element = DType::kFp16;
};

// Every usage error, before any device is touched: the message names the bad value.
bool read_setup(const BenchPrefillOptions& options, PrefillSetup& setup, std::string& error) {
  for (std::uint32_t tokens : options.cases) setup.rows.push_back(PrefillCase{0, tokens});
  for (const std::string& text : options.chunks) {
    PrefillCase chunk;
    if (!parse_prefill_chunk(text, chunk, error)) return false;
    setup.rows.push_back(chunk);
  }
  if (setup.rows.empty()) setup.rows.assign(std::begin(kDefaultRows), std::end(kDefaultRows));
  if (!parse_heads(options.heads, setup.qo_heads, setup.kv_heads, error)) return false;
  if (options.head_dim != 64 && options.head_dim != 128) {
    error = "head dim " + std::to_string(options.head_dim) +
            " is not one the CUDA kernels have (64 or 128)";
    return false;
  }
  setup.layouts = all_layouts();
  if (options.layout != "all") {
    Result<Layout> layout = parse_layout(options.layout);
    if (!layout.ok()) {
      error = layout.status().message();
      return false;
    }
    setup.layouts = {*layout};
  }
  Result<DType> element = parse_bench_element(options.element);
  if (!element.ok()) {
    error = element.status().message();
    return false;
  }
  setup.element = *element;
  return true;
}

#if defined(KVVM_HAS_CUDA_KERNELS)

// Median milliseconds of one prefill of `row` over a fresh cache holding its prefix and chunk.
Result<double> bench_row(Driver& driver, const PrefillSetup& setup, const PrefillCase& row,
                         Layout layout, const BenchPrefillOptions& options,
                         std::mt19937_64& random) {
  const BenchCacheShape shape{options.layers, setup.kv_heads, options.head_dim, setup.element};
  KVVM_ASSIGN_OR_RETURN(BenchCache cache,
                        make_cache(driver, shape, layout, 1, row.start + row.tokens, random));
  Device device;
  const std::size_t elements = std::size_t{row.tokens} * setup.qo_heads * options.head_dim;
  Result<void*> q = device.upload(random_elements(setup.element, elements, random, 2.0f));
  Result<void*> out = device.alloc(elements * 2);
  if (!q.ok()) return q.status();
  if (!out.ok()) return out.status();
  PrefillParams params;
  params.view = cache.arena->view();
  params.layer = shape.layer();
  params.qo_heads = setup.qo_heads;
  params.kv_heads = setup.kv_heads;
  params.slot = cache.slots[0];
  params.start = row.start;
  params.tokens = row.tokens;
  params.q = *q;
  params.out = *out;
  return time_ms([&] { return prefill_attention_cuda(params, nullptr); },
                 TimingOptions{options.iterations, options.samples});
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace

bool parse_prefill_chunk(const std::string& text, PrefillCase& chunk, std::string& error) {
  const std::size_t colon = text.find(':');
  if (colon != std::string::npos) {
    Result<std::uint64_t> start =
        parse_count(std::string_view(text).substr(0, colon), 0, kMaxPrefillSequence);
    Result<std::uint64_t> tokens =
        parse_count(std::string_view(text).substr(colon + 1), 1, kMaxPrefillSequence);
    if (start.ok() && tokens.ok() && *start + *tokens <= kMaxPrefillSequence) {
      chunk = PrefillCase{static_cast<std::uint32_t>(*start), static_cast<std::uint32_t>(*tokens)};
      return true;
    }
  }
  error = "chunk '" + text + "' is not START:TOKENS in decimal with TOKENS >= 1 and START + " +
          "TOKENS at most " + std::to_string(kMaxPrefillSequence) + " (e.g. 4096:512)";
  return false;
}

double prefill_flops(const PrefillCase& row, std::uint32_t qo_heads, std::uint32_t head_dim) {
  const double t = row.tokens;
  const double keys_seen = t * row.start + t * (t + 1) / 2;
  return 4.0 * qo_heads * head_dim * keys_seen;
}

std::string prefill_key(const PrefillCase& row, std::uint32_t qo_heads, std::uint32_t kv_heads,
                        std::uint32_t head_dim) {
  return std::to_string(row.tokens) + "@" + std::to_string(row.start) + "," +
         std::to_string(qo_heads) + "/" + std::to_string(kv_heads) + "," + std::to_string(head_dim);
}

CLI::App* add_bench_prefill_command(CLI::App& bench, BenchPrefillOptions& options) {
  CLI::App* prefill = bench.add_subcommand(
      "prefill",
      "Time the CUDA causal prefill attention kernel (tensor cores, grouped-query) over a CUDA "
      "arena: full prefills of 1024, 4096 and 16384 tokens and a 512-token chunk after 4096; "
      "with --baseline, beside PyTorch SDPA (bench/sdpa_baseline.py).");
  prefill->add_option("--device", options.device, "CUDA device ordinal (default 0)")
      ->transform(count_validator(0, kMaxDeviceOrdinal));
  prefill
      ->add_option("--case", options.cases,
                   "A full causal prefill of this many tokens (start 0); repeatable (default: "
                   "1024 4096 16384, and the chunk 4096:512)")
      ->transform(count_validator(1, kMaxPrefillSequence));
  prefill->add_option("--chunk", options.chunks,
                      "START:TOKENS: TOKENS query tokens at positions START.. after a cached "
                      "prefix of START tokens; repeatable");
  prefill->add_option("--heads", options.heads, "Query heads / KV heads (default 32/8)");
  prefill->add_option("--head-dim", options.head_dim, "Head dim: 64 or 128 (default 128)")
      ->transform(count_validator(1, 1024));
  prefill->add_option("--layout", options.layout,
                      "head-major, seq-major, token-major or all (default token-major)");
  prefill
      ->add_option("--element", options.element,
                   "K, V, query and output type (default fp16; the PyTorch baseline is fp16)")
      ->check(CLI::IsMember({"fp16", "bf16"}));
  prefill
      ->add_option("--layers", options.layers, "Layers in the cache; layer 1 is read (default 2)")
      ->transform(count_validator(1, 256));
  prefill->add_option("--iterations", options.iterations, "Launches per timed sample (default 5)")
      ->transform(count_validator(1, 100000));
  prefill
      ->add_option("--samples", options.samples,
                   "Timed samples; the median is reported (default 9)")
      ->transform(count_validator(1, 10000));
  prefill->add_option("--baseline", options.baseline,
                      "JSON written by bench/sdpa_baseline.py --json, for the PyTorch columns");
  prefill->add_option("--json", options.json_out, "Also write the results to this JSON file");
  return prefill;
}

int run_bench_prefill(const BenchPrefillOptions& options, std::ostream& out, std::ostream& err) {
  PrefillSetup setup;
  std::string error;
  if (!read_setup(options, setup, error)) {
    err << kBenchPrefill << ": " << error << "\n";
    return kExitUsage;
  }
#if !defined(KVVM_HAS_CUDA_KERNELS)
  (void)out;
  err << kBenchPrefill << ": needs the CUDA kernels (this build has no nvcc)\n";
  return kExitFailure;
#else
  auto made = make_cuda_driver(CudaDriverOptions{options.device});
  if (!made.ok()) {
    err << kBenchPrefill << ": " << made.status().to_string() << "\n";
    return kExitUsage;
  }
  std::unique_ptr<Driver> driver = std::move(made).value();
  std::mt19937_64 random(20261201);
  const auto baseline = read_baseline(options.baseline, "prefill_rows", kBenchPrefill, err);
  nlohmann::ordered_json json;
  json["benchmark"] = "prefill";
  json["device"] = driver->info().device_name;
  json["element"] = to_string(setup.element);
  json["layers"] = options.layers;
  json["qo_heads"] = setup.qo_heads;
  json["kv_heads"] = setup.kv_heads;
  json["head_dim"] = options.head_dim;
  json["rows"] = nlohmann::ordered_json::array();
  out << "device: " << driver->info().device_name << ", " << to_string(setup.element) << ", "
      << setup.qo_heads << "/" << setup.kv_heads << " heads, head dim " << options.head_dim
      << ", causal; TFLOP/s count 4 x heads x dim x keys seen per query row\n\n";
  char line[320];
  std::snprintf(line, sizeof line, "%-12s %-20s %9s %8s %12s %9s %9s %7s  %s\n", "layout", "row",
                "ms", "TFLOP/s", "tokens/s", "torch ms", "torch TF", "ratio", "torch backend");
  out << line;
  for (Layout layout : setup.layouts) {
    for (const PrefillCase& row : setup.rows) {
      const std::string key = prefill_key(row, setup.qo_heads, setup.kv_heads, options.head_dim);
      Result<double> ms = bench_row(*driver, setup, row, layout, options, random);
      if (!ms.ok()) {
        err << kBenchPrefill << ": " << key << " " << to_string(layout) << ": "
            << ms.status().to_string() << "\n";
        return kExitFailure;
      }
      const double flops = prefill_flops(row, setup.qo_heads, options.head_dim);
      const double tflops = flops / (*ms * 1e-3) / 1e12;
      const double tokens_per_second = row.tokens / (*ms * 1e-3);
      const auto found = baseline.find(key);
      const BaselineRow torch = found == baseline.end() ? BaselineRow{} : found->second;
      const double torch_tflops = torch.ms > 0 ? flops / (torch.ms * 1e-3) / 1e12 : 0;
      std::snprintf(line, sizeof line, "%-12s %-20s %9.4f %8.1f %12.0f %9s %9s %7s  %s\n",
                    std::string(to_string(layout)).c_str(), key.c_str(), *ms, tflops,
                    tokens_per_second, torch.ms > 0 ? fixed(torch.ms, 4).c_str() : "-",
                    torch.ms > 0 ? fixed(torch_tflops, 1).c_str() : "-",
                    torch.ms > 0 ? fixed(torch.ms / *ms, 2).c_str() : "-",
                    torch.backend.empty() ? "-" : torch.backend.c_str());
      out << line << std::flush;
      json["rows"].push_back({{"layout", to_string(layout)},
                              {"key", key},
                              {"start", row.start},
                              {"tokens", row.tokens},
                              {"ms", *ms},
                              {"flops", flops},
                              {"tflops", tflops},
                              {"tokens_per_second", tokens_per_second},
                              {"torch_ms", torch.ms},
                              {"torch_tflops", torch_tflops},
                              {"torch_backend", torch.backend},
                              {"ratio_torch_over_ours", torch.ms > 0 ? torch.ms / *ms : 0}});
    }
  }
  if (!options.json_out.empty()) {
    Status written = write_file(options.json_out, "--json",
                                [&json](std::ostream& file) { file << dump_json(json) << "\n"; });
    if (!written.ok()) {
      err << kBenchPrefill << ": " << written.to_string() << "\n";
      return kExitFailure;
    }
  }
  return kExitOk;
#endif
}

}  // namespace kvvm::cli
