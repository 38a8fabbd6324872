// `kvvm info` and its helpers: percentile math, size parsing, option parsing, and the JSON
// report on the host driver (always available). Timing values are checked for shape and
// sanity only (present, positive): benchmarks report, tests never assert a wall-clock time.
#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands/info_command.h"
#include "kit/op_timing.h"
#include "kvvm/vmm/cuda_driver.h"
#include "kvvm/vmm/host_driver.h"

namespace kvvm::cli {
namespace {

std::size_t page_size() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

TEST(CliOpTiming, PercentilesMatchNumpyLinearInterpolation) {
  std::vector<double> samples;
  for (int i = 1; i <= 100; ++i) samples.push_back(i);
  std::shuffle(samples.begin(), samples.end(), std::mt19937(7));  // order must not matter
  // numpy.percentile(range(1, 101), [0, 50, 99, 100]) == [1, 50.5, 99.01, 100]
  EXPECT_DOUBLE_EQ(percentile(samples, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(samples, 50), 50.5);
  EXPECT_NEAR(percentile(samples, 99), 99.01, 1e-9);
  EXPECT_DOUBLE_EQ(percentile(samples, 100), 100.0);
}

TEST(CliOpTiming, SummarizeOddEvenAndSingle) {
  const TimingSummary odd = summarize({5, 1, 3});
  EXPECT_EQ(odd.samples, 3u);
  EXPECT_DOUBLE_EQ(odd.median_us, 3.0);
  EXPECT_NEAR(odd.p99_us, 4.96, 1e-9);  // 3 + 0.98 * (5 - 3)

  EXPECT_DOUBLE_EQ(summarize({4, 1, 3, 2}).median_us, 2.5);

  const TimingSummary single = summarize({7});
  EXPECT_DOUBLE_EQ(single.median_us, 7.0);
  EXPECT_DOUBLE_EQ(single.p99_us, 7.0);
}

TEST(CliOpTiming, BrokenPreconditionsThrow) {
  EXPECT_THROW(percentile({}, 50), std::invalid_argument);
  EXPECT_THROW(percentile({1.0}, 101), std::invalid_argument);
  EXPECT_THROW(percentile({1.0}, -1), std::invalid_argument);
  EXPECT_THROW(add_samples({1.0}, {1.0, 2.0}), std::invalid_argument);
}

TEST(CliOpTiming, AddSamplesIsPerSample) {
  const std::vector<double> sum = add_samples({1, 2, 3}, {10, 20, 30});
  EXPECT_EQ(sum, (std::vector<double>{11, 22, 33}));
}

TEST(CliOpTiming, TimeCallRecordsOneSampleAndPassesTheResultThrough) {
  std::vector<double> samples;
  const int result = time_call(samples, [] { return 42; });
  EXPECT_EQ(result, 42);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_GE(samples[0], 0.0);
}

TEST(CliSize, ParsesNumbersAndBinarySuffixes) {
  const std::vector<std::pair<std::string, std::uint64_t>> cases = {
      {"0", 0},
      {"4096", 4096},
      {"4K", 4096},
      {"4k", 4096},
      {"2M", 2097152},
      {"2MiB", 2097152},
      {"2mb", 2097152},
      {"1G", 1073741824},
      {"1T", 1099511627776ull},
      {"512B", 512},
      {"2 M", 2097152},
      {"4 KiB", 4096},
      {"18446744073709551615", 18446744073709551615ull},
  };
  for (const auto& [text, bytes] : cases) {
    Result<std::uint64_t> parsed = parse_byte_size(text);
    ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status().to_string();
    EXPECT_EQ(*parsed, bytes) << text;
  }
}

TEST(CliSize, RefusesBadInputSayingWhy) {
  for (const std::string text : {"", "M", "-1", "+4", "2.5M", "2X", "2  M", "2 ", "4K4",
                                 "18446744073709551616", "17179869184G"}) {
    Result<std::uint64_t> parsed = parse_byte_size(text);
    ASSERT_FALSE(parsed.ok()) << "'" << text << "' parsed as " << *parsed;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("'" + text + "'"), std::string::npos)
        << parsed.status().message();
  }
}

TEST(CliSize, FormatsBinaryUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(4096), "4 KiB");
  EXPECT_EQ(format_bytes(2097152), "2 MiB");
  EXPECT_EQ(format_bytes(1536ull << 20), "1.50 GiB");
}

TEST(CliInfoOptions, ParsesEveryOption) {
  CLI::App app("test", "kvvm");
  InfoOptions options;
  add_info_command(app, options);
  app.parse("info --backend host --device 1 --host-granule 2M --granules 8 --json --no-timing",
            false);
  EXPECT_EQ(options.backend, BackendChoice::kHost);
  EXPECT_EQ(options.device, 1);
  EXPECT_EQ(options.host_granule, 2097152u);
  EXPECT_EQ(options.granules, 8u);
  EXPECT_TRUE(options.json);
  EXPECT_FALSE(options.timing);
}

TEST(CliInfoOptions, DefaultsWhenNothingIsGiven) {
  CLI::App app("test", "kvvm");
  InfoOptions options;
  add_info_command(app, options);
  app.parse("info", false);
  EXPECT_EQ(options.backend, BackendChoice::kAuto);
  EXPECT_EQ(options.host_granule, 0u);
  EXPECT_EQ(options.granules, 64u);
  EXPECT_FALSE(options.json);
  EXPECT_TRUE(options.timing);
}

TEST(CliInfoOptions, RefusesBadUsage) {
  for (const std::string args : {"info --backend tpu", "info --host-granule 2X",
                                 "info --granules 0", "info --granules -3", "info --device -1"}) {
    CLI::App app("test", "kvvm");
    InfoOptions options;
    add_info_command(app, options);
    EXPECT_THROW(app.parse(args, false), CLI::ParseError) << args;
  }
}

class CliInfoHost : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Driver>> driver = make_host_driver();
    ASSERT_TRUE(driver.ok()) << driver.status().to_string();
    driver_ = std::move(*driver);
  }
  std::unique_ptr<Driver> driver_;
};

TEST_F(CliInfoHost, JsonHasEveryFieldAndRow) {
  InfoOptions options;
  options.backend = BackendChoice::kHost;
  options.granules = 4;
  Result<InfoReport> report = gather_info(*driver_, options);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  const nlohmann::ordered_json json = info_json(*report);

  EXPECT_EQ(json.at("backend"), "host");
  EXPECT_TRUE(json.at("device").at("name").is_string());
  EXPECT_EQ(json.at("device").at("ordinal"), 0);
  EXPECT_TRUE(json.at("device").at("driver_version").is_string());
  EXPECT_EQ(json.at("device").at("vmm_supported"), true);
  EXPECT_EQ(json.at("granularity").at("minimum"), page_size());
  EXPECT_GE(json.at("granularity").at("recommended").get<std::size_t>(), page_size());
  EXPECT_GT(json.at("memory").at("total").get<std::uint64_t>(), 0u);
  EXPECT_LE(json.at("memory").at("free").get<std::uint64_t>(),
            json.at("memory").at("total").get<std::uint64_t>());

  const nlohmann::ordered_json& timing = json.at("timing");
  EXPECT_EQ(timing.at("samples"), 4);
  EXPECT_EQ(timing.at("granule"), page_size());
  std::set<std::string> raw, ours;
  for (const nlohmann::ordered_json& row : timing.at("rows")) {
    const std::string name = row.at("name");
    const std::string kind = row.at("kind");
    ASSERT_TRUE(kind == "raw" || kind == "ours") << kind;
    (kind == "raw" ? raw : ours).insert(name);
    EXPECT_GT(row.at("median_us").get<double>(), 0.0) << name;
    EXPECT_GE(row.at("p99_us").get<double>(), row.at("median_us").get<double>()) << name;
  }
  EXPECT_EQ(raw, (std::set<std::string>{"create", "map", "set_access", "unmap", "release",
                                        "raw map+set_access", "raw create+map+set_access"}));
  EXPECT_EQ(ours, (std::set<std::string>{"pooled commit", "fresh commit", "pooled release"}));

  const nlohmann::ordered_json& ratios = timing.at("ratios");
  ASSERT_EQ(ratios.size(), 2u);
  EXPECT_EQ(ratios[0].at("name"), "pooled commit / raw map+set_access");
  EXPECT_EQ(ratios[1].at("name"), "fresh commit / raw create+map+set_access");
  for (const nlohmann::ordered_json& ratio : ratios) {
    EXPECT_GT(ratio.at("value").get<double>(), 0.0);
    EXPECT_DOUBLE_EQ(ratio.at("target").get<double>(), 1.15);
    EXPECT_EQ(ratio.at("met").get<bool>(), ratio.at("value").get<double>() <= 1.15);
  }
  // The measurement gives back everything it took.
  const HostDriverTables tables = host_driver_tables(*driver_);
  EXPECT_EQ(tables.reservations, 0u);
  EXPECT_EQ(tables.handles, 0u);
  EXPECT_EQ(tables.mappings, 0u);
}

TEST_F(CliInfoHost, NoTimingLeavesTheTableOut) {
  InfoOptions options;
  options.timing = false;
  Result<InfoReport> report = gather_info(*driver_, options);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_FALSE(report->timing.has_value());
  EXPECT_FALSE(info_json(*report).contains("timing"));
  EXPECT_EQ(driver_->counts().of(DriverOp::kCreate), 0u);
}

TEST(CliInfoRun, HostJsonGoesToOutAndParses) {
  InfoOptions options;
  options.backend = BackendChoice::kHost;
  options.host_granule = 2 << 20;
  options.granules = 2;
  options.json = true;
  std::ostringstream out, err;
  ASSERT_EQ(run_info(options, out, err), kExitOk) << err.str();
  const nlohmann::ordered_json json = nlohmann::ordered_json::parse(out.str());
  EXPECT_EQ(json.at("granularity").at("minimum"), 2u << 20);
  EXPECT_EQ(json.at("timing").at("rows").size(), 10u);
}

TEST(CliInfoRun, HumanTableNamesUnitsAndRows) {
  InfoOptions options;
  options.backend = BackendChoice::kHost;
  options.granules = 2;
  std::ostringstream out, err;
  ASSERT_EQ(run_info(options, out, err), kExitOk) << err.str();
  const std::string text = out.str();
  for (const char* expected : {"granule minimum", "µs", "pooled commit", "fresh commit",
                               "raw create+map+set_access", "<= 1.15", "note: raw = "}) {
    EXPECT_NE(text.find(expected), std::string::npos) << expected << "\n" << text;
  }
}

TEST(CliInfoRun, BadRequestsExitTwoWithAMessage) {
  std::ostringstream out, err;
  InfoOptions bad_granule;
  bad_granule.backend = BackendChoice::kHost;
  bad_granule.host_granule = page_size() + 1;
  EXPECT_EQ(run_info(bad_granule, out, err), kExitUsage);
  EXPECT_NE(err.str().find("--host-granule"), std::string::npos) << err.str();

  InfoOptions no_samples;
  no_samples.backend = BackendChoice::kHost;
  no_samples.granules = 0;
  EXPECT_EQ(run_info(no_samples, out, err), kExitUsage);
  EXPECT_TRUE(out.str().empty()) << "nothing is reported from a refused request";
}

TEST(CliInfoRun, CudaWithoutAGpuExitsTwo) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present; this checks the no-GPU path";
  InfoOptions options;
  options.backend = BackendChoice::kCuda;
  std::ostringstream out, err;
  EXPECT_EQ(run_info(options, out, err), kExitUsage);
  EXPECT_NE(err.str().find("UNAVAILABLE"), std::string::npos) << err.str();
  EXPECT_TRUE(out.str().empty());
}

}  // namespace
}  // namespace kvvm::cli
