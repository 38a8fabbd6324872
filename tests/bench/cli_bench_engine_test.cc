// `kvvm bench engine` through run_cli on the CPU with the tiny Qwen2 fixture, at tiny sizes:
// the JSON's figures are sane and add up, graphs are reported as skipped on the CPU, the SVG
// chart is written and well formed, and bad options are refused naming the value.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "app.h"
#include "bench/drivers/engine/engine.h"
#include "kit/cli_common.h"
#include "kit/svg_plot.h"
#include "support/cli_run.h"
#include "support/test_data.h"

namespace kvvm::cli {
namespace {

using ordered_json = nlohmann::ordered_json;

using test::CliRun;
using test::contains;
using test::run;

std::vector<std::string> bench_args(std::vector<std::string> extra) {
  std::vector<std::string> args = {
      "bench",     "engine", "--model",       test::model_fixture_dir("qwen2-tiny"),
      "--backend", "cpu",    "--max-context", "48"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

constexpr int kPromptTokens = 8, kDecodeTokens = 4, kRequests = 6;

// Whether every tag opened in `svg` is closed in order (no attribute holds '<' or '>': they
// are escaped), and the document is one <svg> element.
bool well_formed(const std::string& svg) {
  std::vector<std::string> open;
  int roots = 0;
  for (std::size_t at = svg.find('<'); at != std::string::npos; at = svg.find('<', at + 1)) {
    const std::size_t end = svg.find('>', at);
    if (end == std::string::npos) return false;
    const std::string tag = svg.substr(at + 1, end - at - 1);
    if (tag.empty()) return false;
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return false;
      open.pop_back();
    } else if (tag.back() != '/') {
      if (open.empty()) ++roots;
      open.push_back(tag.substr(0, tag.find(' ')));
    } else if (open.empty()) {
      return false;  // a self-closed element outside the root
    }
  }
  return open.empty() && roots == 1 && svg.rfind("<svg", 0) == 0;
}

// One full run shared by the tests that read its report (the model loads once).
class CliBenchEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    plot_ = (std::filesystem::temp_directory_path() /
             ("kvvm-bench-engine-" + std::to_string(::getpid()) + ".svg"))
                .string();
    result_ = new CliRun(run(bench_args(
        {"--batches", "1,2", "--prompt-tokens", std::to_string(kPromptTokens), "--decode-tokens",
         std::to_string(kDecodeTokens), "--rates", "20,80", "--requests", std::to_string(kRequests),
         "--tenants", "2", "--system-prompt-tokens", "16", "--json", "--plot", plot_})));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(plot_);
    delete result_;
  }
  static ordered_json report() {
    EXPECT_EQ(result_->code, kExitOk) << result_->err;
    return ordered_json::parse(result_->out);
  }
  static CliRun* result_;
  static std::string plot_;
};
CliRun* CliBenchEngine::result_ = nullptr;
std::string CliBenchEngine::plot_;

TEST_F(CliBenchEngine, ReportsTheRunInOrderedKeys) {
  const ordered_json r = report();
  std::vector<std::string> keys;
  for (const auto& [key, value] : r.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "model", "architecture", "backend", "layers", "vocab_size", "max_context",
                      "kv_budget", "kv_dtype", "kv_bytes_per_token", "preallocated_capacity",
                      "max_running", "weights", "decode", "trace", "wall_seconds"}));
  EXPECT_EQ(r["backend"], "cpu");
  EXPECT_EQ(r["architecture"], "Qwen2ForCausalLM");
  EXPECT_EQ(r["max_context"], 48);
  // Qwen2-tiny on the CPU: 2 layers x 1 KV head x 64 dims x K and V x fp32; the host's 1 GiB.
  EXPECT_EQ(r["kv_dtype"], "fp32");
  EXPECT_EQ(r["kv_bytes_per_token"], 2 * 1 * 64 * 2 * 4);
  EXPECT_EQ(r["kv_budget"], std::uint64_t{1} << 30);
  EXPECT_EQ(r["preallocated_capacity"], (std::uint64_t{1} << 30) / (48 * 1024));
  EXPECT_TRUE(contains(result_->err, "decode, batch 2, eager")) << result_->err;
}

TEST_F(CliBenchEngine, DecodeRunsEveryModeAndSkipsGraphsOnTheCpu) {
  const ordered_json decode = report()["decode"];
  ASSERT_EQ(decode["runs"].size(), 6u);  // 2 batches x 3 modes
  std::set<std::string> modes;
  for (const ordered_json& run : decode["runs"]) {
    modes.insert(run["mode"].get<std::string>());
    const int batch = run["batch"];
    if (run["mode"] == "graphs") {
      EXPECT_TRUE(contains(run["skipped"].get<std::string>(), "CUDA")) << run;
      EXPECT_FALSE(run.contains("decode_tokens_per_s"));
      continue;
    }
    EXPECT_FALSE(run.contains("skipped")) << run;
    EXPECT_GT(run["decode_tokens_per_s"].get<double>(), 0) << run;
    EXPECT_GT(run["ms_per_step"].get<double>(), 0) << run;
    // Every sequence gives its first token in the prefill step (the prompts fit one step), then
    // one token per decode step: the prefill's tokens are not in the decode figures.
    EXPECT_EQ(run["generated_tokens"], batch * kDecodeTokens) << run;
    EXPECT_EQ(run["decode_tokens"], batch * (kDecodeTokens - 1)) << run;
    EXPECT_EQ(run["decode_steps"], kDecodeTokens - 1) << run;
    EXPECT_EQ(run["peak_running"], batch) << run;
    const double per_step = run["decode_seconds"].get<double>() * 1000 / (kDecodeTokens - 1);
    EXPECT_NEAR(run["ms_per_step"].get<double>(), per_step, 1e-9 + per_step * 1e-9);
    // Equal prompts and lengths: every sequence ends in the window's last step, and the steps
    // before it end none; the two parts are each step's own time, within the window's.
    EXPECT_EQ(run["retiring_steps"], 1) << run;
    const double running = run["ms_per_running_step"].get<double>();
    const double retiring = run["retiring_ms"].get<double>();
    EXPECT_GT(running, 0) << run;
    EXPECT_GT(retiring, 0) << run;
    EXPECT_LE(running * (kDecodeTokens - 2) + retiring, per_step * (kDecodeTokens - 1) + 1e-6)
        << run;
  }
  EXPECT_EQ(modes, (std::set<std::string>{"graphs", "eager", "preallocated"}));
}

TEST_F(CliBenchEngine, TraceCountsAddUpForBothSystems) {
  const ordered_json trace = report()["trace"];
  ASSERT_EQ(trace["runs"].size(), 4u);  // 2 rates x (arena, preallocated)
  std::uint64_t hits = 0;
  for (const ordered_json& run : trace["runs"]) {
    const std::uint64_t submitted = run["submitted"];
    EXPECT_EQ(submitted + run["not_submitted"].get<std::uint64_t>(), kRequests) << run;
    EXPECT_EQ(run["completed"].get<std::uint64_t>() +
                  run["refused_overloaded"].get<std::uint64_t>() +
                  run["cancelled"].get<std::uint64_t>() + run["failed"].get<std::uint64_t>(),
              submitted)
        << run;
    EXPECT_LE(run["refused_at_arrival"].get<std::uint64_t>(),
              run["refused_overloaded"].get<std::uint64_t>())
        << run;
    EXPECT_EQ(run["failed"], 0) << run;
    EXPECT_EQ(run["completed"], kRequests) << run;  // no limit, a short queue: all finish
    EXPECT_GT(run["output_tokens"].get<std::uint64_t>(), 0u) << run;
    EXPECT_GT(run["output_tokens_per_s"].get<double>(), 0) << run;
    // The loaded window (steady_rate.h) is in order; six requests keep the engine loaded for
    // well under its least second.
    EXPECT_LE(run["steady_start_s"].get<double>(), run["steady_end_s"].get<double>()) << run;
    EXPECT_EQ(run["steady_output_tokens_per_s"].get<double>(), 0.0) << run;
    EXPECT_LE(run["ttft_p50_s"].get<double>(), run["ttft_p99_s"].get<double>()) << run;
    EXPECT_LE(run["tpot_p50_s"].get<double>(), run["tpot_p99_s"].get<double>()) << run;
    EXPECT_GT(run["ttft_p50_s"].get<double>(), 0) << run;
    EXPECT_GE(run["peak_running"].get<int>(), 1) << run;
    // The KV's driver calls during the replay: the host driver maps every committed window.
    EXPECT_GT(run["kv_map_calls"].get<std::uint64_t>(), 0u) << run;
    EXPECT_GT(run["kv_map_seconds"].get<double>(), 0.0) << run;
    EXPECT_GE(run["kv_unmap_seconds"].get<double>(), 0.0) << run;
    EXPECT_LE(run["reused_admissions"].get<std::uint64_t>(), kRequests) << run;
    // A request that found its tenant's prompt cached was admitted sharing it (the
    // preallocated engine copies instead: none), and the host's fences complete when recorded.
    const std::uint64_t shared = run["shared_admissions"];
    if (run["system"] == "arena") {
      EXPECT_EQ(shared > 0, run["prefix_hit_tokens"].get<std::uint64_t>() > 0) << run;
    } else {
      EXPECT_EQ(shared, 0u) << run;
    }
    EXPECT_EQ(run["reuse_fence_pending"], 0) << run;
    EXPECT_LE(run["prefix_kept_reclaims"].get<std::uint64_t>(), shared) << run;
    hits += run["prefix_hit_tokens"].get<std::uint64_t>();
  }
  EXPECT_EQ(trace["runs"][0]["system"], "arena");
  EXPECT_EQ(trace["runs"][1]["system"], "preallocated");
  EXPECT_EQ(trace["runs"][0]["rate"], 20.0);
  // Six requests of two tenants: some tenant's system prompt is found in the cache.
  EXPECT_GT(hits, 0u);
}

TEST_F(CliBenchEngine, WritesAWellFormedSvgChart) {
  ASSERT_EQ(result_->code, kExitOk) << result_->err;
  std::ifstream in(plot_);
  ASSERT_TRUE(in) << plot_;
  std::stringstream text;
  text << in.rdbuf();
  const std::string svg = text.str();
  EXPECT_TRUE(well_formed(svg)) << svg;
  EXPECT_TRUE(contains(svg, "xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_TRUE(contains(svg, ">arena<"));
  EXPECT_TRUE(contains(svg, ">preallocated<"));
  // One line per system, through both rates.
  std::size_t lines = 0;
  for (std::size_t at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1)) {
    ++lines;
    const std::size_t points = svg.find("points=\"", at);
    const std::string list = svg.substr(points + 8, svg.find('"', points + 8) - points - 8);
    EXPECT_NE(list.find(' '), std::string::npos) << list;  // two points
  }
  EXPECT_EQ(lines, 2u);
}

TEST(SvgPlot, EscapesTextAndIsWellFormedWithoutPoints) {
  SvgChart chart{"a <b> & \"c\"", "x", "y", {{"s<1>", "red", {}}}};
  const std::string svg = render_svg_line_chart(chart);
  EXPECT_TRUE(well_formed(svg)) << svg;
  EXPECT_TRUE(contains(svg, "a &lt;b&gt; &amp; &quot;c&quot;"));
  EXPECT_TRUE(contains(svg, "s&lt;1&gt;"));
}

TEST(CliBenchEngineText, SaysGraphsAreSkippedOnTheCpu) {
  const CliRun r = run(
      bench_args({"--no-trace", "--batches", "1", "--prompt-tokens", "4", "--decode-tokens", "2"}));
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(contains(r.out, "skipped: CUDA graphs need the CUDA backend")) << r.out;
  EXPECT_TRUE(contains(r.out, "preallocated")) << r.out;
  EXPECT_FALSE(contains(r.out, "Trace replay")) << r.out;
}

TEST(CliBenchEngineChoices, ForkHoldsThePromptOnceAndLogprobsRunBesideGraphs) {
  const CliRun r = run(bench_args(
      {"--no-trace", "--batches", "2", "--prompt-tokens", "8", "--decode-tokens", "4", "--logprobs",
       "5", "--choices", "3", "--choices-prompt-tokens", "40", "--choices-tokens", "4", "--json"}));
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const ordered_json report = ordered_json::parse(r.out);
  std::set<std::string> modes;
  for (const ordered_json& run : report["decode"]["runs"]) {
    modes.insert(run["mode"].get<std::string>());
    if (run["mode"] == "logprobs 5") {
      EXPECT_EQ(run["decode_tokens"], 2 * (4 - 1)) << run;
      EXPECT_GT(run["decode_tokens_per_s"].get<double>(), 0) << run;
    }
  }
  EXPECT_TRUE(modes.contains("logprobs 5")) << report["decode"];
  EXPECT_EQ(report["decode"]["logprobs"], 5);
  const ordered_json& runs = report["choices"]["runs"];
  ASSERT_EQ(runs.size(), 2u) << report;
  EXPECT_EQ(runs[0]["system"], "fork");
  EXPECT_EQ(runs[1]["system"], "requests");
  for (const ordered_json& run : runs) {
    EXPECT_EQ(run["n"], 3);
    EXPECT_EQ(run["generated_tokens"], 3 * 4) << run;
    EXPECT_GT(run["seconds"].get<double>(), 0) << run;
  }
  EXPECT_EQ(runs[0]["forks"], 2);
  EXPECT_EQ(runs[1]["forks"], 0);
  // The 40-token prompt held once by the fork, three times by the requests (admitted together,
  // none found the others' prompt cached).
  EXPECT_LT(runs[0]["peak_kv_bytes"].get<double>(), 0.6 * runs[1]["peak_kv_bytes"].get<double>())
      << runs;
}

TEST(CliBenchEngineOptions, TraceSystemsChooseTheReplaysAndTheirOrder) {
  const CliRun r = run(bench_args({"--no-decode", "--rates", "40", "--requests", "3", "--tenants",
                                   "1", "--system-prompt-tokens", "16", "--trace-systems",
                                   "preallocated,arena", "--json"}));
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const ordered_json runs = ordered_json::parse(r.out)["trace"]["runs"];
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0]["system"], "preallocated");
  EXPECT_EQ(runs[1]["system"], "arena");
  // By default the arena parks as many slots as run, and the queue waits as kvvm serve's.
  const ordered_json defaults = ordered_json::parse(r.out);
  EXPECT_EQ(defaults["trace"]["parked_slots"], defaults["max_running"]);
  EXPECT_EQ(defaults["trace"]["max_queue_wait_s"], 30.0);
  const CliRun one =
      run(bench_args({"--no-decode", "--rates",          "40",    "--requests",
                      "3",           "--tenants",        "1",     "--system-prompt-tokens",
                      "16",          "--trace-systems",  "arena", "--parked-slots",
                      "0",           "--max-queue-wait", "2.5",   "--tpot-target-ms",
                      "50",          "--ttft-target-ms", "500",   "--json"}));
  ASSERT_EQ(one.code, kExitOk) << one.err;
  const ordered_json chosen = ordered_json::parse(one.out);
  EXPECT_EQ(chosen["trace"]["parked_slots"], 0);
  EXPECT_EQ(chosen["trace"]["max_queue_wait_s"], 2.5);
  const ordered_json alone = chosen["trace"]["runs"];
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_EQ(alone[0]["system"], "arena");
}

TEST(CliBenchEngineOptions, RefusesBadValuesNamingThem) {
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> named;
  };
  const Case cases[] = {
      {{"--batches", "1,0"}, {"--batches", "'0'"}},
      {{"--batches", "1,,2"}, {"--batches", "1,,2"}},
      {{"--rates", "1,fast"}, {"--rates", "fast"}},
      {{"--rates", "-2"}, {"--rates", "-2"}},
      {{"--decode-tokens", "1"}, {"--decode-tokens", "1"}},
      {{"--prompt-tokens", "40", "--decode-tokens", "20"}, {"60", "--max-context 48"}},
      {{"--kv-budget", "12Q"}, {"--kv-budget", "12Q"}},
      {{"--system-prompt-tokens", "48", "--no-decode"}, {"--system-prompt-tokens 48"}},
      {{"--no-trace", "--plot", "x.svg"}, {"--plot", "--no-trace"}},
      {{"--choices", "1", "--no-decode"}, {"--choices 1"}},
      {{"--choices", "3", "--choices-prompt-tokens", "46", "--choices-tokens", "4", "--no-decode"},
       {"--choices-prompt-tokens 46", "--max-context 48"}},
      {{"--logprobs", "21"}, {"--logprobs", "21"}},
      {{"--tpot-target-ms", "-2"}, {"--tpot-target-ms", "-2"}},
      {{"--ttft-target-ms", "-3"}, {"--ttft-target-ms", "-3"}},
      {{"--trace-systems", "arena,paged", "--no-decode"}, {"--trace-systems", "'paged'"}},
      {{"--trace-systems", "arena,arena", "--no-decode"}, {"--trace-systems", "twice"}},
      {{"--trace-systems", "", "--no-decode"}, {"--trace-systems", "''"}},
      {{"--parked-slots", "-1", "--no-decode"}, {"--parked-slots", "-1"}},
      {{"--max-queue-wait", "-0.5", "--no-decode"}, {"--max-queue-wait", "-0.5"}},
      {{"--max-prefill-tokens-while-decoding", "100000", "--no-decode", "--system-prompt-tokens",
        "8"},
       {"--max-prefill-tokens-while-decoding 100000", "step token budget"}},
  };
  for (const Case& c : cases) {
    const CliRun r = run(bench_args(c.args));
    EXPECT_EQ(r.code, kExitUsage) << c.args[0] << ": " << r.err;
    for (const std::string& name : c.named) {
      EXPECT_TRUE(contains(r.err, name)) << c.args[0] << " " << c.args[1] << ": " << r.err;
    }
  }
  const CliRun missing = run({"bench", "engine", "--model", "/nonexistent/kvvm-model"});
  EXPECT_EQ(missing.code, kExitUsage);
  EXPECT_TRUE(contains(missing.err, "/nonexistent/kvvm-model")) << missing.err;
  const CliRun no_model = run({"bench", "engine"});
  EXPECT_EQ(no_model.code, kExitUsage);
  EXPECT_TRUE(contains(no_model.err, "--model")) << no_model.err;
}

TEST(CliBenchEngineOptions, HelpExplainsEachOption) {
  const CliRun r = run({"bench", "engine", "--help"});
  EXPECT_EQ(r.code, kExitOk);
  for (const char* option : {"--model",
                             "--backend",
                             "--max-context",
                             "--max-running",
                             "--kv-budget",
                             "--batches",
                             "--prompt-tokens",
                             "--decode-tokens",
                             "--rates",
                             "--requests",
                             "--duration-limit",
                             "--json",
                             "--plot",
                             "--logprobs",
                             "--choices",
                             "--choices-prompt-tokens",
                             "--choices-tokens",
                             "--no-early-refusal",
                             "--max-prefill-tokens-while-decoding",
                             "--tpot-target-ms",
                             "--ttft-target-ms",
                             "--trace-systems",
                             "--max-queue-wait",
                             "--parked-slots"}) {
    EXPECT_TRUE(contains(r.out, option)) << option;
  }
}

}  // namespace
}  // namespace kvvm::cli
