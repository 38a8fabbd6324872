// A mixture of experts from the command line, on the CPU: `kvvm generate --load-format dummy`
// runs a Qwen3-MoE config (experts, a dense layer among sparse ones) and says the experts' bytes
// apart from the dense part; with its experts cached under a weight budget it prints the
// resident run's tokens and the cache's counts;
// `kvvm plan` gives the published MoE shapes' expert bytes in its JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kit/cli_common.h"
#include "kvvm/model/config.h"
#include "kvvm/model/kv_config.h"
#include "kvvm/model/weight_memory.h"
#include "support/cli_run.h"
#include "support/test_data.h"

namespace kvvm::cli::moe_test {
namespace {

using test::contains;
using test::run;

// The tiny Qwen3 fixture's config as a Qwen3-MoE of six layers (layer 2 dense), with its
// tokenizer; no weights.
std::string dummy_moe_dir() {
  const std::filesystem::path dir = test::scratch_dir("kvvm_cli_moe");
  const std::filesystem::path fixture = test::model_fixture_dir("qwen3-tiny");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(fixture / "config.json"));
  config["architectures"] = {"Qwen3MoeForCausalLM"};
  config["model_type"] = "qwen3_moe";
  config["num_hidden_layers"] = 6;
  config["num_experts"] = 8;
  config["num_experts_per_tok"] = 2;
  config["moe_intermediate_size"] = 64;
  config["norm_topk_prob"] = true;
  config["mlp_only_layers"] = {2};
  std::ofstream(dir / "config.json") << config.dump();
  std::filesystem::copy_file(fixture / "tokenizer.json", dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  return dir.string();
}

std::vector<std::string> generate_args(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> args = {"generate",  "--model",       dir,     "--backend",
                                   "cpu",       "--load-format", "dummy", "--prompt-ids",
                                   "5,17,99,3", "--max-tokens",  "10",    "--ignore-eos",
                                   "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(CliMoe, DummyExpertsRunResidentAndCachedToTheSameTokens) {
  const std::string dir = dummy_moe_dir();
  const test::CliRun resident = run(generate_args(dir, {}));
  ASSERT_EQ(resident.code, kExitOk) << resident.err;
  EXPECT_TRUE(contains(resident.err, "; experts ")) << resident.err;
  EXPECT_TRUE(contains(resident.err, "(5 layers x 8 x ")) << resident.err;
  EXPECT_TRUE(contains(resident.err, "dense part ")) << resident.err;
  EXPECT_TRUE(contains(resident.err, "Qwen3MoeForCausalLM")) << resident.err;

  auto config = model::load_model_config(dir);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  const std::string budget = std::to_string(
      model::expert_cache_budget_for(model::weight_sizes(*config, DType::kFp32), 4096, 12));
  const test::CliRun cached = run(generate_args(dir, {"--weight-budget", budget}));
  ASSERT_EQ(cached.code, kExitOk) << cached.err;
  EXPECT_TRUE(contains(cached.err, "an expert cache of 12 slots of ")) << cached.err;
  EXPECT_TRUE(contains(cached.err, "for 40 experts")) << cached.err;
  const nlohmann::json a = nlohmann::json::parse(resident.out);
  const nlohmann::json b = nlohmann::json::parse(cached.out);
  ASSERT_EQ(a["token_ids"].size(), 10u);
  EXPECT_EQ(a["token_ids"], b["token_ids"]);
  EXPECT_FALSE(a.contains("expert_cache"));
  ASSERT_TRUE(b.contains("expert_cache")) << cached.out;
  EXPECT_EQ(b["expert_cache"]["slots"], 12);
  EXPECT_EQ(b["expert_cache"]["hits"].get<std::uint64_t>() +
                b["expert_cache"]["misses"].get<std::uint64_t>(),
            b["expert_cache"]["lookups"].get<std::uint64_t>());
  EXPECT_GT(b["expert_cache"]["misses"].get<std::uint64_t>(), 0u);

  // Streamed with their layers instead, the same tokens again.
  const std::string layers = std::to_string(model::weight_budget_for(
      model::weight_sizes(*config, DType::kFp32), 4096, 3, model::kDefaultRingSlots));
  const test::CliRun streamed =
      run(generate_args(dir, {"--weight-budget", layers, "--expert-placement", "layers"}));
  ASSERT_EQ(streamed.code, kExitOk) << streamed.err;
  EXPECT_TRUE(contains(streamed.err, "3 layers streamed from host memory")) << streamed.err;
  EXPECT_EQ(a["token_ids"], nlohmann::json::parse(streamed.out)["token_ids"]);
  const test::CliRun bad = run(generate_args(dir, {"--expert-placement", "nowhere"}));
  EXPECT_NE(bad.code, kExitOk);
  EXPECT_TRUE(contains(bad.err, "--expert-placement")) << bad.err;

  // The text form says the hit rate and the bytes per token.
  std::vector<std::string> text = generate_args(dir, {"--weight-budget", budget});
  text.erase(std::find(text.begin(), text.end(), "--json"));
  const test::CliRun said = run(text);
  ASSERT_EQ(said.code, kExitOk) << said.err;
  EXPECT_TRUE(contains(said.err, "expert cache: 12 slots for 40 experts, hit rate ")) << said.err;
  EXPECT_TRUE(contains(said.err, " per token over 14 tokens")) << said.err;
}

TEST(CliMoe, PlanSaysThePublishedShapesExpertBytes) {
  const test::CliRun plan = run({"plan", "--model", "qwen3-30b-a3b", "--layout", "token-major",
                                 "--weight-budget", "70GiB", "--budget", "80GiB", "--json"});
  ASSERT_EQ(plan.code, kExitOk) << plan.err;
  const nlohmann::json json = nlohmann::json::parse(plan.out);
  // 48 layers x 128 experts x 3 x 768 x 2048 bf16.
  EXPECT_EQ(json["weights"]["expert_bytes"], 48ull * 128 * 3 * 768 * 2048 * 2);
  EXPECT_EQ(
      json["weights"]["dense_bytes"].get<std::uint64_t>() +
          json["weights"]["expert_bytes"].get<std::uint64_t>(),
      model::weight_sizes(*model::builtin_model_config("qwen3-30b-a3b"), DType::kBf16).total());
  const test::CliRun text = run({"plan", "--model", "mixtral-8x7b", "--layout", "token-major",
                                 "--weight-budget", "64GiB", "--budget", "80GiB"});
  ASSERT_EQ(text.code, kExitOk) << text.err;
  EXPECT_TRUE(contains(text.out, "experts 84 GiB (32 layers x 8 x 336 MiB)")) << text.out;
  // 64 GiB does not hold Mixtral's 87 GiB: its experts are cached, as the CUDA backend places
  // them (2.99 GiB dense, 180 or so slots of 336 MiB in the rest).
  EXPECT_TRUE(contains(text.out, "an expert cache of ")) << text.out;
  const test::CliRun cached = run({"plan", "--model", "mixtral-8x7b", "--layout", "token-major",
                                   "--weight-budget", "64GiB", "--budget", "80GiB", "--json"});
  ASSERT_EQ(cached.code, kExitOk) << cached.err;
  const nlohmann::json placed = nlohmann::json::parse(cached.out)["weights"];
  EXPECT_GT(placed["expert_slots"].get<std::uint32_t>(), 150u);
  EXPECT_LT(placed["expert_slots"].get<std::uint32_t>(), 256u);
  EXPECT_EQ(placed["streamed_layers"], 0);
  EXPECT_LE(placed["device_bytes"].get<std::uint64_t>(), std::uint64_t{64} << 30);
}

}  // namespace
}  // namespace kvvm::cli::moe_test
