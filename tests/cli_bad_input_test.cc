// Bad input to the kvvm command line is answered with an error that names it, never with a
// crash, a wrapped number or a silent exit 0. One test per class of bad input, each through
// run_cli (the same code path as the binary) or the option parser.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_app.h"
#include "cli_common.h"
#include "info_command.h"
#include "simulate_command.h"
#include "support/cli_run.h"
#include "text_table.h"

namespace kvvm::cli {
namespace {

using test::CliRun;
using test::contains;
using test::run;

// A small host simulation: quick, and no GPU needed.
std::vector<std::string> small_simulation(std::vector<std::string> extra) {
  std::vector<std::string> args{"simulate", "--backend",     "host", "--budget",
                                "64M",      "--max-context", "1K"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

SimulateOptions parse_simulate(const std::vector<std::string>& args) {
  CLI::App app;
  SimulateOptions options;
  add_simulate_command(app, options);
  std::vector<std::string> reversed{args.rbegin(), args.rend()};
  reversed.push_back("simulate");
  app.parse(reversed);
  return options;
}

std::filesystem::path scratch_dir() {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("kvvm_bad_input_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
       ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(dir);
  return dir;
}

// --- huge counts and tiny rates: a bound and a clear error, not std::bad_alloc -----------

TEST(CliBadInput, HugeCountsAndTinyRatesAreRefusedWithTheLimit) {
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> named;  // what the error must name
  };
  const std::vector<Case> cases = {
      {{"--requests", "-1"}, {"--requests", "'-1'"}},
      {{"--requests", "18446744073709551615"}, {"--requests", "1000000"}},
      {{"--tenants", "4294967295"}, {"--tenants", "4294967295", "65536"}},
      {{"--rate", "1e-9"}, {"the limit is", "steps"}},
      {{"--duration", "1", "--rate", "1e12"}, {"--rate", "1e12", "1e+06"}},
      {{"--duration", "100000", "--rate", "1000"}, {"requests; the limit is 1000000"}},
      {{"--conversations", "1000000", "--turns", "1000"}, {"the limit is 1000000"}},
      {{"--step-ms", "1e-9"}, {"the limit is", "--step-ms"}},
  };
  for (const Case& c : cases) {
    const CliRun result = run(small_simulation(c.args));
    const std::string shown = ::testing::PrintToString(c.args);
    EXPECT_EQ(result.code, kExitUsage) << shown << "\n" << result.err;
    EXPECT_FALSE(contains(result.err, "internal error")) << shown << "\n" << result.err;
    for (const std::string& part : c.named) {
      EXPECT_TRUE(contains(result.err, part)) << shown << ": no '" << part << "' in\n"
                                              << result.err;
    }
  }
}

// --- numbers: no sign wraps around, no octal ---------------------------------------------

TEST(CliBadInput, NumbersAreDecimalAndNeverWrap) {
  const SimulateOptions parsed = parse_simulate({"--requests", "010", "--seed", "0010"});
  EXPECT_EQ(parsed.generator.requests, 10u);
  EXPECT_EQ(parsed.generator.seed, 10u);

  // Every command's numeric options refuse a sign, a base prefix and a fraction.
  const std::vector<std::vector<std::string>> options = {
      {"info", "--granules"},           {"info", "--device"},
      {"plan", "--concurrency"},        {"bench", "growth", "--sequences"},
      {"bench", "growth", "--ahead"},   {"bench", "growth", "--steps"},
      {"bench", "growth", "--device"},  {"bench", "share", "--sequences"},
      {"bench", "share", "--device"},   {"bench", "decode", "--layers"},
      {"bench", "decode", "--device"},  {"bench", "decode", "--chunk"},
      {"bench", "prefill", "--case"},   {"bench", "prefill", "--head-dim"},
      {"bench", "prefill", "--device"}, {"simulate", "--requests"},
      {"simulate", "--tenants"},        {"simulate", "--seed"},
      {"simulate", "--conversations"},  {"simulate", "--commit-ahead"},
      {"simulate", "--max-slots"},      {"simulate", "--device"},
      {"simulate", "--rate"},           {"simulate", "--step-ms"},
      {"simulate", "--max-queue-wait"},
  };
  for (const std::vector<std::string>& option : options) {
    for (const std::string value : {"-1", "0x10", "1.5x", "nan"}) {
      std::vector<std::string> args = option;
      args.push_back(value);
      const CliRun result = run(args);
      const std::string shown = ::testing::PrintToString(args);
      EXPECT_EQ(result.code, kExitUsage) << shown << "\n" << result.err;
      EXPECT_TRUE(contains(result.err, option.back())) << shown << "\n" << result.err;
      EXPECT_FALSE(contains(result.err, "internal error")) << shown << "\n" << result.err;
    }
  }
}

TEST(CliBadInput, ParseCountAndNumberNameTheValueAndTheLimit) {
  EXPECT_EQ(*parse_count("010", 0, 100), 10u);
  EXPECT_EQ(*parse_count("18446744073709551615", 0, UINT64_MAX), UINT64_MAX);
  for (const char* text : {"-1", "+1", "0x10", "1e3", " 1", "1 ", "", "18446744073709551616"}) {
    EXPECT_FALSE(parse_count(text, 0, UINT64_MAX).ok()) << text;
  }
  const Result<std::uint64_t> above = parse_count("101", 1, 100);
  ASSERT_FALSE(above.ok());
  EXPECT_TRUE(contains(above.status().message(), "'101'")) << above.status().message();
  EXPECT_TRUE(contains(above.status().message(), "100")) << above.status().message();
  const Result<std::uint64_t> below = parse_count("0", 1, 100);
  ASSERT_FALSE(below.ok());
  EXPECT_TRUE(contains(below.status().message(), "minimum of 1")) << below.status().message();

  EXPECT_EQ(*parse_number("2.5e1", 0, 100), 25.0);
  for (const char* text : {"nan", "inf", "-inf", "0x1p3", "1e999", "", "1.5x", "-1"}) {
    EXPECT_FALSE(parse_number(text, 0, 1e9).ok()) << text;
  }
  EXPECT_FALSE(parse_number("0", 0, 1, /*min_exclusive=*/true).ok());
  EXPECT_TRUE(parse_number("0", 0, 1).ok());
}

// --- options that do not apply together are refused, naming both ------------------------

TEST(CliBadInput, ExclusiveOptionsNameBoth) {
  const std::vector<std::pair<std::vector<std::string>, std::pair<std::string, std::string>>>
      cases = {
          {{"--trace", "t.jsonl", "--conversations", "5"}, {"--trace", "--conversations"}},
          {{"--trace", "t.jsonl", "--rate", "5"}, {"--trace", "--rate"}},
          {{"--requests", "5", "--duration", "1"}, {"--requests", "--duration"}},
          {{"--conversations", "5", "--requests", "5"}, {"--conversations", "--requests"}},
          {{"--turns", "3"}, {"--turns", "--conversations"}},
      };
  for (const auto& [args, names] : cases) {
    const CliRun result = run(small_simulation(args));
    const std::string shown = ::testing::PrintToString(args);
    EXPECT_EQ(result.code, kExitUsage) << shown << "\n" << result.err;
    EXPECT_TRUE(contains(result.err, names.first)) << shown << "\n" << result.err;
    EXPECT_TRUE(contains(result.err, names.second)) << shown << "\n" << result.err;
  }
}

// --- a write that failed is an error naming what was written ------------------------------

TEST(CliBadInput, FullStandardOutputFails) {
  std::ofstream full("/dev/full");
  ASSERT_TRUE(full.is_open()) << "/dev/full is missing";
  std::ostringstream err;
  const int code = run_cli({"plan", "--json"}, "test", full, err);
  EXPECT_EQ(code, kExitFailure) << err.str();
  EXPECT_TRUE(contains(err.str(), "standard output")) << err.str();
}

TEST(CliBadInput, FullDiskForWrittenFilesFails) {
  for (const char* option : {"--save-trace", "--csv"}) {
    const CliRun result = run(small_simulation({"--requests", "5", option, "/dev/full"}));
    EXPECT_NE(result.code, kExitOk) << option << "\n" << result.err;
    EXPECT_TRUE(contains(result.err, "/dev/full")) << option << "\n" << result.err;
    EXPECT_TRUE(contains(result.err, option)) << option << "\n" << result.err;
  }
  const Status written =
      write_file("/dev/full", "--out", [](std::ostream& out) { out << "a few bytes\n"; });
  EXPECT_EQ(written.code(), StatusCode::kUnavailable) << written.to_string();
  EXPECT_TRUE(contains(written.message(), "'/dev/full'")) << written.to_string();
}

// --- a misspelt subcommand is named, with the valid ones ---------------------------------

TEST(CliBadInput, UnknownSubcommandIsNamed) {
  const CliRun top = run({"simulat", "--backend", "host"});
  EXPECT_EQ(top.code, kExitUsage);
  for (const char* part : {"'simulat'", "info", "plan", "bench", "simulate"}) {
    EXPECT_TRUE(contains(top.err, part)) << part << "\n" << top.err;
  }
  const CliRun nested = run({"bench", "grwoth"});
  EXPECT_EQ(nested.code, kExitUsage);
  for (const char* part : {"'grwoth'", "growth", "share", "decode"}) {
    EXPECT_TRUE(contains(nested.err, part)) << part << "\n" << nested.err;
  }
  // No subcommand word at all is not a misspelling.
  const CliRun version = run({"--version"});
  EXPECT_EQ(version.code, kExitOk) << version.err;
  EXPECT_TRUE(contains(version.out, "kvvm test")) << version.out;
}

// --- a file name that is not UTF-8 is written, not an internal error ----------------------

TEST(CliBadInput, NonUtf8FileNameInJson) {
  const std::filesystem::path trace = scratch_dir() / "trace-\xff\xfe.jsonl";
  {
    std::ofstream file(trace);
    file << R"({"arrival": 0, "prompt_tokens": 16, "output_tokens": 4})"
         << "\n";
  }
  const CliRun result = run(small_simulation({"--trace", trace.string(), "--json"}));
  EXPECT_EQ(result.code, kExitOk) << result.err;
  EXPECT_FALSE(contains(result.err, "internal error")) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out, nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << result.out;
  EXPECT_TRUE(contains(json.dump(), "trace-\xef\xbf\xbd")) << result.out;  // U+FFFD
  std::filesystem::remove_all(trace.parent_path());
}

// --- the shared table renders by displayed width ------------------------------------------

TEST(CliTextTable, AlignsByDisplayedCharacters) {
  TextTable table({"name", "µs"}, 1, "note");
  table.add({"a", "12.5"}, "first");
  table.add({"longer", "3"});
  std::ostringstream out;
  table.print(out);
  EXPECT_EQ(out.str(),
            "name      µs  note\n"
            "a       12.5  first\n"
            "longer     3\n");
  EXPECT_EQ(fixed(std::nan(""), 2), "n/a");
  EXPECT_EQ(fixed(1.005, 1), "1.0");
}

}  // namespace
}  // namespace kvvm::cli
