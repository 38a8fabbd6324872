// Bad input to the kvvm command line is answered with an error that names it, never with a
// crash, a wrapped number or a silent exit 0. One test per class of bad input, each through
// run_cli (the same code path as the binary) or the option parser.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "app.h"
#include "commands/info_command.h"
#include "commands/simulate_command.h"
#include "kit/cli_common.h"
#include "kit/text_table.h"
#include "support/cli_run.h"
#include "support/test_data.h"

namespace kvvm::cli {
namespace {

using test::scratch_dir;

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
      {"info", "--granules"},
      {"info", "--device"},
      {"plan", "--concurrency"},
      {"bench", "growth", "--sequences"},
      {"bench", "growth", "--ahead"},
      {"bench", "growth", "--steps"},
      {"bench", "growth", "--device"},
      {"bench", "share", "--sequences"},
      {"bench", "share", "--device"},
      {"bench", "decode", "--layers"},
      {"bench", "decode", "--device"},
      {"bench", "decode", "--chunk"},
      {"bench", "prefill", "--case"},
      {"bench", "prefill", "--head-dim"},
      {"bench", "prefill", "--device"},
      {"simulate", "--requests"},
      {"simulate", "--tenants"},
      {"simulate", "--seed"},
      {"simulate", "--conversations"},
      {"simulate", "--commit-ahead"},
      {"simulate", "--max-slots"},
      {"simulate", "--device"},
      {"simulate", "--rate"},
      {"simulate", "--step-ms"},
      {"simulate", "--max-queue-wait"},
      {"serve", "--parked-slots"},
      {"bench", "engine", "--parked-slots"},
      {"bench", "engine", "--max-queue-wait"},
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
  const std::filesystem::path trace = scratch_dir("kvvm_bad_input") / "trace-\xff\xfe.jsonl";
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

// --- refused at once: exit 2, the option, the value and the limit named, nothing written ---

// What every refusal below must show: exit 2, no internal error, each of `named` in the
// message and no file at `written` (an output the command would have made first).
void expect_refused(const std::vector<std::string>& args, const std::vector<std::string>& named,
                    const std::filesystem::path& written = {}) {
  const CliRun result = run(args);
  const std::string shown = ::testing::PrintToString(args);
  EXPECT_EQ(result.code, kExitUsage) << shown << "\n" << result.err;
  EXPECT_FALSE(contains(result.err, "internal error")) << shown << "\n" << result.err;
  for (const std::string& part : named) {
    EXPECT_TRUE(contains(result.err, part)) << shown << ": no '" << part << "' in\n" << result.err;
  }
  if (!written.empty()) {
    EXPECT_FALSE(std::filesystem::exists(written)) << shown << " wrote " << written;
  }
}

TEST(CliBadInput, ByteSizesPastWhatTheOptionCanUseAreRefused) {
  const std::filesystem::path dir = scratch_dir("kvvm_bad_input");
  const std::string saved = (dir / "saved.jsonl").string();
  // 17179869183G fits in 64 bits (16 EiB less 1 GiB) and used to end in std::bad_alloc.
  expect_refused(small_simulation({"--budget", "17179869183G", "--save-trace", saved}),
                 {"--budget", "'17179869183G'", "the limit is 17592186044416 bytes (16 TiB)"},
                 saved);
  expect_refused(small_simulation({"--budget", "99999999999999999T", "--save-trace", saved}),
                 {"--budget", "'99999999999999999T'", "64 bits", "the limit is"}, saved);
  expect_refused(small_simulation({"--pool", "17179869183G", "--save-trace", saved}),
                 {"--pool", "'17179869183G'", "16 TiB"}, saved);
  expect_refused({"bench", "engine", "--kv-budget", "17179869183G"},
                 {"--kv-budget", "'17179869183G'", "16 TiB"});
  expect_refused({"info", "--backend", "host", "--host-granule", "2G"},
                 {"--host-granule", "'2G'", "1073741824 bytes (1 GiB)"});
  // Under the flat limit but more paged blocks than the baseline's table may hold for this
  // model (12 KiB per token): refused before the trace is made or saved.
  expect_refused({"simulate", "--backend", "host", "--model", "qwen2.5-0.5b", "--budget", "2T",
                  "--save-trace", saved},
                 {"--budget", "2199023255552", "the limit is 8388608 blocks"}, saved);
  std::filesystem::remove_all(dir);
}

TEST(CliBadInput, ResourceCountsPastTheProcessLimitsAreRefusedAtOnce) {
  // Every sample of the host timing table is a mapping of its own; past vm.max_map_count
  // mmap fails sample after sample instead.
  std::ifstream max_map_count("/proc/sys/vm/max_map_count");
  std::uint64_t max_maps = 0;
  ASSERT_TRUE(max_map_count >> max_maps);
  if (max_maps < 1'000'000) {
    expect_refused({"info", "--backend", "host", "--granules", "1000000"},
                   {"--granules 1000000", "vm.max_map_count is " + std::to_string(max_maps),
                    "the limit is --granules"});
  }
  // Address space and open files, each lowered for this process (soft limits only, so they
  // can be put back).
  const auto with_limit = [](int resource, rlim_t soft, const std::function<void()>& body) {
    rlimit saved{};
    ASSERT_EQ(::getrlimit(resource, &saved), 0);
    rlimit lowered = saved;
    lowered.rlim_cur = std::min(soft, saved.rlim_max);
    ASSERT_EQ(::setrlimit(resource, &lowered), 0);
    body();
    ASSERT_EQ(::setrlimit(resource, &saved), 0);
  };
  std::uint64_t vm_kib = 0;
  {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      if (line.starts_with("VmSize:")) vm_kib = std::stoull(line.substr(7));
    }
  }
  ASSERT_GT(vm_kib, 0u);
  const rlim_t address_space = vm_kib * 1024 + (std::uint64_t{1} << 30);  // 1 GiB to spare
  with_limit(RLIMIT_AS, address_space, [] {
    expect_refused({"info", "--backend", "host", "--host-granule", "1G", "--granules", "2"},
                   {"--granules 2", "RLIMIT_AS", "the limit is --granules"});
  });
  std::uint64_t open_files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++open_files;
  }
  with_limit(RLIMIT_NOFILE, open_files + 1, [] {
    expect_refused({"info", "--backend", "host", "--host-granule", "1G", "--granules", "2"},
                   {"--granules 2", "2 memory files", "RLIMIT_NOFILE", "the limit is --granules"});
  });
}

TEST(CliBadInput, TraceThatIsNoReadableFileIsNamed) {
  const std::filesystem::path dir = scratch_dir("kvvm_bad_input");
  const std::string saved = (dir / "saved.jsonl").string();
  const std::string folder = (dir / "folder").string();
  std::filesystem::create_directories(folder);
  // A directory opened, then failed its first read deep in the reader: an internal error.
  expect_refused(small_simulation({"--trace", folder, "--save-trace", saved}),
                 {"--trace", "'" + folder + "'", "directory"}, saved);
  const std::string missing = (dir / "missing.jsonl").string();
  expect_refused(small_simulation({"--trace", missing, "--save-trace", saved}),
                 {"--trace", "'" + missing + "'", "no such file"}, saved);
  // Refused before the server is contacted (nothing listens there).
  expect_refused({"bench", "serve", "--url", "http://127.0.0.1:1", "--trace", folder},
                 {"--trace", "'" + folder + "'", "directory"});
  std::filesystem::remove_all(dir);
}

TEST(CliBadInput, DuplicateJsonKeysAreRefusedNamingTheKey) {
  const std::filesystem::path dir = scratch_dir("kvvm_bad_input");
  const std::string saved = (dir / "saved.jsonl").string();
  // A config.json that says two things: refused with the key and its line, before any output.
  const std::filesystem::path model = dir / "model";
  std::filesystem::create_directories(model);
  std::ofstream(model / "config.json") << "{\n  \"num_hidden_layers\": 4,\n"
                                          "  \"num_attention_heads\": 4,\n"
                                          "  \"num_key_value_heads\": 2,\n"
                                          "  \"hidden_size\": 256,\n"
                                          "  \"num_hidden_layers\": 40\n}\n";
  expect_refused(small_simulation({"--model", model.string(), "--save-trace", saved}),
                 {"--model", "duplicate key \"num_hidden_layers\"", "line 6"}, saved);
  // A trace line that does: reported as FILE:LINE with the key and skipped, as every malformed
  // line is (exit 3), not replayed with the last value.
  const std::string trace = (dir / "dup.jsonl").string();
  std::ofstream(trace) << R"({"arrival": 0, "prompt_tokens": 16, "output_tokens": 4})"
                       << "\n"
                       << R"({"arrival": 1, "prompt_tokens": 16, "output_tokens": 4, )"
                       << R"("output_tokens": 400})"
                       << "\n";
  const CliRun result = run(small_simulation({"--trace", trace, "--json"}));
  EXPECT_EQ(result.code, kExitSkippedLines) << result.err;
  EXPECT_TRUE(contains(result.err, trace + ":2: duplicate key \"output_tokens\"")) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out, nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << result.out;
  EXPECT_TRUE(contains(json.dump(), "\"requests\":1")) << result.out;
  std::filesystem::remove_all(dir);
}

TEST(CliBadInput, HostGranuleOffThePageIsRefusedWhateverTheBackend) {
  const std::filesystem::path dir = scratch_dir("kvvm_bad_input");
  const std::string saved = (dir / "saved.jsonl").string();
  const std::string page = std::to_string(::sysconf(_SC_PAGESIZE));
  const std::vector<std::string> named = {"--host-granule", "'3000'", "page size " + page};
  // With a GPU, auto and cuda never open the host driver, which was the only check.
  for (const std::string backend : {"auto", "cuda", "host"}) {
    expect_refused({"info", "--backend", backend, "--host-granule", "3000"}, named);
    expect_refused({"bench", "growth", "--backend", backend, "--host-granule", "3000"}, named);
    // The trace used to be saved before the driver refused the granule.
    expect_refused({"simulate", "--backend", backend, "--host-granule", "3000", "--requests", "5",
                    "--save-trace", saved},
                   named, saved);
  }
  std::filesystem::remove_all(dir);
}

// Runs `body` in `dir`, then returns to where the test was.
void in_directory(const std::filesystem::path& dir, const std::function<void()>& body) {
  const std::filesystem::path before = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  body();
  std::filesystem::current_path(before);
}

TEST(CliBadInput, ModelFolderNamedWithoutASlashIsLoaded) {
  const std::filesystem::path dir = scratch_dir("kvvm_bad_input");
  std::filesystem::create_directories(dir / "my-model");
  std::filesystem::copy_file(std::filesystem::path(test::demo_model_dir()) / "config.json",
                             dir / "my-model" / "config.json");
  in_directory(dir, [&] {
    // Used to be "unknown model 'my-model'": a name without a slash was a built-in's only.
    const CliRun found = run(small_simulation({"--model", "my-model", "--requests", "5"}));
    EXPECT_EQ(found.code, kExitOk) << found.err;
    EXPECT_TRUE(contains(found.out, "my-model/config.json")) << found.out;
    // Neither a built-in nor a folder: both are said.
    expect_refused(small_simulation({"--model", "no-model", "--save-trace", "saved.jsonl"}),
                   {"--model", "'no-model'", "llama-3-8b", "no folder"}, dir / "saved.jsonl");
    expect_refused({"generate", "--model", "no-model", "--prompt", "x"},
                   {"--model", "no-model", "llama-3-8b", "no folder"});
  });
  std::filesystem::remove_all(dir);
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
