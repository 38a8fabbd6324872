// `kvvm bench engine --offline` on the CPU: every request of each INPUT/OUTPUT pair (or of a
// dataset file) answered with exactly its output tokens, the figures consistent with each other
// (tokens over seconds, latency above the first token), the running limit from the KV budget
// when not given, and bad lengths or files refused by name.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kit/cli_common.h"
#include "support/cli_run.h"
#include "support/test_data.h"

namespace kvvm::cli::bench_offline_test {
namespace {

using test::contains;
using test::run;

std::vector<std::string> offline_args(std::vector<std::string> extra) {
  std::vector<std::string> args = {
      "bench",     "engine", "--model",     test::model_fixture_dir("qwen3-tiny"),
      "--backend", "cpu",    "--no-decode", "--no-trace",
      "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(CliBenchOffline, EveryRequestRunsToItsOutputLengthAndTheFiguresAgree) {
  const test::CliRun bench = run(offline_args({"--offline", "12/9,30/4", "--offline-requests", "7",
                                               "--kv-budget", "16MiB", "--offline-warmup", "2"}));
  ASSERT_EQ(bench.code, kExitOk) << bench.err;
  const nlohmann::json report = nlohmann::json::parse(bench.out);
  ASSERT_EQ(report["offline"].size(), 2u);
  const nlohmann::json& a = report["offline"][0];
  EXPECT_EQ(a["lengths"], "12/9");
  EXPECT_EQ(a["requests"], 7);
  EXPECT_EQ(a["input_tokens"], 7 * 12);
  EXPECT_EQ(a["output_tokens"], 7 * 9);
  EXPECT_EQ(a["warmup_requests"], 2);
  EXPECT_EQ(report["offline"][1]["output_tokens"], 7 * 4);
  for (const nlohmann::json& r : report["offline"]) {
    const double seconds = r["seconds"].get<double>();
    ASSERT_GT(seconds, 0);
    EXPECT_NEAR(r["output_tokens_per_s"].get<double>(), r["output_tokens"].get<double>() / seconds,
                1e-6 * r["output_tokens_per_s"].get<double>());
    EXPECT_NEAR(r["total_tokens_per_s"].get<double>(),
                (r["output_tokens"].get<double>() + r["input_tokens"].get<double>()) / seconds,
                1e-6 * r["total_tokens_per_s"].get<double>());
    EXPECT_NEAR(r["requests_per_s"].get<double>(), 7 / seconds, 1e-6 * 7 / seconds);
    EXPECT_LE(r["ttft_p50_s"].get<double>(), r["latency_p50_s"].get<double>());
    EXPECT_LE(r["latency_p50_s"].get<double>(), r["latency_p99_s"].get<double>());
    EXPECT_LE(r["latency_p99_s"].get<double>(), seconds + 1e-9);
    // 16 MiB holds every request at once: nothing waits for a place.
    EXPECT_EQ(r["max_running"], 7);
    EXPECT_EQ(r["peak_running"], 7);
    EXPECT_EQ(r["preemptions"], 0);
  }
  const test::CliRun text = run(offline_args({"--offline", "12/9", "--offline-requests", "3"}));
  ASSERT_EQ(text.code, kExitOk) << text.err;
}

// A draft model (here the model itself: every proposal kept) and n-gram lookup: the same output
// tokens in fewer steps, the proposals counted in the report; a draft of another vocabulary is
// refused by name.
TEST(CliBenchOffline, SpeculationIsCountedAndSavesSteps) {
  const std::vector<std::string> lengths = {"--offline",        "12/24", "--offline-requests", "6",
                                            "--offline-warmup", "1"};
  const auto bench = [&](const std::string& config) {
    std::vector<std::string> extra = lengths;
    if (!config.empty()) extra.insert(extra.end(), {"--speculative-config", config});
    const test::CliRun r = run(offline_args(extra));
    EXPECT_EQ(r.code, kExitOk) << r.err;
    return r.code == kExitOk ? nlohmann::json::parse(r.out)["offline"][0] : nlohmann::json();
  };
  const nlohmann::json plain = bench("");
  const nlohmann::json drafted = bench(R"({"model": ")" + test::model_fixture_dir("qwen3-tiny") +
                                       R"(", "num_speculative_tokens": 3})");
  ASSERT_FALSE(plain.is_null());
  ASSERT_FALSE(drafted.is_null());
  EXPECT_FALSE(plain.contains("speculative"));
  EXPECT_EQ(drafted["output_tokens"], plain["output_tokens"]);
  ASSERT_TRUE(drafted.contains("speculative"));
  const nlohmann::json& s = drafted["speculative"];
  EXPECT_GT(s["draft_tokens"].get<int>(), 0);
  EXPECT_EQ(s["accepted_tokens"], s["draft_tokens"]) << "the model as its own draft";
  EXPECT_LT(drafted["steps"].get<int>(), plain["steps"].get<int>());

  const test::CliRun refused =
      run(offline_args({"--offline", "12/4", "--speculative-config",
                        R"({"model": ")" + test::model_fixture_dir("llama-tiny") +
                            R"(", "num_speculative_tokens": 2})"}));
  EXPECT_EQ(refused.code, kExitUsage) << refused.err;
  EXPECT_TRUE(contains(refused.err, "vocab_size 1024, the model's is 676")) << refused.err;
}

TEST(CliBenchOffline, TheKvBudgetSetsTheRunningLimit) {
  // The tiny model's float32 KV: 2 KiB a token; 40 + 24 tokens a request, 128 KiB each; a
  // budget of 512 KiB holds 4 of them at once.
  const test::CliRun bench = run(
      offline_args({"--offline", "40/24", "--offline-requests", "10", "--kv-budget", "512KiB"}));
  ASSERT_EQ(bench.code, kExitOk) << bench.err;
  const nlohmann::json run0 = nlohmann::json::parse(bench.out)["offline"][0];
  EXPECT_EQ(run0["max_running"], 4);
  EXPECT_LE(run0["peak_running"].get<int>(), 4);
  EXPECT_EQ(run0["output_tokens"], 10 * 24);
  const test::CliRun given =
      run(offline_args({"--offline", "40/24", "--offline-requests", "10", "--kv-budget", "512KiB",
                        "--offline-max-running", "2"}));
  ASSERT_EQ(given.code, kExitOk) << given.err;
  EXPECT_EQ(nlohmann::json::parse(given.out)["offline"][0]["peak_running"], 2);
}

TEST(CliBenchOffline, ADatasetFileIsOneRunOfItsLines) {
  const std::filesystem::path file = test::scratch_dir("kvvm_bench_offline") / "lengths.txt";
  std::ofstream(file) << "# input output\n10 20\n30,5\n\n7/7\n";
  const test::CliRun bench =
      run(offline_args({"--offline-dataset", file.string(), "--offline-warmup", "0"}));
  ASSERT_EQ(bench.code, kExitOk) << bench.err;
  const nlohmann::json r = nlohmann::json::parse(bench.out)["offline"][0];
  EXPECT_EQ(r["lengths"], "lengths.txt");
  EXPECT_EQ(r["requests"], 3);
  EXPECT_EQ(r["input_tokens"], 47);
  EXPECT_EQ(r["output_tokens"], 32);

  std::ofstream(file) << "10 20\n30 x\n";
  const test::CliRun bad = run(offline_args({"--offline-dataset", file.string()}));
  EXPECT_EQ(bad.code, kExitUsage) << bad.err;
  EXPECT_TRUE(contains(bad.err, "line 2")) << bad.err;
}

TEST(CliBenchOffline, BadLengthsAreRefusedByName) {
  for (const char* lengths : {"128", "128/0", "a/b", "128/128,", "1/2/3"}) {
    const test::CliRun bad = run(offline_args({"--offline", lengths}));
    EXPECT_EQ(bad.code, kExitUsage) << lengths << ": " << bad.err;
    EXPECT_TRUE(contains(bad.err, "--offline")) << bad.err;
  }
  const test::CliRun too_long = run(offline_args({"--offline", "500/100", "--max-context", "512"}));
  EXPECT_NE(too_long.code, kExitOk);
  EXPECT_TRUE(contains(too_long.err, "does not fit in --max-context 512")) << too_long.err;
  const test::CliRun nothing = run(offline_args({}));
  EXPECT_EQ(nothing.code, kExitUsage) << nothing.err;
  EXPECT_TRUE(contains(nothing.err, "leave nothing to run")) << nothing.err;
}

}  // namespace
}  // namespace kvvm::cli::bench_offline_test
