// --kv-dtype on the command line: `kvvm plan` and `kvvm simulate` size the KV in the type asked
// for (fp8: one byte per element, so half the bytes per token and twice the sequences, in the
// paged baselines as in kvvm's arena) and still take the old --dtype; `generate`, `serve` and
// `bench engine` store the KV in it, say so at start-up (with the fp8 scales), in `/metrics`
// (vllm:cache_config_info's cache_dtype) and in their reports; a bad value names the option,
// and a type the CUDA backend cannot read is refused by name before the KV space is made;
// --kv-scales calibrate is announced, logged once measured, and needs an fp8 cache.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "commands/serve_command.h"
#include "kit/cli_common.h"
#include "kit/kv_dtype_flag.h"
#include "kvvm/base/log.h"
#include "kvvm/kv/geometry.h"
#include "kvvm/kv/layout.h"
#include "kvvm/model/config.h"
#include "kvvm/model/kv_config.h"
#include "kvvm/model/model.h"
#include "sim/baselines.h"
#include "support/cli_run.h"
#include "support/prometheus_text.h"
#include "support/test_data.h"

namespace kvvm::cli_kv_dtype_test {
namespace {

using cli::kExitOk;
using cli::kExitUsage;
using test::CliRun;
using test::contains;
using test::run;

nlohmann::json json_of(const CliRun& result) {
  EXPECT_EQ(result.code, kExitOk) << result.err;
  return nlohmann::json::parse(result.out);
}

nlohmann::json plan_json(const std::string& option, const std::string& dtype) {
  return json_of(
      run({"plan", "--model", "llama-3-8b", "--layout", "token-major", option, dtype, "--json"}));
}

TEST(CliKvDtype, PlanFp8HalvesTheBytesPerTokenAndDoublesTheTokensPerGranule) {
  const nlohmann::json bf16 = plan_json("--kv-dtype", "bf16");
  const nlohmann::json fp8 = plan_json("--kv-dtype", "fp8");
  EXPECT_EQ(bf16["model"]["dtype"], "bf16");
  EXPECT_EQ(fp8["model"]["dtype"], "fp8");
  EXPECT_EQ(bf16["model"]["element_bytes"].get<int>(), 2);
  EXPECT_EQ(fp8["model"]["element_bytes"].get<int>(), 1);
  const auto bytes_per_token = [](const nlohmann::json& plan) {
    return plan["model"]["bytes_per_token"].get<std::uint64_t>();
  };
  // llama-3-8b: 32 layers x 2 x 8 heads x 128 dims x 2 bytes = 128 KiB, in fp8 64 KiB.
  EXPECT_EQ(bytes_per_token(bf16), std::uint64_t{128} << 10);
  EXPECT_EQ(bytes_per_token(bf16), 2 * bytes_per_token(fp8));
  // Token-major: one fragment, so a granule holds G / bytes per token tokens (the crossover).
  ASSERT_EQ(bf16["layouts"].size(), 1u);
  ASSERT_EQ(fp8["layouts"].size(), 1u);
  const nlohmann::json& a = bf16["layouts"][0];
  const nlohmann::json& b = fp8["layouts"][0];
  const auto granule = bf16["granule_bytes"].get<std::uint64_t>();
  EXPECT_EQ(a["crossover_tokens"].get<double>(),
            static_cast<double>(granule / bytes_per_token(bf16)));
  EXPECT_EQ(b["crossover_tokens"].get<double>(), 2 * a["crossover_tokens"].get<double>());
  // 8192 tokens per sequence in 40 GiB: 40 sequences of 1 GiB, 80 of 512 MiB.
  EXPECT_EQ(a["concurrency"]["without_sharing"].get<std::uint64_t>(), 40u);
  EXPECT_EQ(b["concurrency"]["without_sharing"].get<std::uint64_t>(), 80u);
}

TEST(CliKvDtype, TheOldDtypeNameStillWorks) {
  EXPECT_EQ(plan_json("--dtype", "fp8"), plan_json("--kv-dtype", "fp8"));
  for (const char* command : {"plan", "simulate"}) {
    const CliRun help = run({command, "--help"});
    EXPECT_EQ(help.code, kExitOk) << help.err;
    EXPECT_TRUE(contains(help.out, "--kv-dtype")) << help.out;
    EXPECT_TRUE(contains(help.out, "--dtype")) << help.out;
  }
}

// 60 requests of 100 prompt tokens at t = 0, one output token each (it stays in the prompt's
// last window and block), no shared prefix: the peaks are set by admission alone.
std::string write_trace() {
  const std::filesystem::path path = test::scratch_dir("kvvm_cli_kv_dtype") / "trace.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < 60; ++i) {
    out << "{\"arrival\": 0, \"prompt_tokens\": 100, \"output_tokens\": 1}\n";
  }
  return path.string();
}

constexpr std::uint64_t kBudget = std::uint64_t{16} << 20;
constexpr std::uint64_t kGranule = std::uint64_t{64} << 10;
constexpr std::uint64_t kMaxContext = 256;

nlohmann::json simulate_json(const std::string& trace, const std::string& option,
                             const std::string& dtype) {
  return json_of(
      run({"simulate", "--backend", "host", "--host-granule", std::to_string(kGranule), "--model",
           "qwen2.5-0.5b", "--max-context", std::to_string(kMaxContext), "--budget",
           std::to_string(kBudget), "--trace", trace, option, dtype, "--json"}));
}

std::uint64_t peak(const nlohmann::json& report, const std::string& system) {
  for (const nlohmann::json& s : report["systems"]) {
    if (s["name"] == system) return s["peak_concurrency"].get<std::uint64_t>();
  }
  ADD_FAILURE() << "no system " << system;
  return 0;
}

TEST(CliKvDtype, SimulateFp8AdmitsMoreSequencesOnTheSameBudget) {
  const std::string trace = write_trace();
  const nlohmann::json bf16 = simulate_json(trace, "--kv-dtype", "bf16");
  const nlohmann::json fp8 = simulate_json(trace, "--kv-dtype", "fp8");
  EXPECT_EQ(fp8["model"]["dtype"], "fp8");
  EXPECT_EQ(bf16["model"]["bytes_per_token"].get<std::uint64_t>(),
            2 * fp8["model"]["bytes_per_token"].get<std::uint64_t>());
  for (const char* system : {"kvvm", "paged-16+cache", "paged-16", "preallocate"}) {
    EXPECT_GT(peak(fp8, system), peak(bf16, system)) << system;
  }
  for (const DType dtype : {DType::kBf16, DType::kFp8}) {
    const nlohmann::json& report = dtype == DType::kFp8 ? fp8 : bf16;
    const Result<Geometry> geometry = model::builtin_geometry("qwen2.5-0.5b", dtype);
    ASSERT_TRUE(geometry.ok()) << geometry.status().to_string();
    const Result<LayoutPlan> plan =
        plan_layout(*geometry, Layout::kTokenMajor, kGranule, kMaxContext);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    // kvvm: the budget over the granules 100 tokens commit.
    EXPECT_EQ(peak(report, "kvvm"), admissible_concurrency(*plan, 100, 0, kBudget).without_sharing)
        << to_string(dtype);
    // paged-16: blocks of 16 tokens of this element size (vLLM's fp8 blocks hold one-byte
    // elements), ceil(100 / 16) = 7 per sequence.
    const std::uint64_t block = cli::kPagedBlockTokens * geometry->bytes_per_token();
    EXPECT_EQ(peak(report, "paged-16"), kBudget / block / 7) << to_string(dtype);
    EXPECT_EQ(peak(report, "preallocate"),
              cli::preallocate_capacity(kBudget, kMaxContext, geometry->bytes_per_token()))
        << to_string(dtype);
  }
  EXPECT_EQ(simulate_json(trace, "--dtype", "fp8")["systems"], fp8["systems"]);
}

TEST(CliKvDtype, ABadValueNamesTheOptionAndTheValue) {
  const std::string model = test::model_fixture_dir("qwen2-tiny");
  const std::vector<std::vector<std::string>> commands = {
      {"generate", "--model", model, "--prompt-ids", "1,2"},
      {"serve", "--model", model},
      {"bench", "engine", "--model", model},
  };
  // float8_e5m2 is a name parse_dtype knows (for a config's torch_dtype), but the cache is
  // e4m3: the option takes the four names only.
  for (const char* bad : {"fp9", "int4", "float8_e5m2"}) {
    for (std::vector<std::string> args : commands) {
      args.insert(args.end(), {"--kv-dtype", bad});
      const CliRun result = run(args);
      EXPECT_EQ(result.code, kExitUsage) << args[0] << " " << bad << ": " << result.err;
      EXPECT_TRUE(contains(result.err, "--kv-dtype")) << result.err;
      EXPECT_TRUE(contains(result.err, bad)) << result.err;
    }
  }
  for (const char* command : {"plan", "simulate"}) {
    for (const char* option : {"--kv-dtype", "--dtype"}) {
      const CliRun result = run({command, option, "int4"});
      EXPECT_EQ(result.code, kExitUsage) << command << " " << option << ": " << result.err;
      EXPECT_TRUE(contains(result.err, "--kv-dtype")) << result.err;
      EXPECT_TRUE(contains(result.err, "'int4'")) << result.err;
    }
  }
}

TEST(CliKvDtype, HelpExplainsTheOption) {
  const std::vector<std::vector<std::string>> commands = {
      {"generate", "--help"}, {"serve", "--help"}, {"bench", "engine", "--help"}};
  for (const std::vector<std::string>& args : commands) {
    const CliRun help = run(args);
    EXPECT_EQ(help.code, kExitOk) << help.err;
    for (const char* part : {"--kv-dtype", "e4m3", "k_scale", "twice the sequences", "fp32 only"}) {
      EXPECT_TRUE(contains(help.out, part)) << args[0] << ": " << part << "\n" << help.out;
    }
  }
}

// A model that says it runs on CUDA, to see what the CLI refuses there without a GPU.
class CudaLookalike final : public model::Model {
 public:
  explicit CudaLookalike(model::ModelConfig config) : Model(std::move(config), {}) {}
  model::Backend backend() const override { return model::Backend::kCuda; }
  Status forward(const model::StepBatch&, const model::StepOutput&) override {
    return Status::FailedPrecondition("a stand-in: no steps");
  }
};

TEST(CliKvDtype, TypesTheCudaBackendCannotReadAreRefusedByName) {
  Result<model::ModelConfig> config = model::builtin_model_config("qwen2.5-0.5b");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  config->dtype = DType::kBf16;
  const CudaLookalike bf16_model(*config);
  EXPECT_TRUE(cli::check_kv_dtype(DType::kUnset, bf16_model, *config).ok());
  EXPECT_TRUE(cli::check_kv_dtype(DType::kBf16, bf16_model, *config).ok());
  EXPECT_TRUE(cli::check_kv_dtype(DType::kFp8, bf16_model, *config).ok());
  const Status fp32 = cli::check_kv_dtype(DType::kFp32, bf16_model, *config);
  EXPECT_EQ(fp32.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(fp32.message(), "--kv-dtype fp32")) << fp32.message();
  EXPECT_TRUE(contains(fp32.message(), "--backend cpu")) << fp32.message();
  const Status fp16 = cli::check_kv_dtype(DType::kFp16, bf16_model, *config);
  EXPECT_EQ(fp16.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(fp16.message(), "--kv-dtype fp16")) << fp16.message();
  EXPECT_TRUE(contains(fp16.message(), "computes in bf16")) << fp16.message();
  // An F32 checkpoint runs in bf16 on CUDA; an fp16 one in fp16.
  config->dtype = DType::kFp32;
  EXPECT_TRUE(cli::check_kv_dtype(DType::kBf16, CudaLookalike(*config), *config).ok());
  config->dtype = DType::kFp16;
  EXPECT_TRUE(cli::check_kv_dtype(DType::kFp16, CudaLookalike(*config), *config).ok());
  EXPECT_FALSE(cli::check_kv_dtype(DType::kBf16, CudaLookalike(*config), *config).ok());
}

std::vector<std::string> generate_args(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {
      "generate",     "--model",      test::model_fixture_dir("qwen2-tiny"),
      "--backend",    "cpu",          "--prompt-ids",
      "5,17,99,3",    "--max-tokens", "12",
      "--ignore-eos", "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(CliKvDtype, GenerateSaysTheKvTypeAndA16BitOneGivesAsManyTokens) {
  const CliRun fp32 = run(generate_args({}));
  ASSERT_EQ(fp32.code, kExitOk) << fp32.err;
  EXPECT_TRUE(contains(fp32.err, "on cpu, fp32 KV, loaded in")) << fp32.err;
  EXPECT_FALSE(contains(fp32.err, "KV scales")) << fp32.err;
  const CliRun bf16 = run(generate_args({"--kv-dtype", "bf16"}));
  ASSERT_EQ(bf16.code, kExitOk) << bf16.err;
  EXPECT_TRUE(contains(bf16.err, "on cpu, bf16 KV, loaded in")) << bf16.err;
  const nlohmann::json a = nlohmann::json::parse(fp32.out), b = nlohmann::json::parse(bf16.out);
  EXPECT_EQ(a["kv_dtype"], "fp32");
  EXPECT_EQ(b["kv_dtype"], "bf16");
  EXPECT_EQ(a["token_ids"].size(), 12u);
  EXPECT_EQ(b["token_ids"].size(), 12u);
}

// Needs the CPU model's fp8 K / V (e4m3 with the per-layer scales).
TEST(CliKvDtype, GenerateFp8OnTheCpuGivesAsManyTokensAndSaysTheKvType) {
  const CliRun fp8 = run(generate_args({"--kv-dtype", "fp8"}));
  ASSERT_EQ(fp8.code, kExitOk) << fp8.err;
  EXPECT_TRUE(contains(fp8.err, "on cpu, fp8 KV, loaded in")) << fp8.err;
  EXPECT_TRUE(contains(fp8.err, "kvvm generate: fp8 (e4m3) KV scales: k_scale ")) << fp8.err;
  const nlohmann::json json = nlohmann::json::parse(fp8.out);
  EXPECT_EQ(json["kv_dtype"], "fp8");
  EXPECT_EQ(json["token_ids"].size(), 12u);
}

// --kv-scales calibrate: said at start-up, the measured scales logged after the first
// prefill; refused by name for a cache that is not fp8 (the CPU default is fp32).
TEST(CliKvDtype, CalibratedScalesAreAnnouncedThenLoggedAndNeedAnFp8Cache) {
  struct Lines : Logger {
    std::string text;
    void log(LogLevel, std::string_view message) override { text += std::string(message) + "\n"; }
  } logged;
  CliRun calibrated;
  {
    const ScopedLogger scope(&logged);
    calibrated = run(generate_args({"--kv-dtype", "fp8", "--kv-scales", "calibrate"}));
  }
  ASSERT_EQ(calibrated.code, kExitOk) << calibrated.err;
  EXPECT_TRUE(contains(calibrated.err,
                       "kvvm generate: fp8 (e4m3) KV scales: measured over the first prefill"))
      << calibrated.err;
  EXPECT_TRUE(contains(logged.text, "fp8 (e4m3) KV scales: k_scale ")) << logged.text;
  EXPECT_TRUE(contains(logged.text, "(calibrated on the first prefill)")) << logged.text;
  EXPECT_EQ(nlohmann::json::parse(calibrated.out)["token_ids"].size(), 12u);
  const CliRun refused = run(generate_args({"--kv-scales", "calibrate"}));
  EXPECT_EQ(refused.code, kExitUsage) << refused.err;
  EXPECT_TRUE(contains(refused.err,
                       "--kv-scales calibrate: the KV cache is fp32; scales are for "
                       "--kv-dtype fp8"))
      << refused.err;
  const CliRun unknown = run(generate_args({"--kv-dtype", "fp8", "--kv-scales", "guess"}));
  EXPECT_EQ(unknown.code, kExitUsage) << unknown.err;
  EXPECT_TRUE(contains(unknown.err, "--kv-scales")) << unknown.err;
}

TEST(CliKvDtype, BenchEngineReportsTheKvTypeItWasGiven) {
  const auto bench = [](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        "bench",           "engine", "--model",         test::model_fixture_dir("qwen2-tiny"),
        "--backend",       "cpu",    "--load-format",   "dummy",
        "--max-context",   "32",     "--batches",       "2",
        "--prompt-tokens", "4",      "--decode-tokens", "3",
        "--no-trace",      "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    return json_of(run(args));
  };
  const nlohmann::json fp32 = bench({});
  const nlohmann::json bf16 = bench({"--kv-dtype", "bf16"});
  EXPECT_EQ(fp32["kv_dtype"], "fp32");
  EXPECT_EQ(bf16["kv_dtype"], "bf16");
  EXPECT_EQ(fp32["kv_bytes_per_token"].get<std::uint64_t>(),
            2 * bf16["kv_bytes_per_token"].get<std::uint64_t>());
  // The same budget holds at least twice the preallocated sequences of half the bytes.
  EXPECT_EQ(fp32["kv_budget"], bf16["kv_budget"]);
  EXPECT_GE(bf16["preallocated_capacity"].get<std::uint64_t>(),
            2 * fp32["preallocated_capacity"].get<std::uint64_t>());
}

// `kvvm serve --kv-dtype TYPE` in-process: the ready line and vllm:cache_config_info's
// cache_dtype say the type the KV space holds, and fp8 prints its scales. No request is sent,
// so this does not need the model's fp8 steps.
TEST(CliKvDtype, ServeStatesTheKvTypeAtStartUpAndInMetrics) {
  for (const DType dtype : {DType::kBf16, DType::kFp8}) {
    const std::string name(to_string(dtype));
    cli::ServeOptions options;
    options.model_dir = test::demo_model_dir();
    options.port = 0;
    options.backend = "cpu";
    options.max_running = 2;
    options.http_threads = 4;
    options.kv_dtype = dtype;
    options.parked_slots = 0;
    cli::ShutdownRequest shutdown;
    std::ostringstream out, err;
    int code = -1;
    std::thread serving([&] { code = cli::run_serve(options, out, err, shutdown); });
    const std::optional<std::uint16_t> port = shutdown.wait_ready(std::chrono::seconds(30));
    std::string metrics;
    if (port) {
      httplib::Client client("127.0.0.1", *port);
      client.set_read_timeout(std::chrono::seconds(10));
      auto result = client.Get("/metrics");
      if (result && result->status == 200) metrics = result->body;
    }
    shutdown.request("test");
    serving.join();
    ASSERT_TRUE(port.has_value()) << err.str();
    EXPECT_EQ(code, 0) << err.str();
    EXPECT_TRUE(
        contains(out.str(), "(cpu, KV budget 1 GiB, " + name + " KV, 3 slots, 0 of them parked)"))
        << out.str();
    EXPECT_EQ(contains(err.str(), "kvvm serve: fp8 (e4m3) KV scales: k_scale "),
              dtype == DType::kFp8)
        << err.str();
    const test::PromParse parsed = test::parse_prometheus_text(metrics);
    ASSERT_TRUE(parsed.ok()) << parsed.error << "\n" << metrics;
    const test::PromFamily* info = test::find_family(parsed.families, "vllm:cache_config_info");
    ASSERT_NE(info, nullptr) << metrics;
    ASSERT_EQ(info->samples.size(), 1u);
    EXPECT_EQ(info->samples[0].labels.at("cache_dtype"), name) << metrics;
  }
}

}  // namespace
}  // namespace kvvm::cli_kv_dtype_test
