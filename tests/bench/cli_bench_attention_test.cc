// `kvvm bench decode` and `kvvm bench prefill`: help, bad values refused before any device is
// touched (named in the error), the causal flop count and row keys, and a clean failure
// without the kernels or a GPU. On a GPU a tiny run of each checks the JSON and the baseline
// columns.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/drivers/attention/prefill_attention.h"
#include "kit/cli_common.h"
#include "kvvm/kernels/attention.h"
#include "kvvm/vmm/cuda_driver.h"
#include "support/cli_run.h"

namespace kvvm::cli {
namespace {

using test::scratch_dir;

using test::CliRun;
using test::contains;
using test::run;

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream file(path);
  return nlohmann::json::parse(file, nullptr, false);
}

// Whether a valid command can run here: the kernels are built and a CUDA device opens.
bool gpu_here() { return attention_kernels_built() && make_cuda_driver().ok(); }

// A valid command without the kernels or without a device: a clean failure naming the command.
void expect_clean_failure(const CliRun& result, const std::string& command) {
  EXPECT_NE(result.code, kExitOk) << result.out;
  EXPECT_TRUE(contains(result.err, command + ": ")) << result.err;
  EXPECT_FALSE(contains(result.err, "internal error")) << result.err;
  if (!attention_kernels_built()) {
    EXPECT_EQ(result.code, kExitFailure);
    EXPECT_TRUE(contains(result.err, "needs the CUDA kernels")) << result.err;
  }
}

TEST(CliBenchAttention, HelpListsTheOptionsAndTheDefaultRows) {
  const CliRun decode = run({"bench", "decode", "--help"});
  EXPECT_EQ(decode.code, kExitOk) << decode.err;
  for (const char* part :
       {"--shape", "--layout", "--element", "--chunk", "--baseline", "--json", "8,16384,32/8,128",
        "64,2048,64/8,128", "128,1024,14/2,64", "bench prefill"}) {
    EXPECT_TRUE(contains(decode.out, part)) << part << "\n" << decode.out;
  }
  EXPECT_FALSE(contains(decode.out, "--prefill-tokens")) << decode.out;
  const CliRun prefill = run({"bench", "prefill", "--help"});
  EXPECT_EQ(prefill.code, kExitOk) << prefill.err;
  for (const char* part :
       {"--case", "--chunk", "--heads", "--head-dim", "--layout", "--element", "--iterations",
        "--samples", "--baseline", "--json", "16384", "4096:512"}) {
    EXPECT_TRUE(contains(prefill.out, part)) << part << "\n" << prefill.out;
  }
}

TEST(CliBenchAttention, BadValuesAreRefusedByName) {
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> named;  // what the error must name
  };
  const std::vector<Case> cases = {
      {{"bench", "decode", "--shape", "1,0,32/8,128"}, {"'1,0,32/8,128'"}},
      {{"bench", "decode", "--shape", "4,1024,30/8,128"}, {"'4,1024,30/8,128'"}},
      {{"bench", "decode", "--shape", "4,1024,32/8"}, {"'4,1024,32/8'"}},
      {{"bench", "decode", "--layout", "diagonal"}, {"diagonal"}},
      {{"bench", "decode", "--element", "fp8"}, {"--element", "fp8"}},
      {{"bench", "decode", "--prefill-tokens", "4096"}, {"--prefill-tokens"}},
      {{"bench", "prefill", "--case", "0"}, {"--case", "0"}},
      {{"bench", "prefill", "--case", "2000000"}, {"--case", "2000000", "1048576"}},
      {{"bench", "prefill", "--chunk", "4096"}, {"'4096'", "START:TOKENS"}},
      {{"bench", "prefill", "--chunk", "4096:0"}, {"'4096:0'"}},
      {{"bench", "prefill", "--chunk", "-1:64"}, {"'-1:64'"}},
      {{"bench", "prefill", "--chunk", "1048576:1"}, {"'1048576:1'", "1048576"}},
      {{"bench", "prefill", "--case", "1024", "--chunk", "a:b"}, {"'a:b'"}},
      {{"bench", "prefill", "--heads", "32/7"}, {"'32/7'"}},
      {{"bench", "prefill", "--heads", "0/8"}, {"'0/8'"}},
      {{"bench", "prefill", "--heads", "32"}, {"'32'"}},
      {{"bench", "prefill", "--head-dim", "96"}, {"head dim 96", "64 or 128"}},
      {{"bench", "prefill", "--layout", "diagonal"}, {"diagonal"}},
      {{"bench", "prefill", "--element", "fp32"}, {"--element", "fp32"}},
  };
  for (const Case& c : cases) {
    const CliRun result = run(c.args);
    const std::string shown = ::testing::PrintToString(c.args);
    EXPECT_EQ(result.code, kExitUsage) << shown << "\n" << result.err;
    EXPECT_FALSE(contains(result.err, "internal error")) << shown << "\n" << result.err;
    EXPECT_FALSE(contains(result.err, "needs the CUDA kernels")) << shown << "\n" << result.err;
    for (const std::string& part : c.named) {
      EXPECT_TRUE(contains(result.err, part)) << shown << ": no '" << part << "' in\n"
                                              << result.err;
    }
  }
}

TEST(CliBenchAttention, ChunksKeysAndTheCausalFlopCount) {
  PrefillCase chunk;
  std::string error;
  ASSERT_TRUE(parse_prefill_chunk("4096:512", chunk, error)) << error;
  EXPECT_EQ(chunk.start, 4096u);
  EXPECT_EQ(chunk.tokens, 512u);
  ASSERT_TRUE(parse_prefill_chunk("0:1", chunk, error)) << error;
  EXPECT_EQ(chunk.start, 0u);
  for (const char* text : {"", ":", "1:", ":1", "1:2:3", "0x10:4", "1 :4", "4:+4", "1048575:2"}) {
    EXPECT_FALSE(parse_prefill_chunk(text, chunk, error)) << text;
    EXPECT_TRUE(contains(error, std::string("'") + text + "'")) << error;
  }
  EXPECT_EQ(prefill_key({4096, 512}, 32, 8, 128), "512@4096,32/8,128");
  EXPECT_EQ(prefill_key({0, 1024}, 14, 2, 64), "1024@0,14/2,64");
  // From position 0, T rows see 1 + 2 + ... + T keys: 4 Hq D T (T + 1) / 2 flops.
  EXPECT_DOUBLE_EQ(prefill_flops({0, 1024}, 32, 128), 4.0 * 32 * 128 * 1024 * 1025 / 2);
  EXPECT_DOUBLE_EQ(prefill_flops({0, 1}, 1, 64), 4.0 * 64);
  // A chunk of 512 at 4096: row i sees 4096 + i + 1 keys.
  double keys = 0;
  for (int i = 0; i < 512; ++i) keys += 4096 + i + 1;
  EXPECT_DOUBLE_EQ(prefill_flops({4096, 512}, 32, 128), 4.0 * 32 * 128 * keys);
}

TEST(CliBenchAttention, DecodeRunsOrFailsCleanly) {
  const std::filesystem::path dir = scratch_dir("kvvm_bench_attention");
  {
    std::ofstream baseline(dir / "sdpa.json");
    baseline << R"({"rows": [{"shape": "2,512,8/2,128", "ms": 1.0, "backend": "flash"}]})";
  }
  const CliRun result =
      run({"bench", "decode", "--shape", "2,512,8/2,128", "--layout", "token-major", "--iterations",
           "2", "--samples", "3", "--baseline", (dir / "sdpa.json").string(), "--json",
           (dir / "decode.json").string()});
  if (!gpu_here()) {
    expect_clean_failure(result, "kvvm bench decode");
  } else {
    ASSERT_EQ(result.code, kExitOk) << result.err;
    const nlohmann::json json = read_json(dir / "decode.json");
    ASSERT_FALSE(json.is_discarded());
    EXPECT_EQ(json["benchmark"], "decode");
    EXPECT_EQ(json["element"], "fp16");
    ASSERT_EQ(json["rows"].size(), 1u);
    const nlohmann::json& row = json["rows"][0];
    EXPECT_EQ(row["shape"], "2,512,8/2,128");
    EXPECT_EQ(row["layout"], "token-major");
    EXPECT_GT(row["ms"].get<double>(), 0.0);
    EXPECT_EQ(row["kv_bytes"], 2u * 512 * 2 * 2 * 128 * 2);
    EXPECT_DOUBLE_EQ(row["torch_ms"].get<double>(), 1.0);
    EXPECT_DOUBLE_EQ(row["ratio_torch_over_ours"].get<double>(), 1.0 / row["ms"].get<double>());
  }
  std::filesystem::remove_all(dir);
}

TEST(CliBenchAttention, PrefillRunsOrFailsCleanly) {
  const std::filesystem::path dir = scratch_dir("kvvm_bench_attention");
  {
    std::ofstream baseline(dir / "sdpa.json");
    baseline << R"({"rows": [], "prefill_rows": [)"
             << R"({"key": "64@128,8/2,64", "ms": 2.0, "backend": "flash"}]})";
  }
  const CliRun result = run({"bench",        "prefill",
                             "--case",       "256",
                             "--chunk",      "128:64",
                             "--heads",      "8/2",
                             "--head-dim",   "64",
                             "--layout",     "all",
                             "--element",    "bf16",
                             "--iterations", "1",
                             "--samples",    "1",
                             "--baseline",   (dir / "sdpa.json").string(),
                             "--json",       (dir / "prefill.json").string()});
  if (!gpu_here()) {
    expect_clean_failure(result, "kvvm bench prefill");
  } else {
    ASSERT_EQ(result.code, kExitOk) << result.err;
    const nlohmann::json json = read_json(dir / "prefill.json");
    ASSERT_FALSE(json.is_discarded());
    EXPECT_EQ(json["benchmark"], "prefill");
    EXPECT_EQ(json["element"], "bf16");
    ASSERT_EQ(json["rows"].size(), 6u);  // 2 rows x 3 layouts
    for (const nlohmann::json& row : json["rows"]) {
      const double ms = row["ms"].get<double>();
      EXPECT_GT(ms, 0.0) << row;
      const bool chunk = row["key"] == "64@128,8/2,64";
      EXPECT_TRUE(chunk || row["key"] == "256@0,8/2,64") << row;
      const PrefillCase shape{chunk ? 128u : 0u, chunk ? 64u : 256u};
      EXPECT_EQ(row["start"], shape.start);
      EXPECT_EQ(row["tokens"], shape.tokens);
      EXPECT_DOUBLE_EQ(row["flops"].get<double>(), prefill_flops(shape, 8, 64));
      EXPECT_DOUBLE_EQ(row["torch_ms"].get<double>(), chunk ? 2.0 : 0.0) << row;
      EXPECT_EQ(row["torch_backend"], chunk ? "flash" : "") << row;
      EXPECT_DOUBLE_EQ(row["ratio_torch_over_ours"].get<double>(), chunk ? 2.0 / ms : 0.0);
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvvm::cli
