// `kvvm bench growth`: option parsing, refusals (exit 2), and the growth table on the host
// driver with tiny sizes, whose driver-call counts must be exactly what the layout arithmetic
// predicts (every row starts from an empty pool). Timings are checked for shape only
// (present, positive): benchmarks report, tests never assert a wall-clock time.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/drivers/memory/decode_loop.h"
#include "bench/drivers/memory/growth.h"
#include "commands/info_command.h"
#include "kvvm/kv/geometry.h"
#include "kvvm/kv/layout.h"
#include "kvvm/model/kv_config.h"
#include "kvvm/vmm/cuda_driver.h"
#include "kvvm/vmm/host_driver.h"
#include "support/cli_run.h"

namespace kvvm::cli {
namespace {

using test::capture;
using test::CliRun;

BenchGrowthOptions parse_growth(const std::string& args) {
  CLI::App app("test", "kvvm");
  BenchGrowthOptions options;
  add_bench_command(app, options);
  app.parse("bench growth " + args, false);
  return options;
}

CliRun run_growth_options(const BenchGrowthOptions& options) {
  return capture(
      [&](std::ostream& out, std::ostream& err) { return run_bench_growth(options, out, err); });
}

// The tiny host configuration: qwen2.5-0.5b (12 KiB per token), 4 KiB granules, 2 sequences
// of 64 tokens, so every layout commits a few windows per fragment.
BenchGrowthOptions tiny() {
  BenchGrowthOptions options;
  options.backend = BackendChoice::kHost;
  options.host_granule = 4096;
  options.models = {"qwen2.5-0.5b"};
  options.tokens = 64;
  options.sequences = 2;
  options.ahead = 2;
  options.json = true;
  return options;
}

TEST(CliBenchOptions, DefaultsWhenNothingIsGiven) {
  const BenchGrowthOptions options = parse_growth("");
  EXPECT_EQ(options.backend, BackendChoice::kAuto);
  EXPECT_EQ(options.device, 0);
  EXPECT_EQ(options.host_granule, std::uint64_t{2} << 20);
  EXPECT_TRUE(options.models.empty());
  EXPECT_EQ(options.layout, "all");
  EXPECT_EQ(options.tokens, 4096u);
  EXPECT_EQ(options.sequences, 8u);
  EXPECT_EQ(options.ahead, 2u);
  EXPECT_EQ(options.steps, 512u);
  EXPECT_EQ(options.kernel_us, 200u);
  EXPECT_FALSE(options.json);
}

TEST(CliBenchOptions, ParsesEveryOptionAndRepeatedModels) {
  const BenchGrowthOptions options = parse_growth(
      "--backend host --device 1 --host-granule 64K --model qwen2.5-0.5b --model llama-3-8b "
      "--layout seq-major --tokens 2K --sequences 4 --ahead 3 --steps 100 --kernel-us 50 "
      "--json");
  EXPECT_EQ(options.backend, BackendChoice::kHost);
  EXPECT_EQ(options.device, 1);
  EXPECT_EQ(options.host_granule, 65536u);
  EXPECT_EQ(options.models, (std::vector<std::string>{"qwen2.5-0.5b", "llama-3-8b"}));
  EXPECT_EQ(options.layout, "seq-major");
  EXPECT_EQ(options.tokens, 2048u);
  EXPECT_EQ(options.sequences, 4u);
  EXPECT_EQ(options.ahead, 3u);
  EXPECT_EQ(options.steps, 100u);
  EXPECT_EQ(options.kernel_us, 50u);
  EXPECT_TRUE(options.json);
}

TEST(CliBenchOptions, MalformedValuesAreParseErrors) {
  for (const std::string args :
       {"--backend tpu", "--device -1", "--host-granule 2X", "--tokens abc", "--tokens -5",
        "--tokens 1.5", "--sequences 0", "--sequences many", "--ahead 0", "--ahead -1", "--steps 0",
        "--kernel-us 0", "--kernel-us 1.5", "--no-such-option"}) {
    EXPECT_THROW(parse_growth(args), CLI::ParseError) << args;
  }
  // `bench` alone needs its subcommand.
  CLI::App app("test", "kvvm");
  BenchGrowthOptions options;
  add_bench_command(app, options);
  EXPECT_THROW(app.parse("bench", false), CLI::ParseError);
}

TEST(CliBench, BadOptionsExitTwoWithTheReason) {
  const std::vector<std::pair<std::string, BenchGrowthOptions>> cases = [] {
    std::vector<std::pair<std::string, BenchGrowthOptions>> all;
    BenchGrowthOptions o = tiny();
    o.tokens = 1;
    all.emplace_back("--tokens", o);
    o = tiny();
    o.sequences = 0;
    all.emplace_back("--sequences", o);
    o = tiny();
    o.ahead = 0;
    all.emplace_back("--ahead", o);
    o = tiny();
    o.steps = 0;
    all.emplace_back("--steps", o);
    o = tiny();
    o.kernel_us = 0;
    all.emplace_back("--kernel-us", o);
    o = tiny();
    o.layout = "diagonal";
    all.emplace_back("--layout", o);
    o = tiny();
    o.models = {"gpt-9"};
    all.emplace_back("--model", o);
    o = tiny();
    o.host_granule = 1000;  // not a multiple of the page size
    all.emplace_back("--host-granule", o);
    return all;
  }();
  for (const auto& [option, options] : cases) {
    const CliRun result = run_growth_options(options);
    EXPECT_EQ(result.code, kExitUsage) << option << "\n" << result.err;
    EXPECT_NE(result.err.find(option), std::string::npos) << option << "\n" << result.err;
    EXPECT_TRUE(result.out.empty()) << option;
  }
}

// 'all' beside an unknown name used to run every built-in and drop the unknown one silently.
TEST(CliBench, AnUnknownModelBesideAllIsRefusedNamingItAndTheKnownOnes) {
  BenchGrowthOptions options = tiny();
  options.models = {"all", "nosuch"};
  options.steps = 1;
  const CliRun result = run_growth_options(options);
  EXPECT_EQ(result.code, kExitUsage) << result.err;
  EXPECT_TRUE(result.out.empty()) << result.out;
  EXPECT_NE(result.err.find("'nosuch'"), std::string::npos) << result.err;
  for (const std::string& known : model::builtin_model_names()) {
    EXPECT_NE(result.err.find(known), std::string::npos) << known << " not in: " << result.err;
  }
  // 'all' beside a built-in name runs every built-in once.
  options.models = {"qwen2.5-0.5b", "all"};
  options.layout = "token-major";
  const CliRun both = run_growth_options(options);
  ASSERT_EQ(both.code, kExitOk) << both.err;
  const nlohmann::json report = nlohmann::json::parse(both.out);
  std::multiset<std::string> models;
  for (const nlohmann::json& row : report["growth"]) {
    if (row["ahead_windows"] == 0) models.insert(row["model"].get<std::string>());
  }
  EXPECT_EQ(models.size(), model::builtin_model_names().size());
  EXPECT_EQ(models.count("qwen2.5-0.5b"), 1u);
}

TEST(CliBench, CudaWithoutAGpuIsAUsageError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is usable here";
  BenchGrowthOptions options = tiny();
  options.backend = BackendChoice::kCuda;
  EXPECT_EQ(run_growth_options(options).code, kExitUsage);
}

// ceil-windows arithmetic, independent of the arena: ensures that cross a window boundary.
std::uint64_t boundary_crossings(const LayoutPlan& plan, std::uint64_t tokens) {
  std::uint64_t crossings = 0;
  for (std::uint64_t t = 2; t <= tokens; ++t) {
    if (plan.windows_per_fragment(t) > plan.windows_per_fragment(t - 1)) ++crossings;
  }
  return crossings;
}

TEST(CliBench, HostGrowthRowsMatchTheArithmetic) {
  const BenchGrowthOptions options = tiny();
  const CliRun result = run_growth_options(options);
  ASSERT_EQ(result.code, kExitOk) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json["benchmark"], "growth");
  EXPECT_EQ(json["backend"], "host");
  EXPECT_EQ(json["granule_bytes"], 4096u);
  EXPECT_EQ(json["tokens"], 64u);
  EXPECT_EQ(json["sequences"], 2u);
  EXPECT_EQ(json["ahead_windows"], (nlohmann::json{0, 2}));

  Result<Geometry> geometry = model::builtin_geometry("qwen2.5-0.5b");
  ASSERT_TRUE(geometry.ok());
  const nlohmann::json& rows = json["growth"];
  ASSERT_EQ(rows.size(), 6u);
  std::set<std::pair<std::string, std::uint32_t>> seen;
  for (const nlohmann::json& row : rows) {
    SCOPED_TRACE(row.dump());
    seen.emplace(row["layout"].get<std::string>(), row["ahead_windows"].get<std::uint32_t>());
    ASSERT_FALSE(row["skipped"].get<bool>());
    Result<Layout> layout = parse_layout(row["layout"].get<std::string>());
    ASSERT_TRUE(layout.ok());
    Result<LayoutPlan> plan = plan_layout(*geometry, *layout, 4096, 64);
    ASSERT_TRUE(plan.ok());
    const std::uint64_t sequences = 2;
    const std::uint64_t windows = sequences * plan->commit_floor(64) / 4096;
    const std::uint64_t committing = sequences * boundary_crossings(*plan, 64);
    const nlohmann::json& calls = row["driver_calls"];

    EXPECT_EQ(row["fragments"], plan->fragments);
    EXPECT_EQ(row["memory_bytes"], sequences * plan->commit_floor(64));
    EXPECT_EQ(row["ensures"], 63u * sequences);
    EXPECT_EQ(row["committed_bytes"], sequences * plan->commit_floor(64));
    // An empty pool: one create and one map per window; commit-ahead never goes past the slot.
    EXPECT_EQ(calls["create"], windows);
    EXPECT_EQ(calls["map"], windows);
    EXPECT_EQ(calls["unmap"], 0u);
    EXPECT_EQ(calls["release"], 0u);
    if (row["ahead_windows"] == 0u) {
      EXPECT_GT(committing, 0u);
      EXPECT_EQ(row["ensures_committing"], committing);
      EXPECT_EQ(row["ahead_commits"], 0u);
      // One access change per fragment per commit: each admission and each committing ensure.
      EXPECT_EQ(calls["set_access"], plan->fragments * (sequences + committing));
    } else {
      EXPECT_LE(row["ensures_committing"].get<std::uint64_t>(), committing);
    }
    const nlohmann::json& ns = row["ensure_ns"];
    EXPECT_EQ(ns["samples"], 63u * sequences);
    for (const char* key : {"mean", "p50", "p99", "max"}) {
      EXPECT_GT(ns[key].get<double>(), 0.0) << key;
    }
    EXPECT_LE(ns["p50"].get<double>(), ns["p99"].get<double>());
    EXPECT_LE(ns["p99"].get<double>(), ns["max"].get<double>());
  }
  EXPECT_EQ(seen.size(), 6u);  // all three layouts, each with ahead 0 and 2
  EXPECT_FALSE(json["decode_loop"]["ran"].get<bool>());
  EXPECT_EQ(json["decode_loop"]["reason"], kDecodeNeedsKernels);
}

TEST(CliBench, HumanOutputIsATableWithUnitsAndTheDecodeReason) {
  BenchGrowthOptions options = tiny();
  options.json = false;
  options.layout = "token-major";
  const CliRun result = run_growth_options(options);
  ASSERT_EQ(result.code, kExitOk) << result.err;
  for (const char* part : {"kvvm bench growth: host backend", "granule 4 KiB", "token-major",
                           "qwen2.5-0.5b", "p99 ns", "mean ns", "set_access",
                           "decode loop: needs the CUDA kernels (built without nvcc or no GPU)"}) {
    EXPECT_NE(result.out.find(part), std::string::npos) << part << "\n" << result.out;
  }
}

TEST(CliBench, ACombinationThatDoesNotFitIsSkippedWithItsReason) {
  BenchGrowthOptions options = tiny();
  options.models = {"llama-3-70b"};
  options.layout = "token-major";
  options.tokens = std::uint64_t{1} << 26;  // 320 KiB per token: 20 TiB per sequence
  const CliRun result = run_growth_options(options);
  EXPECT_EQ(result.code, kExitFailure);  // nothing ran
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_EQ(json["growth"].size(), 2u);
  for (const nlohmann::json& row : json["growth"]) {
    EXPECT_TRUE(row["skipped"].get<bool>());
    EXPECT_NE(row["reason"].get<std::string>().find("needs 40 TiB"), std::string::npos)
        << row["reason"];
    EXPECT_FALSE(row.contains("ensure_ns"));  // no numbers from what did not run
  }
  EXPECT_NE(result.err.find("no model x layout combination fits"), std::string::npos) << result.err;
}

// A stand-in for the GPU's spin kernel: "runs" from launch until `microseconds` later, so the
// ensures of a step overlap it as they overlap the real kernel.
class SleepKernel {
 public:
  StepKernel kernel() {
    return {[this](std::uint64_t address, std::uint64_t bytes, std::uint32_t microseconds) {
              ++launches;
              if (fail_at != 0 && launches == fail_at) {
                return Status::DriverError("spin_reader<<<>>> failed",
                                           DriverFailure{"spin_reader", "TEST_FAILURE", 1});
              }
              EXPECT_NE(address, 0u);
              EXPECT_GT(bytes, 0u);
              done_at_ = std::chrono::steady_clock::now() + std::chrono::microseconds(microseconds);
              return Status::Ok();
            },
            [this] {
              std::this_thread::sleep_until(done_at_);
              return Status::Ok();
            }};
  }
  std::uint64_t launches = 0;
  std::uint64_t fail_at = 0;  // the launch that fails; 0: none

 private:
  std::chrono::steady_clock::time_point done_at_;
};

TEST(CliBench, DecodeLoopOnTheHostWithAStandInKernel) {
  Result<std::unique_ptr<Driver>> driver = make_host_driver(HostDriverOptions{.granule = 4096});
  ASSERT_TRUE(driver.ok()) << driver.status().to_string();
  Result<Geometry> geometry = model::builtin_geometry("qwen2.5-0.5b");
  ASSERT_TRUE(geometry.ok());
  BenchGrowthOptions options = tiny();
  options.steps = 40;
  options.kernel_us = 100;
  SleepKernel sleeper;
  Result<DecodeReport> report =
      run_decode_loop_with(**driver, *geometry, Layout::kTokenMajor, options, sleeper.kernel());
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_TRUE(report->ran);
  EXPECT_EQ(report->start_tokens, 1u);
  EXPECT_EQ(report->warmup_steps, kDecodeWarmupSteps);
  EXPECT_EQ(report->final_tokens, 1 + kDecodeWarmupSteps + 40);  // beyond --tokens 64: fine
  EXPECT_EQ(report->read_bytes, 4096u);
  EXPECT_EQ(sleeper.launches, 3 * (kDecodeWarmupSteps + 40));
  ASSERT_EQ(report->variants.size(), 3u);
  const DecodeVariant& none = report->variants[0];
  const DecodeVariant& growth = report->variants[1];
  const DecodeVariant& ahead = report->variants[2];
  EXPECT_FALSE(none.growth);
  EXPECT_EQ(none.ensures_committing, 0u);  // pre-committed: ensure never maps
  EXPECT_TRUE(growth.growth);
  EXPECT_EQ(growth.ahead_windows, 0u);
  // 12 KiB per token in 4 KiB windows: every token of every sequence crosses a window.
  EXPECT_EQ(growth.ensures_committing, 2u * 40u);
  EXPECT_EQ(growth.ahead_commits, 0u);
  EXPECT_EQ(ahead.ahead_windows, 2u);
  for (const DecodeVariant& v : report->variants) {
    EXPECT_EQ(v.step_us.samples, 40u);
    EXPECT_GE(v.step_us.p50, 100.0);  // a step lasts at least its kernel
    EXPECT_LE(v.step_us.p50, v.step_us.p99);
  }
  ASSERT_EQ(report->ratios.size(), 2u);
  EXPECT_EQ(report->ratios[0].goal, kDecodeP99Goal);
  EXPECT_EQ(report->ratios[0].met, report->ratios[0].value <= kDecodeP99Goal);
  EXPECT_FALSE(report->ratios[1].goal.has_value());
  for (const DecodeRatio& ratio : report->ratios) EXPECT_GT(ratio.value, 0.0);

  // Rendered: the variants, the ratio with its goal, units.
  BenchGrowthReport full;
  full.driver = (*driver)->info();
  full.granule = 4096;
  full.tokens = 64;
  full.sequences = 2;
  full.ahead = 2;
  full.decode = *report;
  const nlohmann::json json = nlohmann::json::parse(bench_growth_json(full).dump());
  const nlohmann::json& loop = json["decode_loop"];
  EXPECT_TRUE(loop["ran"].get<bool>());
  EXPECT_EQ(loop["model"], "qwen2.5-0.5b");
  EXPECT_EQ(loop["layout"], "token-major");
  ASSERT_EQ(loop["variants"].size(), 3u);
  EXPECT_EQ(loop["variants"][1]["ensures_committing"], 80u);
  EXPECT_EQ(loop["variants"][2]["step_us"]["samples"], 40u);
  ASSERT_EQ(loop["ratios"].size(), 2u);
  EXPECT_EQ(loop["ratios"][0]["goal"], kDecodeP99Goal);
  EXPECT_TRUE(loop["ratios"][0].contains("met"));
  EXPECT_FALSE(loop["ratios"][1].contains("goal"));
  std::ostringstream text;
  print_bench_growth(full, text);
  for (const char* part : {"decode loop: qwen2.5-0.5b token-major", "p99 us", "no growth",
                           "p99 growth ahead=2 / p99 no growth = ", "(goal <= 1.02): ",
                           "p99 growth ahead=0 / p99 no growth = "}) {
    EXPECT_NE(text.str().find(part), std::string::npos) << part << "\n" << text.str();
  }
}

TEST(CliBench, DecodeLoopFailureIsReturnedNotMeasured) {
  Result<std::unique_ptr<Driver>> driver = make_host_driver(HostDriverOptions{.granule = 4096});
  ASSERT_TRUE(driver.ok()) << driver.status().to_string();
  Result<Geometry> geometry = model::builtin_geometry("qwen2.5-0.5b");
  ASSERT_TRUE(geometry.ok());
  BenchGrowthOptions options = tiny();
  options.steps = 8;
  options.kernel_us = 10;
  SleepKernel sleeper;
  sleeper.fail_at = kDecodeWarmupSteps + 8 + 5;  // in the second variant
  Result<DecodeReport> report =
      run_decode_loop_with(**driver, *geometry, Layout::kSeqMajor, options, sleeper.kernel());
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kDriverError);
  EXPECT_NE(report.status().message().find("growth (ahead 0), step 5: launching the kernel"),
            std::string::npos)
      << report.status().to_string();
  // Nothing leaked: every arena, pool and handle was torn down.
  const HostDriverTables tables = host_driver_tables(**driver);
  EXPECT_EQ(tables.handles, 0u);
  EXPECT_EQ(tables.mappings, 0u);
  EXPECT_EQ(tables.reservations, 0u);
}

TEST(CliBench, SummaryOfASeries) {
  std::vector<double> samples;
  for (int i = 1; i <= 100; ++i) samples.push_back(i);
  const LatencySummary summary = summarize_latency(samples);
  EXPECT_EQ(summary.samples, 100u);
  EXPECT_DOUBLE_EQ(summary.mean, 50.5);
  EXPECT_DOUBLE_EQ(summary.p50, 50.5);
  EXPECT_NEAR(summary.p99, 99.01, 1e-9);
  EXPECT_DOUBLE_EQ(summary.max, 100.0);
  EXPECT_THROW(summarize_latency({}), std::invalid_argument);
}

}  // namespace
}  // namespace kvvm::cli
