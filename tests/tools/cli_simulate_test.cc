// `kvvm simulate` on the host driver: the savings it reports equal the layout arithmetic's
// prediction on a fixed trace (admissible concurrency with and without sharing; preallocate's
// capacity), malformed trace lines are reported with their line numbers while the rest still
// run, and the options, renderings and refusals behave as --help says.
#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands/simulate_command.h"
#include "kvvm/kv/geometry.h"
#include "kvvm/kv/layout.h"
#include "kvvm/model/kv_config.h"
#include "sim/baselines.h"
#include "support/cli_run.h"

namespace kvvm::cli::simulate_test {
namespace {

using test::capture;
using test::CliRun;
using test::contains;

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = kKiB * 1024;

SimulateOptions parse_simulate(const std::string& args) {
  CLI::App app("test", "kvvm");
  SimulateOptions options;
  add_simulate_command(app, options);
  app.parse("simulate " + args, false);
  return options;
}

CliRun run_simulate_options(const SimulateOptions& options) {
  return capture(
      [&](std::ostream& out, std::ostream& err) { return run_simulate(options, out, err); });
}

// A file in a fresh temporary directory, removed with the fixture.
class CliSimulate : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvvm-sim-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

// The tiny host configuration: qwen2.5-0.5b (12 KiB per token), token-major, 64 KiB granules,
// max context 256 tokens.
SimulateOptions tiny() {
  SimulateOptions options;
  options.backend = BackendChoice::kHost;
  options.host_granule = 64 * kKiB;
  options.model = "qwen2.5-0.5b";
  options.max_context = 256;
  options.budget = 16 * kMiB;
  options.generator.requests = 40;
  options.generator.rate = 50;
  options.generator.system_prompt_tokens = 64;
  return options;
}

// 60 requests of `prompt` tokens at t = 0, one output token each (it stays in the last
// window), all of one tenant whose first `prefix` tokens are shared.
std::string same_requests(std::uint64_t prompt, std::uint64_t prefix) {
  std::string text;
  for (int i = 0; i < 60; ++i) {
    text += "{\"arrival\": 0, \"prompt_tokens\": " + std::to_string(prompt) +
            ", \"output_tokens\": 1, \"prefix_group\": \"t\", \"prefix_tokens\": " +
            std::to_string(prefix) + "}\n";
  }
  return text;
}

nlohmann::json system(const nlohmann::json& report, const std::string& name) {
  for (const nlohmann::json& s : report["systems"]) {
    if (s["name"] == name) return s;
  }
  ADD_FAILURE() << "no system " << name;
  return {};
}

TEST_F(CliSimulate, SavingsEqualTheArithmeticsPrediction) {
  constexpr std::uint64_t kPrompt = 100, kPrefix = 60;
  SimulateOptions options = tiny();
  options.trace = write("same.jsonl", same_requests(kPrompt, kPrefix));
  options.json = true;
  const Geometry geometry = *model::builtin_geometry("qwen2.5-0.5b");
  const LayoutPlan plan = *plan_layout(geometry, Layout::kTokenMajor, options.host_granule, 256);
  // 101 tokens still lie in the windows of 100: growth needs no memory, so the peak is set by
  // admission alone.
  ASSERT_EQ(plan.commit_floor(kPrompt), plan.commit_floor(kPrompt + 1));
  const Concurrency expected = admissible_concurrency(plan, kPrompt, kPrefix, options.budget);
  ASSERT_GT(expected.with_sharing, expected.without_sharing);
  ASSERT_LT(expected.with_sharing, 60u);  // the trace asks for more than fits

  CliRun shared = run_simulate_options(options);
  ASSERT_EQ(shared.code, kExitOk) << shared.err;
  const nlohmann::json report = nlohmann::json::parse(shared.out);
  const nlohmann::json kvvm = system(report, "kvvm");
  EXPECT_EQ(kvvm["peak_concurrency"], expected.with_sharing);
  EXPECT_EQ(kvvm["peak_saved_bytes"], (expected.with_sharing - 1) * expected.prefix_bytes);
  EXPECT_EQ(kvvm["peak_committed_bytes"], expected.with_sharing * expected.per_sequence_bytes);
  EXPECT_EQ(kvvm["completed"], 60);
  EXPECT_GE(report["kvvm"]["shared_admissions"].get<std::uint64_t>(), expected.with_sharing - 1);

  options.sharing = false;
  CliRun plain = run_simulate_options(options);
  ASSERT_EQ(plain.code, kExitOk) << plain.err;
  const nlohmann::json plain_report = nlohmann::json::parse(plain.out);
  EXPECT_EQ(system(plain_report, "kvvm")["peak_concurrency"], expected.without_sharing);
  EXPECT_EQ(system(plain_report, "kvvm")["peak_saved_bytes"], 0);

  // Preallocate: floor(budget / (max context x bytes per token)).
  const std::uint64_t capacity =
      options.budget / (options.max_context * geometry.bytes_per_token());
  EXPECT_EQ(report["preallocate_capacity"], capacity);
  EXPECT_EQ(system(report, "preallocate")["peak_concurrency"], capacity);
  // Paged-16: ceil(100 / 16) = 7 blocks of 16 tokens per sequence.
  const std::uint64_t block = 16 * geometry.bytes_per_token();
  EXPECT_EQ(system(report, "paged-16")["peak_concurrency"], options.budget / block / 7);
}

TEST_F(CliSimulate, MalformedTraceLinesAreReportedAndTheRestStillRun) {
  SimulateOptions options = tiny();
  options.trace = write("bad.jsonl",
                        "{\"arrival\": 0, \"prompt_tokens\": 10, \"output_tokens\": 3}\n"
                        "{\"arrival\": 0.1, \"prompt_tokens\": 10\n"
                        "{\"arrival\": 0.2, \"prompt_tokens\": 10, \"output_tokens\": 3}\n"
                        "{\"arrival\": 0.3, \"prompt_tokens\": 300, \"output_tokens\": 3}\n"
                        "{\"arrival\": 0.4, \"prompt_tokens\": 10, \"output_tokens\": 3}\n");
  const CliRun result = run_simulate_options(options);
  EXPECT_EQ(result.code, kExitSkippedLines) << result.err;
  EXPECT_TRUE(contains(result.err, options.trace + ":2: not valid JSON")) << result.err;
  EXPECT_TRUE(contains(result.err, options.trace + ":4: prompt 300 + output 3 tokens exceed"))
      << result.err;
  EXPECT_TRUE(contains(result.err, "2 of 5 trace lines skipped; replaying the other 3"))
      << result.err;
  EXPECT_TRUE(contains(result.out, "3 requests")) << result.out;
  EXPECT_TRUE(contains(result.out, "2 malformed lines skipped")) << result.out;
}

TEST_F(CliSimulate, AGeneratedRunReportsEverySystemSideBySide) {
  SimulateOptions options = tiny();
  options.csv = path("series.csv");
  options.save_trace = path("trace.jsonl");
  const CliRun result = run_simulate_options(options);
  ASSERT_EQ(result.code, kExitOk) << result.err;
  for (const char* part :
       {"kvvm", "paged-16+cache", "paged-16", "preallocate", "peak concurrency", "waste",
        "saved by sharing", "driver calls", "rejected (429)", "prefix cache hit rate",
        "kvvm peak concurrency: ", "x paged-16+cache's, ", "x paged-16's, ", "x preallocate's\n",
        "kvvm mean concurrency: "}) {
    EXPECT_TRUE(contains(result.out, part)) << part << "\n" << result.out;
  }
  std::ifstream csv(options.csv);
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header.rfind("step,time_s,kvvm_running,kvvm_queued,kvvm_committed_bytes", 0), 0u)
      << header;
  EXPECT_TRUE(contains(header, "paged16_running")) << header;
  EXPECT_TRUE(contains(header, "paged16_cache_running")) << header;
  EXPECT_TRUE(contains(header, "preallocate_saved_bytes")) << header;
  std::string line;
  std::size_t rows = 0;
  while (std::getline(csv, line)) ++rows;
  EXPECT_GT(rows, 10u);

  // The saved trace replays to the same figures.
  SimulateOptions replay = tiny();
  replay.trace = options.save_trace;
  replay.json = true;
  options.json = true;
  options.csv.clear();
  options.save_trace.clear();
  const CliRun first = run_simulate_options(options), second = run_simulate_options(replay);
  ASSERT_EQ(second.code, kExitOk) << second.err;
  const nlohmann::json a = nlohmann::json::parse(first.out), b = nlohmann::json::parse(second.out);
  for (const char* system_name : {"kvvm", "paged-16+cache", "paged-16", "preallocate"}) {
    for (const char* key : {"admitted", "rejected", "peak_concurrency", "peak_committed_bytes"}) {
      EXPECT_EQ(system(a, system_name)[key], system(b, system_name)[key])
          << system_name << " " << key;
    }
  }
}

TEST_F(CliSimulate, JsonHasEveryFigure) {
  SimulateOptions options = tiny();
  options.json = true;
  const CliRun result = run_simulate_options(options);
  ASSERT_EQ(result.code, kExitOk) << result.err;
  const nlohmann::json report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["backend"], "host");
  EXPECT_EQ(report["granule_bytes"], 64 * kKiB);
  EXPECT_EQ(report["budget_bytes"], 16 * kMiB);
  ASSERT_EQ(report["systems"].size(), 4u);
  EXPECT_EQ(report["systems"][0]["name"], "kvvm");
  EXPECT_EQ(report["systems"][1]["name"], "paged-16+cache");
  EXPECT_EQ(report["systems"][2]["name"], "paged-16");
  EXPECT_EQ(report["systems"][3]["name"], "preallocate");
  EXPECT_TRUE(report["systems"][0]["prefix_cache"].is_null());
  EXPECT_GT(report["systems"][1]["prefix_cache"]["hits"].get<std::uint64_t>(), 0u);
  EXPECT_TRUE(report["systems"][2]["prefix_cache"].is_null());
  for (const nlohmann::json& s : report["systems"]) {
    EXPECT_EQ(s["requests"], 40);
    EXPECT_EQ(s["completed"].get<std::uint64_t>() + s["rejected"].get<std::uint64_t>() +
                  s["aborted"].get<std::uint64_t>(),
              40u);
  }
  EXPECT_GT(report["kvvm"]["driver_calls"]["map"].get<std::uint64_t>(), 0u);
  EXPECT_GT(report["kvvm"]["commits"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(report["trace"]["requests"], 40);
  EXPECT_EQ(report["trace"]["prefix_groups"], 4);
}

// The default run's vLLM baseline on a hand-made trace whose hits are known exactly: tenant a
// sends three requests and then tenant b two, one at a time, each of 100 prompt tokens whose
// first 64 (four blocks of 16) are the tenant's system prompt. Every request after a tenant's
// first hits its four blocks, and nothing else: the rest of each prompt is its own, and
// tenant b never hits tenant a's blocks.
TEST_F(CliSimulate, TheDefaultRunComparesWithVllmsPrefixCachingPerTenant) {
  std::string text;
  const char* tenants[] = {"a", "a", "a", "b", "b"};
  for (int i = 0; i < 5; ++i) {
    text += "{\"arrival\": " + std::to_string(i) +
            ", \"prompt_tokens\": 100, \"output_tokens\": 1, \"prefix_group\": \"" + tenants[i] +
            "\", \"prefix_tokens\": 64}\n";
  }
  SimulateOptions options = tiny();
  options.trace = write("tenants.jsonl", text);
  options.json = true;
  ASSERT_EQ(simulated_systems(options),
            (std::vector<std::string>{"kvvm", "paged-16+cache", "paged-16", "preallocate"}));
  const CliRun result = run_simulate_options(options);
  ASSERT_EQ(result.code, kExitOk) << result.err;
  const nlohmann::json report = nlohmann::json::parse(result.out);
  const nlohmann::json cache = system(report, "paged-16+cache")["prefix_cache"];
  ASSERT_TRUE(cache.is_object()) << report.dump(2);
  EXPECT_EQ(cache["hits"], 3 * 64);  // a's second and third, b's second
  EXPECT_EQ(cache["queries"], 5 * 100);
  // Full blocks entered: a tenant's first request all six of its 100 (+1) tokens', later ones
  // the two after the hit prefix.
  EXPECT_EQ(cache["published"], 6 + 2 + 2 + 6 + 2);
  EXPECT_EQ(cache["evictions"], 0);
  EXPECT_EQ(cache["saved_bytes"], 3 * 64 * 12 * kKiB);
  EXPECT_EQ(system(report, "paged-16+cache")["completed"], 5);
  EXPECT_TRUE(system(report, "paged-16")["prefix_cache"].is_null());

  // --prefix-cache off: the three systems without a prefix cache.
  options.prefix_cache = "off";
  ASSERT_EQ(simulated_systems(options),
            (std::vector<std::string>{"kvvm", "paged-16", "preallocate"}));
  const CliRun off = run_simulate_options(options);
  ASSERT_EQ(off.code, kExitOk) << off.err;
  EXPECT_EQ(nlohmann::json::parse(off.out)["systems"].size(), 3u);
}

TEST(CliSimulateOptions, WhichSystemsRun) {
  using Names = std::vector<std::string>;
  EXPECT_EQ(simulated_systems(parse_simulate("")),
            (Names{"kvvm", "paged-16+cache", "paged-16", "preallocate"}));
  EXPECT_EQ(simulated_systems(parse_simulate("--prefix-cache off")),
            (Names{"kvvm", "paged-16", "preallocate"}));
  const Names all{"kvvm", "kvvm+cache", "paged-16+cache", "paged-16", "preallocate"};
  EXPECT_EQ(simulated_systems(parse_simulate("--prefix-cache on")), all);
  EXPECT_EQ(simulated_systems(parse_simulate("--conversations 10")), all);
  // A JSONL trace replays open loop: kvvm+cache only when asked for (and a trace excludes
  // --conversations).
  EXPECT_EQ(simulated_systems(parse_simulate("--trace t.jsonl")),
            (Names{"kvvm", "paged-16+cache", "paged-16", "preallocate"}));
  EXPECT_EQ(simulated_systems(parse_simulate("--conversations 10 --prefix-cache off")),
            (Names{"kvvm", "paged-16", "preallocate"}));
}

TEST_F(CliSimulate, PlotNamesTheDebianPackageWhenGnuplotIsMissing) {
  SimulateOptions options = tiny();
  options.plot = path("plot.png");
  options.gnuplot = path("no-such-gnuplot");
  const CliRun result = run_simulate_options(options);
  EXPECT_EQ(result.code, kExitUsage);
  EXPECT_TRUE(contains(result.err, "gnuplot-nox")) << result.err;
}

TEST_F(CliSimulate, PlotDrawsAPngWithGnuplot) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "gnuplot is not installed (Debian: gnuplot-nox)";
  }
  SimulateOptions options = tiny();
  options.plot = path("plot.png");
  const CliRun result = run_simulate_options(options);
  ASSERT_EQ(result.code, kExitOk) << result.err;
  std::ifstream png(options.plot, std::ios::binary);
  char magic[4] = {};
  png.read(magic, 4);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
}

TEST_F(CliSimulate, RefusesWhatMakesNoSense) {
  const auto refused = [](SimulateOptions options, const std::string& why) {
    const CliRun result = run_simulate_options(options);
    EXPECT_EQ(result.code, kExitUsage) << why << ": " << result.err;
    EXPECT_TRUE(contains(result.err, why)) << result.err;
  };
  SimulateOptions options = tiny();
  options.step_ms = 0;
  refused(options, "--step-ms");
  options = tiny();
  options.trace = path("missing.jsonl");
  refused(options, "cannot open");
  options = tiny();
  options.model = "gpt-9";
  refused(options, "--model");
  options = tiny();
  options.layout = "diagonal";
  refused(options, "--layout");
  options = tiny();
  options.budget = 0;
  refused(options, "--budget");
  options = tiny();
  options.generator.system_prompt_tokens = 255;
  refused(options, "--system-prompt-tokens");
  options = tiny();
  options.trace = write("empty.jsonl", "\n");
  refused(options, "no request");
}

TEST(CliSimulateOptions, DefaultsAndEveryOption) {
  const SimulateOptions defaults = parse_simulate("");
  EXPECT_EQ(defaults.backend, BackendChoice::kAuto);
  EXPECT_EQ(defaults.model, "llama-3-8b");
  EXPECT_EQ(defaults.layout, "token-major");
  EXPECT_EQ(defaults.budget, std::uint64_t{40} << 30);
  EXPECT_EQ(defaults.max_context, 8192u);
  EXPECT_EQ(defaults.host_granule, 2 * kMiB);
  EXPECT_TRUE(defaults.sharing);
  EXPECT_EQ(defaults.commit_ahead, 0u);
  EXPECT_FALSE(defaults.generator.duration_s.has_value());

  const SimulateOptions all = parse_simulate(
      "--backend host --device 1 --host-granule 4M --model qwen2.5-14b --dtype fp8 "
      "--layout seq-major --budget 80G --max-context 32K "
      "--duration 60 --rate 12.5 --tenants 8 --system-prompt-tokens 1K --prompt-mu 5 "
      "--prompt-sigma 0.5 --output-mu 6 --output-sigma 0.7 --seed 9 --step-ms 20 "
      "--max-queue-wait 5 --no-sharing --commit-ahead 2 --pool 128M --max-slots 64 --json "
      "--csv s.csv --plot p.png --save-trace out.jsonl --progress");
  EXPECT_EQ(all.backend, BackendChoice::kHost);
  EXPECT_EQ(all.device, 1);
  EXPECT_EQ(all.host_granule, 4 * kMiB);
  EXPECT_EQ(all.model, "qwen2.5-14b");
  EXPECT_EQ(all.dtype, "fp8");
  EXPECT_EQ(all.layout, "seq-major");
  EXPECT_EQ(all.budget, std::uint64_t{80} << 30);
  EXPECT_EQ(all.max_context, 32768u);
  EXPECT_EQ(all.generator.duration_s, 60.0);
  EXPECT_EQ(all.generator.rate, 12.5);
  EXPECT_EQ(all.generator.tenants, 8u);
  EXPECT_EQ(all.generator.system_prompt_tokens, 1024u);
  EXPECT_EQ(all.generator.prompt_mu, 5.0);
  EXPECT_EQ(all.generator.prompt_sigma, 0.5);
  EXPECT_EQ(all.generator.output_mu, 6.0);
  EXPECT_EQ(all.generator.output_sigma, 0.7);
  EXPECT_EQ(all.generator.seed, 9u);
  EXPECT_EQ(all.step_ms, 20.0);
  EXPECT_EQ(all.max_queue_wait_s, 5.0);
  EXPECT_FALSE(all.sharing);
  EXPECT_EQ(all.commit_ahead, 2u);
  EXPECT_EQ(all.pool_bytes, 128 * kMiB);
  EXPECT_EQ(all.max_slots, 64u);
  EXPECT_TRUE(all.json);
  EXPECT_EQ(all.csv, "s.csv");
  EXPECT_EQ(all.plot, "p.png");
  EXPECT_EQ(all.save_trace, "out.jsonl");
  EXPECT_TRUE(all.progress);
  // The options that exclude those above (a trace replaces the generator; a count and a
  // duration each say how many requests to make).
  EXPECT_EQ(parse_simulate("--trace t.jsonl").trace, "t.jsonl");
  EXPECT_EQ(parse_simulate("--requests 10").generator.requests, 10u);
}

// The multi-turn trace on llama-3-8b with 2 MiB host granules (windows of 16 tokens, as
// paged-16's blocks): five systems, kvvm+cache's hits within a window per conversation turn of
// the vLLM-style baseline's.
TEST_F(CliSimulate, AMultiTurnRunComparesKvvmsCacheWithTheVllmStyleBaseline) {
  SimulateOptions options;
  options.backend = BackendChoice::kHost;
  options.max_context = 1024;
  options.budget = 256 * kMiB;
  options.chat.conversations = 12;
  options.chat.turns = 4;
  options.chat.think_s = 1;
  options.generator.rate = 2;
  options.generator.tenants = 2;
  options.generator.system_prompt_tokens = 64;
  options.generator.prompt_mu = std::log(30.0);
  options.generator.output_mu = std::log(20.0);
  options.json = true;
  options.csv = path("series.csv");
  const CliRun result = run_simulate_options(options);
  ASSERT_EQ(result.code, kExitOk) << result.err;
  const nlohmann::json report = nlohmann::json::parse(result.out);
  ASSERT_EQ(report["systems"].size(), 5u);
  const nlohmann::json kvvm = system(report, "kvvm+cache");
  const nlohmann::json paged = system(report, "paged-16+cache");
  EXPECT_TRUE(system(report, "kvvm")["prefix_cache"].is_null());
  const auto hits = [](const nlohmann::json& s) {
    return s["prefix_cache"]["hits"].get<std::uint64_t>();
  };
  EXPECT_GT(hits(paged), 0u);
  EXPECT_EQ(kvvm["prefix_cache"]["queries"], paged["prefix_cache"]["queries"]);
  const std::uint64_t turns = kvvm["admitted"].get<std::uint64_t>();
  EXPECT_LE(std::max(hits(kvvm), hits(paged)) - std::min(hits(kvvm), hits(paged)), 16 * turns);
  EXPECT_EQ(kvvm["completed"], paged["completed"]);
  EXPECT_TRUE(report.contains("kvvm_cache"));
  std::ifstream csv(options.csv);
  std::string header;
  std::getline(csv, header);
  EXPECT_TRUE(contains(header, "kvvm_cache_running")) << header;
  EXPECT_TRUE(contains(header, "paged16_cache_saved_bytes")) << header;

  // The text names what it compares.
  options.json = false;
  options.csv.clear();
  const CliRun text = run_simulate_options(options);
  ASSERT_EQ(text.code, kExitOk) << text.err;
  for (const char* part : {"multi-turn chat, 12 conversations x 4 turns", "hit rate",
                           "kvvm+cache vs paged-16+cache: hit tokens"}) {
    EXPECT_TRUE(contains(text.out, part)) << part << "\n" << text.out;
  }
}

TEST(CliSimulateOptions, MultiTurnOptions) {
  const SimulateOptions defaults = parse_simulate("");
  EXPECT_EQ(defaults.chat.conversations, 0u);
  EXPECT_EQ(defaults.prefix_cache, "auto");
  const SimulateOptions chat =
      parse_simulate("--conversations 100 --turns 6 --think-s 2.5 --prefix-cache off");
  EXPECT_EQ(chat.chat.conversations, 100u);
  EXPECT_EQ(chat.chat.turns, 6u);
  EXPECT_EQ(chat.chat.think_s, 2.5);
  EXPECT_EQ(chat.prefix_cache, "off");
  EXPECT_THROW(parse_simulate("--prefix-cache maybe"), CLI::ParseError);
}

TEST(CliSimulateOptions, MalformedValuesAreParseErrors) {
  for (const std::string args : {"--budget 4X", "--max-context 1.5", "--backend tpu",
                                 "--requests many", "--rate fast", "--host-granule -1"}) {
    EXPECT_THROW(parse_simulate(args), CLI::ParseError) << args;
  }
}

}  // namespace
}  // namespace kvvm::cli::simulate_test
