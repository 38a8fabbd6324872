// `kvvm plan`: option parsing, refusals (exit 2 with the reason), the JSON report's numbers
// and the human form's units and formulas. The arithmetic itself is tested in layout_test.cc;
// these tests check that the command reports it faithfully.
#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "commands/info_command.h"
#include "commands/plan_command.h"
#include "kit/model_loading.h"
#include "kit/value_parsers.h"
#include "support/cli_run.h"
#include "support/test_data.h"

namespace kvvm::cli {
namespace {

using test::capture;
using test::CliRun;
using test::contains;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

PlanOptions parse_plan(const std::string& args) {
  CLI::App app("test", "kvvm");
  PlanOptions options;
  add_plan_command(app, options);
  app.parse("plan " + args, false);
  return options;
}

CliRun run_plan_options(const PlanOptions& options) {
  return capture([&](std::ostream& out, std::ostream& err) { return run_plan(options, out, err); });
}

TEST(CliPlanOptions, DefaultsWhenNothingIsGiven) {
  const PlanOptions options = parse_plan("");
  EXPECT_EQ(options.model, "llama-3-8b");
  EXPECT_EQ(options.dtype, "");
  EXPECT_EQ(options.layout, "all");
  EXPECT_EQ(options.granule, 2 * kMiB);
  EXPECT_EQ(options.context, 8192u);
  EXPECT_EQ(options.prefix, 0u);
  EXPECT_EQ(options.budget, 40 * kGiB);
  EXPECT_FALSE(options.concurrency.has_value());
  EXPECT_FALSE(options.json);
}

TEST(CliPlanOptions, ParsesEveryOption) {
  const PlanOptions options = parse_plan(
      "--model qwen2.5-14b --dtype fp8 --layout seq-major --granule 64K --context 128K "
      "--prefix 2048 --budget 80G --concurrency 16 --json");
  EXPECT_EQ(options.model, "qwen2.5-14b");
  EXPECT_EQ(options.dtype, "fp8");
  EXPECT_EQ(options.layout, "seq-major");
  EXPECT_EQ(options.granule, 65536u);
  EXPECT_EQ(options.context, 131072u);
  EXPECT_EQ(options.prefix, 2048u);
  EXPECT_EQ(options.budget, 80 * kGiB);
  EXPECT_EQ(options.concurrency, 16u);
  EXPECT_TRUE(options.json);
}

TEST(CliPlanOptions, MalformedNumbersAreParseErrors) {
  for (const std::string args :
       {"--granule 2X", "--granule -2M", "--context -5", "--context 1.5", "--context 8M",
        "--prefix abc", "--budget -1", "--budget 1.5G", "--concurrency many", "--concurrency -1",
        "--concurrency 0", "--concurrency 1.5", "--concurrency +3",
        "--concurrency 99999999999999999999"}) {
    CLI::App app("test", "kvvm");
    PlanOptions options;
    add_plan_command(app, options);
    EXPECT_THROW(app.parse("plan " + args, false), CLI::ParseError) << args;
  }
}

TEST(CliPlanTokens, ParsesWholeNumbersAndK) {
  EXPECT_EQ(*parse_token_count("0"), 0u);
  EXPECT_EQ(*parse_token_count("8192"), 8192u);
  EXPECT_EQ(*parse_token_count("128K"), 131072u);
  EXPECT_EQ(*parse_token_count("32k"), 32768u);
  for (const std::string text :
       {"", "K", "-1", "+1", "1.5", "8M", "1 K", "99999999999999999999", "18014398509481984K"}) {
    Result<std::uint64_t> parsed = parse_token_count(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_TRUE(contains(parsed.status().message(), "'" + text + "'"));
  }
}

TEST(CliPlanRun, RefusalsExitTwoWithTheReason) {
  struct Case {
    PlanOptions options;
    std::vector<std::string> said;
  };
  std::vector<Case> cases;
  const auto with = [&cases](auto change, std::vector<std::string> said) {
    PlanOptions options;
    change(options);
    cases.push_back({options, std::move(said)});
  };
  with([](PlanOptions& o) { o.model = "gpt-5"; },
       {"INVALID_ARGUMENT", "--model", "'gpt-5'", "qwen2.5-0.5b", "llama-3-70b"});
  with([](PlanOptions& o) { o.granule = 0; }, {"--granule", "got 0"});
  with([](PlanOptions& o) { o.context = 0; }, {"--context", "got 0"});
  with([](PlanOptions& o) { o.budget = 0; }, {"--budget", "got 0"});
  with([](PlanOptions& o) { o.concurrency = 0; }, {"--concurrency", "got 0"});
  with([](PlanOptions& o) { o.prefix = 8192; }, {"--prefix 8192", "--context 8192"});
  with([](PlanOptions& o) { o.layout = "paged"; }, {"--layout", "'paged'"});
  with([](PlanOptions& o) { o.dtype = "int4"; }, {"--dtype", "'int4'"});
  with([](PlanOptions& o) { o.context = std::uint64_t{1} << 60; }, {"64 bits"});
  with([](PlanOptions& o) { o.model = "/nonexistent/config.json"; },
       {"--model", "/nonexistent/config.json"});
  with(
      [](PlanOptions& o) {
        o.context = 16;
        o.concurrency = ~std::uint64_t{0};
      },
      {"--concurrency", "64 bits"});
  for (const Case& c : cases) {
    const CliRun result = run_plan_options(c.options);
    EXPECT_EQ(result.code, kExitUsage) << result.err;
    EXPECT_TRUE(result.out.empty()) << "nothing is reported from a refused request";
    EXPECT_TRUE(contains(result.err, "kvvm plan: ")) << result.err;
    for (const std::string& part : c.said) {
      EXPECT_TRUE(contains(result.err, part)) << part << " not in: " << result.err;
    }
  }
}

// A granule is what a driver maps at once: a multiple of the page (the host driver's
// --host-granule) or the GPU's 2 MiB granularity. `--granule 3` used to be planned as given.
TEST(CliPlanRun, AGranuleNotAMultipleOfThePageIsRefusedNamingIt) {
  for (const auto& [granule, text] : std::vector<std::pair<std::uint64_t, std::string>>{
           {3, "--granule 3 (3 B)"},
           {6000, "--granule 6000 (5.86 KiB)"},
           {4096 + 512, "--granule 4608 (4.50 KiB)"}}) {
    PlanOptions options;
    options.granule = granule;
    const CliRun result = run_plan_options(options);
    EXPECT_EQ(result.code, kExitUsage) << granule << ": " << result.err;
    EXPECT_TRUE(result.out.empty()) << result.out;
    EXPECT_TRUE(contains(result.err, text)) << result.err;
    EXPECT_TRUE(contains(result.err, "a positive multiple of 4 KiB")) << result.err;
  }
  for (const std::uint64_t granule : {std::uint64_t{4096}, std::uint64_t{12288}, 2 * kMiB}) {
    PlanOptions options;
    options.granule = granule;
    const CliRun result = run_plan_options(options);
    EXPECT_EQ(result.code, kExitOk) << granule << ": " << result.err;
  }
}

TEST(CliPlanRun, JsonReportsEveryFigure) {
  PlanOptions options;
  options.model = "qwen2.5-0.5b";
  options.layout = "head-major";
  options.json = true;
  const CliRun result = run_plan_options(options);
  ASSERT_EQ(result.code, kExitOk) << result.err;
  const nlohmann::ordered_json json = nlohmann::ordered_json::parse(result.out);
  EXPECT_EQ(json.at("model").at("name"), "qwen2.5-0.5b");
  EXPECT_EQ(json.at("model").at("dtype"), "fp16");
  EXPECT_EQ(json.at("model").at("bytes_per_token"), 12288);
  EXPECT_EQ(json.at("granule_bytes"), 2 * kMiB);
  EXPECT_EQ(json.at("context_tokens"), 8192);
  EXPECT_FALSE(json.contains("sequences"));
  ASSERT_EQ(json.at("layouts").size(), 1u);
  const nlohmann::ordered_json& head = json.at("layouts").at(0);
  EXPECT_EQ(head.at("layout"), "head-major");
  EXPECT_EQ(head.at("fragments"), 96);
  EXPECT_EQ(head.at("contiguous_bytes_per_token"), 128);
  EXPECT_EQ(head.at("commit_floor_1_token").at("granules"), 96);
  EXPECT_EQ(head.at("commit_floor_1_token").at("bytes"), 192 * kMiB);
  EXPECT_DOUBLE_EQ(head.at("crossover_tokens").get<double>(), 16384.0);
  EXPECT_EQ(head.at("prefix").at("shareable"), false);
  EXPECT_EQ(head.at("concurrency").at("without_sharing"), 40 * 1024 / 192);
  EXPECT_EQ(head.at("view").at("token_stride"), 128);
  EXPECT_EQ(head.at("view").at("head_stride"), head.at("fragment_stride_bytes"));
  EXPECT_FALSE(head.contains("memory_for_sequences"));
}

TEST(CliPlanRun, JsonAllLayoutsWithPrefixAndConcurrency) {
  PlanOptions options;
  options.model = "qwen2.5-14b";
  options.prefix = 2048;
  options.concurrency = 30;
  options.json = true;
  const CliRun result = run_plan_options(options);
  ASSERT_EQ(result.code, kExitOk) << result.err;
  const nlohmann::ordered_json json = nlohmann::ordered_json::parse(result.out);
  EXPECT_EQ(json.at("model").at("bytes_per_token"), 196608);
  EXPECT_EQ(json.at("sequences"), 30);
  const nlohmann::ordered_json& layouts = json.at("layouts");
  ASSERT_EQ(layouts.size(), 3u);
  EXPECT_EQ(layouts[0].at("layout"), "head-major");
  EXPECT_EQ(layouts[1].at("layout"), "seq-major");
  EXPECT_EQ(layouts[2].at("layout"), "token-major");
  EXPECT_EQ(layouts[0].at("prefix").at("shareable"), false);
  EXPECT_TRUE(contains(layouts[0].at("prefix").at("refusal_reason").get<std::string>(),
                       "fragment_bytes < granule"));
  for (int i : {1, 2}) {
    const nlohmann::ordered_json& layout = layouts[i];
    EXPECT_EQ(layout.at("prefix").at("shareable"), true);
    EXPECT_EQ(layout.at("prefix").at("mapping_operations"), 192);
    EXPECT_EQ(layout.at("prefix").at("refusal_reason"), "");
    EXPECT_EQ(layout.at("concurrency").at("without_sharing"), 26);
    EXPECT_EQ(layout.at("concurrency").at("with_sharing"), 35);
    EXPECT_EQ(layout.at("memory_for_sequences").at("bytes_without_sharing"), 30 * 1536 * kMiB);
    EXPECT_EQ(layout.at("memory_for_sequences").at("bytes_with_sharing"),
              384 * kMiB + 30 * 1152 * kMiB);
  }
  EXPECT_EQ(layouts[2].at("commit_floor_1_token").at("granules"), 1);
}

TEST(CliPlanRun, HumanFormStatesUnitsAndFormulas) {
  PlanOptions options;
  options.model = "qwen2.5-0.5b";
  options.layout = "head-major";
  options.prefix = 32;
  const CliRun result = run_plan_options(options);
  ASSERT_EQ(result.code, kExitOk) << result.err;
  for (const char* expected :
       {"layout head-major (BNSH", "96 granules = 192 MiB",
        "fragments x ceil(1 x 128 B / 2 MiB) granules", "16384 tokens", "G / contiguous",
        "L x 2 x H = 24 x 2 x 2", "refused", "fragment_bytes < granule", "floor(B / per sequence)",
        "1 + floor((B - per sequence) / private)", "KvView token stride", "128 B",
        "symbols: L layers"}) {
    EXPECT_TRUE(contains(result.out, expected)) << expected << "\n" << result.out;
  }
}

TEST(CliPlanRun, AllLayoutsIsOneSideBySideTable) {
  PlanOptions options;
  options.model = "qwen2.5-14b";
  options.prefix = 2048;
  options.concurrency = 30;
  const CliRun result = run_plan_options(options);
  ASSERT_EQ(result.code, kExitOk) << result.err;
  const std::string& text = result.out;
  std::istringstream lines(text);
  std::string line, header;
  while (std::getline(lines, line)) {
    if (line.starts_with("figure")) header = line;
  }
  ASSERT_FALSE(header.empty()) << text;
  EXPECT_LT(header.find("head-major"), header.find("seq-major"));
  EXPECT_LT(header.find("seq-major"), header.find("token-major"));
  EXPECT_LT(header.find("token-major"), header.find("formula"));
  for (const char* expected :
       {"commit floor, 1 token (granules)", "crossover (tokens)", "mapping operations",
        "boundary bytes per sharer", "sequences in B, sharing", "memory for 30, sharing",
        "KvView layer stride (B)", "1152 MiB", "196608",
        "prefix of 2048 tokens not shareable in the head-major layout"}) {
    EXPECT_TRUE(contains(text, expected)) << expected << "\n" << text;
  }
  EXPECT_FALSE(contains(text, "not shareable in the seq-major")) << text;
}

TEST(CliPlanRun, ReadsAConfigJsonWithADtypeOverride) {
  PlanOptions options;
  options.model = (kvvm::test::data_dir() / "config_qwen2.5-0.5b.json").string();
  options.dtype = "fp8";
  options.layout = "token-major";
  options.json = true;
  const CliRun result = run_plan_options(options);
  ASSERT_EQ(result.code, kExitOk) << result.err;
  const nlohmann::ordered_json json = nlohmann::ordered_json::parse(result.out);
  EXPECT_EQ(json.at("model").at("head_dim"), 64);
  EXPECT_EQ(json.at("model").at("dtype"), "fp8");
  EXPECT_EQ(json.at("model").at("bytes_per_token"), 6144);
}

// One resolution of --model for plan, simulate and bench: a built-in name, a config.json, or a
// folder holding one.
TEST(CliPlanModel, ResolveTakesANameAPathOrAModelDirectory) {
  Result<Geometry> named = resolve_model_geometry("llama-3-70b", std::nullopt);
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->layers, 80u);
  EXPECT_EQ(resolve_model_geometry("llama-3-70b", DType::kFp8)->dtype, DType::kFp8);

  const std::string file = (kvvm::test::data_dir() / "config_qwen2.5-0.5b.json").string();
  Result<Geometry> from_file = resolve_model_geometry(file, std::nullopt);
  ASSERT_TRUE(from_file.ok()) << from_file.status().to_string();
  EXPECT_EQ(from_file->head_dim, 64u);

  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("kvvm_cli_plan_resolve_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ifstream source(file);
    std::ofstream(dir / "config.json") << std::string(std::istreambuf_iterator<char>(source), {});
  }
  Result<Geometry> from_dir = resolve_model_geometry(dir.string(), std::nullopt);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  ASSERT_TRUE(from_dir.ok()) << from_dir.status().to_string();
  EXPECT_EQ(from_dir->layers, 24u);

  Result<Geometry> unknown = resolve_model_geometry("mistral-7b", std::nullopt);
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(contains(unknown.status().message(), "qwen2.5-14b"));
}

}  // namespace
}  // namespace kvvm::cli
