// `kvvm bench kv-error` on the CPU with a fixture checkpoint: an fp8 cache's last logits
// against the float32 cache's over a few random prompts. The error is there (e4m3 keeps three
// mantissa bits) and small (within the parity tests' fp8 tolerance, 3e-2); the same seed gives
// the same figures; calibrated scales change them; a prompt longer than the model's positions
// is refused by name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kit/cli_common.h"
#include "support/cli_run.h"
#include "support/test_data.h"

namespace kvvm::cli_kv_error_test {
namespace {

using cli::kExitOk;
using cli::kExitUsage;
using test::CliRun;
using test::contains;
using test::run;

std::vector<std::string> args(const std::vector<std::string>& extra,
                              const std::string& prompt_tokens = "24") {
  std::vector<std::string> a = {
      "bench",           "kv-error",   "--model",   test::model_fixture_dir("qwen2-tiny"),
      "--backend",       "cpu",        "--prompts", "4",
      "--prompt-tokens", prompt_tokens};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(CliKvError, ReportsASmallNonZeroErrorTheSameForTheSameSeed) {
  const CliRun first = run(args({"--json"}));
  ASSERT_EQ(first.code, kExitOk) << first.err;
  const nlohmann::json report = nlohmann::json::parse(first.out);
  EXPECT_EQ(report["backend"], "cpu");
  EXPECT_EQ(report["reference_kv_dtype"], "fp32");
  EXPECT_EQ(report["prompts"], 4);
  const double mean = report["relative_error"]["mean"], most = report["relative_error"]["max"];
  EXPECT_GT(mean, 0.0);
  EXPECT_LE(mean, most);
  EXPECT_LT(most, 3e-2);
  EXPECT_LE(report["greedy_agree"].get<int>(), 4);
  EXPECT_TRUE(contains(first.err, "kvvm bench kv-error: 4 / 4 prompts")) << first.err;
  EXPECT_EQ(run(args({"--json"})).out, first.out);

  const CliRun calibrated = run(args({"--json", "--kv-scales", "calibrate"}));
  ASSERT_EQ(calibrated.code, kExitOk) << calibrated.err;
  const nlohmann::json measured = nlohmann::json::parse(calibrated.out);
  EXPECT_NE(measured["kv_scales"].get<std::string>().find("calibrated on the first prefill"),
            std::string::npos)
      << measured["kv_scales"];
  EXPECT_NE(measured["relative_error"], report["relative_error"]);

  const CliRun text = run(args({}));
  ASSERT_EQ(text.code, kExitOk) << text.err;
  EXPECT_TRUE(contains(text.out,
                       "relative error of the last logits (max |fp8 - fp32| / max "
                       "|fp32|): mean "))
      << text.out;
}

TEST(CliKvError, APromptBeyondThePositionsIsRefusedByName) {
  const CliRun refused = run(args({}, "100000"));
  EXPECT_EQ(refused.code, kExitUsage) << refused.err;
  EXPECT_TRUE(contains(refused.err,
                       "--prompt-tokens 100000 is beyond the config's "
                       "max_position_embeddings"))
      << refused.err;
}

}  // namespace
}  // namespace kvvm::cli_kv_error_test
