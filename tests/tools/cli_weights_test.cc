// The weight options on the command line, on the CPU: `kvvm generate --load-format dummy` runs
// from a config and a tokenizer alone; with --weight-budget streaming half the layers it prints
// the same tokens and says the split; a budget below what streaming needs is refused naming the
// least; `kvvm bench engine` reports the weights in its JSON.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kit/cli_common.h"
#include "kvvm/model/config.h"
#include "kvvm/model/weight_memory.h"
#include "support/cli_run.h"
#include "support/test_data.h"

namespace kvvm::cli::weights_test {
namespace {

using test::contains;
using test::run;

constexpr std::uint32_t kLayers = 8;

// The tiny Qwen2 fixture's config with eight layers and its tokenizer; no weights.
std::string dummy_model_dir() {
  const std::filesystem::path dir = test::scratch_dir("kvvm_cli_weights");
  const std::filesystem::path fixture = test::model_fixture_dir("qwen2-tiny");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(fixture / "config.json"));
  config["num_hidden_layers"] = kLayers;
  std::ofstream(dir / "config.json") << config.dump();
  std::filesystem::copy_file(fixture / "tokenizer.json", dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  return dir.string();
}

std::vector<std::string> generate_args(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> args = {"generate",  "--model",       dir,     "--backend",
                                   "cpu",       "--load-format", "dummy", "--prompt-ids",
                                   "5,17,99,3", "--max-tokens",  "12",    "--ignore-eos",
                                   "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The budget that streams `streamed` of the layers on the CPU backend (fp32, page granule).
std::string budget_streaming(const std::string& dir, std::uint32_t streamed) {
  auto config = model::load_model_config(dir);
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  return std::to_string(model::weight_budget_for(model::weight_sizes(*config, DType::kFp32), 4096,
                                                 streamed, model::kDefaultRingSlots));
}

TEST(CliWeights, DummyWeightsStreamedGiveTheResidentTokensAndSayTheSplit) {
  const std::string dir = dummy_model_dir();
  const test::CliRun resident = run(generate_args(dir, {}));
  ASSERT_EQ(resident.code, kExitOk) << resident.err;
  // The bytes by stored type follow the placement: fp32 alone on the CPU.
  EXPECT_TRUE(contains(resident.err, "all 8 layers resident [fp32 ")) << resident.err;
  EXPECT_TRUE(contains(resident.err, "] (dummy weights)")) << resident.err;
  const test::CliRun streamed =
      run(generate_args(dir, {"--weight-budget", budget_streaming(dir, 4), "--ring-slots", "2"}));
  ASSERT_EQ(streamed.code, kExitOk) << streamed.err;
  EXPECT_TRUE(contains(streamed.err, "4 of 8 layers resident, a ring of 2 slots")) << streamed.err;
  EXPECT_TRUE(contains(streamed.err, "4 layers streamed from host memory")) << streamed.err;
  const nlohmann::json a = nlohmann::json::parse(resident.out);
  const nlohmann::json b = nlohmann::json::parse(streamed.out);
  ASSERT_EQ(a["token_ids"].size(), 12u);
  EXPECT_EQ(a["token_ids"], b["token_ids"]);
}

// On the CPU the weights are in host memory, and the start line says so: a newcomer's first run
// (no GPU) used to read "on the device".
TEST(CliWeights, TheStartLineOfACpuRunSaysTheWeightsAreInHostMemory) {
  const std::string dir = dummy_model_dir();
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{}, {"--weight-budget", budget_streaming(dir, 4)}}) {
    const test::CliRun generate = run(generate_args(dir, extra));
    ASSERT_EQ(generate.code, kExitOk) << generate.err;
    EXPECT_TRUE(contains(generate.err, "kvvm generate: weights: ")) << generate.err;
    EXPECT_TRUE(contains(generate.err, " in host memory")) << generate.err;
    EXPECT_FALSE(contains(generate.err, "on the device")) << generate.err;
  }
  // `kvvm plan` sizes a device's memory, so it keeps saying so.
  const test::CliRun plan = run({"plan", "--model", "llama-3-8b", "--layout", "token-major",
                                 "--weight-budget", "100GiB", "--budget", "130GiB"});
  ASSERT_EQ(plan.code, kExitOk) << plan.err;
  EXPECT_TRUE(contains(plan.out, "on the device")) << plan.out;
}

TEST(CliWeights, ABudgetBelowWhatStreamingNeedsIsRefusedNamingTheLeast) {
  const std::string dir = dummy_model_dir();
  const test::CliRun small = run(generate_args(dir, {"--weight-budget", "64KiB"}));
  EXPECT_EQ(small.code, kExitUsage) << small.err;
  EXPECT_TRUE(contains(small.err, "--weight-budget")) << small.err;
  EXPECT_TRUE(contains(small.err, "streaming needs at least")) << small.err;
  const test::CliRun one_slot = run(generate_args(dir, {"--ring-slots", "1"}));
  EXPECT_EQ(one_slot.code, kExitUsage) << one_slot.err;
  EXPECT_TRUE(contains(one_slot.err, "--ring-slots")) << one_slot.err;
  const test::CliRun format = run(generate_args(dir, {"--load-format", "gguf"}));
  EXPECT_EQ(format.code, kExitUsage) << format.err;
  EXPECT_TRUE(contains(format.err, "--load-format")) << format.err;
  // Without dummy, the folder's missing weights are named.
  const test::CliRun real = run(
      {"generate", "--model", dir, "--backend", "cpu", "--prompt-ids", "1,2", "--max-tokens", "2"});
  EXPECT_EQ(real.code, kExitUsage) << real.err;
  EXPECT_TRUE(contains(real.err, "no weights")) << real.err;
}

TEST(CliWeights, BenchEngineReportsTheWeights) {
  const std::string dir = dummy_model_dir();
  const test::CliRun bench = run({"bench",           "engine",
                                  "--model",         dir,
                                  "--backend",       "cpu",
                                  "--load-format",   "dummy",
                                  "--weight-budget", budget_streaming(dir, 5),
                                  "--max-context",   "32",
                                  "--batches",       "2",
                                  "--prompt-tokens", "4",
                                  "--decode-tokens", "3",
                                  "--no-trace",      "--json"});
  ASSERT_EQ(bench.code, kExitOk) << bench.err;
  const nlohmann::json report = nlohmann::json::parse(bench.out);
  const nlohmann::json& weights = report["weights"];
  EXPECT_TRUE(weights["dummy"].get<bool>());
  EXPECT_EQ(weights["streamed_layers"].get<int>(), 5);
  EXPECT_EQ(weights["ring_slots"].get<int>(), 2);
  EXPECT_GT(weights["streamed_bytes_per_step"].get<std::uint64_t>(), 0u);
  EXPECT_GT(weights["device_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_GT(weights["load_bytes"].get<std::uint64_t>(),
            weights["streamed_bytes_per_step"].get<std::uint64_t>());
  EXPECT_TRUE(contains(weights["placement"].get<std::string>(), "5 layers streamed"));
}

TEST(CliWeights, PlanShowsTheSplitAndTheKvGetsWhatTheWeightsLeave) {
  const test::CliRun plan = run({"plan", "--model", "llama-3-70b", "--layout", "token-major",
                                 "--weight-budget", "100GiB", "--budget", "130GiB", "--json"});
  ASSERT_EQ(plan.code, kExitOk) << plan.err;
  const nlohmann::json report = nlohmann::json::parse(plan.out);
  const nlohmann::json& weights = report["weights"];
  // 80 layers of 1.59 GiB (bf16) beside 3.9 GiB of embeddings: 58 resident and a ring of 2 in
  // 100 GiB, the other 22 streamed (what the H200 run placed too).
  EXPECT_EQ(weights["streamed_layers"].get<int>(), 22);
  EXPECT_EQ(weights["ring_slots"].get<int>(), 2);
  EXPECT_LE(weights["device_bytes"].get<std::uint64_t>(), std::uint64_t{100} << 30);
  EXPECT_EQ(report["budget_bytes"].get<std::uint64_t>(),
            (std::uint64_t{130} << 30) - weights["device_bytes"].get<std::uint64_t>());
  const test::CliRun text = run({"plan", "--model", "llama-3-70b", "--layout", "token-major",
                                 "--weight-budget", "100GiB", "--budget", "130GiB"});
  ASSERT_EQ(text.code, kExitOk) << text.err;
  EXPECT_TRUE(contains(text.out, "58 of 80 layers resident")) << text.out;
  EXPECT_TRUE(contains(text.out, "leaves the KV its budget B")) << text.out;
  const test::CliRun full =
      run({"plan", "--model", "llama-3-70b", "--weight-budget", "200GiB", "--budget", "100GiB"});
  EXPECT_EQ(full.code, kExitUsage) << full.err;
  EXPECT_TRUE(contains(full.err, "leaving nothing for the KV cache")) << full.err;
}

// A Llama-3-70B config quantized as Hugging Face's "fp8" writes it: the 70B model's FP8 weights
// fit where its bf16 ones streamed 22 layers, and the plan says the bytes by stored type.
TEST(CliWeights, PlanOfAnFp8CheckpointGivesTheBytesByType) {
  const std::filesystem::path dir = test::scratch_dir("kvvm_cli_weights_fp8");
  const nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                                 {"hidden_size", 8192},
                                 {"intermediate_size", 28672},
                                 {"num_hidden_layers", 80},
                                 {"num_attention_heads", 64},
                                 {"num_key_value_heads", 8},
                                 {"vocab_size", 128256},
                                 {"max_position_embeddings", 8192},
                                 {"rope_theta", 500000.0},
                                 {"rms_norm_eps", 1e-5},
                                 {"torch_dtype", "bfloat16"},
                                 {"tie_word_embeddings", false},
                                 {"quantization_config",
                                  {{"quant_method", "fp8"},
                                   {"activation_scheme", "dynamic"},
                                   {"weight_block_size", {128, 128}}}}};
  std::ofstream(dir / "config.json") << config.dump();
  const std::string path = (dir / "config.json").string();
  const test::CliRun plan =
      run({"plan", "--model", path, "--weight-budget", "100GiB", "--budget", "130GiB", "--json"});
  ASSERT_EQ(plan.code, kExitOk) << plan.err;
  const nlohmann::json weights = nlohmann::json::parse(plan.out)["weights"];
  EXPECT_EQ(weights["streamed_layers"].get<int>(), 0);
  EXPECT_EQ(weights["quantization"], "fp8-block128");
  const nlohmann::json& types = weights["bytes_by_dtype"];
  // 80 layers of 0.80 GiB of e4m3 projections (with their 128 x 128 block scales in fp32),
  // the embeddings and norms in bf16.
  const std::uint64_t fp8 = types["fp8"].get<std::uint64_t>();
  EXPECT_GT(fp8, std::uint64_t{63} << 30);
  EXPECT_LT(fp8, std::uint64_t{65} << 30);
  EXPECT_GT(types["bf16"].get<std::uint64_t>(), std::uint64_t{3} << 30);
  EXPECT_GT(types["fp32"].get<std::uint64_t>(), 0u);
  EXPECT_LT(types["fp32"].get<std::uint64_t>(), fp8 / 1000);
  const test::CliRun text =
      run({"plan", "--model", path, "--weight-budget", "100GiB", "--budget", "130GiB"});
  ASSERT_EQ(text.code, kExitOk) << text.err;
  EXPECT_TRUE(contains(text.out, "all 80 layers resident [fp8 ")) << text.out;
}

}  // namespace
}  // namespace kvvm::cli::weights_test
