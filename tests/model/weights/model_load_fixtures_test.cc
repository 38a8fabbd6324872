// The checkpoints transformers saved (tests/data/models, made by scripts/make_fixtures.py, and
// the demo model models/kvvm-adder) load: config.json in transformers v5's form
// (rope_parameters, dtype, layer_types), generation_config.json's ids, the safetensors file,
// and every tensor bound with the shapes the config gives.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvvm/model/config.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "support/test_data.h"

namespace kvvm::model {
namespace {

struct Expected {
  const char* name;
  const char* architecture;
  std::uint32_t hidden, intermediate, layers, heads, kv_heads, head_dim, vocab;
  RopeScaling scaling;
  double theta;
  bool tied, qkv_bias, qk_norm;
  std::vector<std::int32_t> bos, eos;
};

const std::vector<Expected>& fixtures() {
  static const std::vector<Expected> all = {
      // GQA 4:2, head_dim 64 over hidden 128 (q is 256 wide), llama3 scaling, untied.
      {"llama-tiny",
       "LlamaForCausalLM",
       128,
       384,
       2,
       4,
       2,
       64,
       1024,
       RopeScaling::kLlama3,
       10000.0,
       false,
       false,
       false,
       {1019},
       {1023}},
      {"llama-tiny-bf16",
       "LlamaForCausalLM",
       128,
       384,
       2,
       4,
       2,
       64,
       1024,
       RopeScaling::kLlama3,
       10000.0,
       false,
       false,
       false,
       {1019},
       {1023}},
      // q/k/v biases, tied embeddings, no bos.
      {"qwen2-tiny",
       "Qwen2ForCausalLM",
       128,
       384,
       2,
       2,
       1,
       64,
       674,
       RopeScaling::kNone,
       1e6,
       true,
       true,
       false,
       {},
       {673}},
      {"qwen2-tiny-bf16",
       "Qwen2ForCausalLM",
       128,
       384,
       2,
       2,
       1,
       64,
       674,
       RopeScaling::kNone,
       1e6,
       true,
       true,
       false,
       {},
       {673}},
      // q/k norms, head_dim 64 over hidden 128 (q is 256 wide), no biases, untied; the
      // Qwen2-style vocabulary with <think> and </think> added.
      {"qwen3-tiny",
       "Qwen3ForCausalLM",
       128,
       384,
       2,
       4,
       2,
       64,
       676,
       RopeScaling::kNone,
       1e6,
       false,
       false,
       true,
       {},
       {673}},
      {"qwen3-tiny-bf16",
       "Qwen3ForCausalLM",
       128,
       384,
       2,
       4,
       2,
       64,
       676,
       RopeScaling::kNone,
       1e6,
       false,
       false,
       true,
       {},
       {673}},
  };
  return all;
}

DType expected_dtype(const std::string& dir) {
  std::ifstream file(dir + "/expected.json");
  const nlohmann::json expected = nlohmann::json::parse(file);
  return expected.at("dtype") == "bfloat16" ? DType::kBf16 : DType::kFp32;
}

TEST(ModelFixtures, EveryFixtureLoadsWithItsNumbers) {
  for (const Expected& want : fixtures()) {
    SCOPED_TRACE(want.name);
    const std::string dir = test::model_fixture_dir(want.name);
    Result<ModelConfig> config = load_model_config(dir);
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    EXPECT_EQ(config->architecture, want.architecture);
    EXPECT_EQ(config->hidden_size, want.hidden);
    EXPECT_EQ(config->intermediate_size, want.intermediate);
    EXPECT_EQ(config->layers, want.layers);
    EXPECT_EQ(config->heads, want.heads);
    EXPECT_EQ(config->kv_heads, want.kv_heads);
    EXPECT_EQ(config->head_dim, want.head_dim);
    EXPECT_EQ(config->vocab_size, want.vocab);
    EXPECT_EQ(config->rope.scaling, want.scaling);
    EXPECT_DOUBLE_EQ(config->rope.theta, want.theta);
    EXPECT_EQ(config->tie_word_embeddings, want.tied);
    EXPECT_EQ(config->qkv_bias, want.qkv_bias);
    EXPECT_FALSE(config->o_bias);
    EXPECT_EQ(config->qk_norm, want.qk_norm);
    EXPECT_EQ(config->max_position_embeddings, 512u);
    EXPECT_EQ(config->bos_token_ids, want.bos);
    EXPECT_EQ(config->eos_token_ids, want.eos);
    const DType dtype = expected_dtype(dir);
    EXPECT_EQ(config->dtype, dtype);
    if (want.scaling == RopeScaling::kLlama3) {
      EXPECT_DOUBLE_EQ(config->rope.factor, 8.0);
      EXPECT_DOUBLE_EQ(config->rope.low_freq_factor, 1.0);
      EXPECT_DOUBLE_EQ(config->rope.high_freq_factor, 4.0);
      EXPECT_EQ(config->rope.original_max_position, 64u);
    }

    Result<std::unique_ptr<WeightFiles>> files = WeightFiles::open_dir(dir);
    ASSERT_TRUE(files.ok()) << files.status().to_string();
    Result<ModelWeights> weights = bind_weights(*config, **files);
    ASSERT_TRUE(weights.ok()) << weights.status().to_string();
    ASSERT_EQ(weights->layers.size(), want.layers);
    EXPECT_EQ(weights->lm_head == weights->embed, want.tied);
    const TensorDType tensor_dtype = dtype == DType::kBf16 ? TensorDType::kBf16 : TensorDType::kF32;
    EXPECT_EQ(weights->embed->dtype, tensor_dtype);
    for (const LayerWeights& layer : weights->layers) {
      EXPECT_EQ(layer.q->shape, (std::vector<std::uint64_t>{
                                    std::uint64_t{want.heads} * want.head_dim, want.hidden}));
      EXPECT_EQ(layer.o->shape, (std::vector<std::uint64_t>{
                                    want.hidden, std::uint64_t{want.heads} * want.head_dim}));
      EXPECT_EQ(layer.k_bias != nullptr, want.qkv_bias);
      EXPECT_EQ(layer.q_norm != nullptr, want.qk_norm);
      if (want.qk_norm) {
        EXPECT_EQ(layer.k_norm->shape, std::vector<std::uint64_t>{want.head_dim});
      }
      EXPECT_EQ(layer.down->dtype, tensor_dtype);
    }
  }
}

TEST(ModelFixtures, TheDemoModelLoads) {
  const std::string dir =
      (test::data_dir().parent_path().parent_path() / "models" / "kvvm-adder").string();
  Result<ModelConfig> config = load_model_config(dir);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(config->layers, 4u);
  EXPECT_EQ(config->heads, 4u);
  EXPECT_EQ(config->kv_heads, 2u);
  EXPECT_EQ(config->head_dim, 64u);
  EXPECT_EQ(config->dtype, DType::kBf16);
  Result<std::unique_ptr<WeightFiles>> files = WeightFiles::open_dir(dir);
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  Result<ModelWeights> weights = bind_weights(*config, **files);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  EXPECT_EQ(weights->lm_head, weights->embed);
}

}  // namespace
}  // namespace kvvm::model
