// ModelConfig's RoPE: transformers v5's rope_parameters and the older rope_theta +
// rope_scaling, both parsed (llama3 and linear scaling included), checked against each other
// when a file carries both, and a scaling this runtime does not implement refused by name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "kvvm/model/config.h"
#include "support/model_config_json.h"

namespace kvvm::model {
namespace {

using namespace test::model_config;  // llama(), parse(), refusal(), contains()

nlohmann::json llama3_scaling() {
  return {{"rope_type", "llama3"},
          {"factor", 8.0},
          {"low_freq_factor", 1.0},
          {"high_freq_factor", 4.0},
          {"original_max_position_embeddings", 8192}};
}

void expect_llama3(const ModelConfig& config) {
  EXPECT_DOUBLE_EQ(config.rope.theta, 500000.0);
  EXPECT_EQ(config.rope.scaling, RopeScaling::kLlama3);
  EXPECT_DOUBLE_EQ(config.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(config.rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(config.rope.high_freq_factor, 4.0);
  EXPECT_EQ(config.rope.original_max_position, 8192u);
}

TEST(ModelConfigRope, LegacyRopeScalingLlama3AndLinear) {
  nlohmann::json json = llama();
  json["rope_scaling"] = llama3_scaling();
  json["rope_scaling"]["low_freq_factor"] = 2.0;
  json["rope_scaling"]["high_freq_factor"] = 6.0;
  json["rope_scaling"]["original_max_position_embeddings"] = 4096;
  Result<ModelConfig> config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->rope.scaling, RopeScaling::kLlama3);
  EXPECT_DOUBLE_EQ(config->rope.low_freq_factor, 2.0);
  EXPECT_DOUBLE_EQ(config->rope.high_freq_factor, 6.0);
  EXPECT_EQ(config->rope.original_max_position, 4096u);

  json["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // the older "type" key
  config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->rope.scaling, RopeScaling::kLinear);
  EXPECT_DOUBLE_EQ(config->rope.factor, 2.0);
  EXPECT_DOUBLE_EQ(config->rope.theta, 500000.0);

  json["rope_scaling"] = {{"rope_type", "default"}};
  config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->rope.scaling, RopeScaling::kNone);

  json["rope_scaling"] = nullptr;
  config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->rope.scaling, RopeScaling::kNone);
}

TEST(ModelConfigRope, TransformersV5RopeParameters) {
  nlohmann::json json = llama();
  json.erase("rope_theta");
  json["rope_parameters"] = llama3_scaling();
  json["rope_parameters"]["rope_theta"] = 500000.0;
  Result<ModelConfig> config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  expect_llama3(*config);

  json["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->rope.scaling, RopeScaling::kNone);
  EXPECT_DOUBLE_EQ(config->rope.theta, 1e6);

  json["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 1e4}};
  config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->rope.scaling, RopeScaling::kLinear);
  EXPECT_DOUBLE_EQ(config->rope.factor, 4.0);

  // One set per attention kind (Gemma-style) is not one of the families' forms.
  json["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}};
  EXPECT_TRUE(contains(refusal(json), "rope_parameters.full_attention"));
}

TEST(ModelConfigRope, BothRopeFormsMustAgree) {
  nlohmann::json json = llama();
  json["rope_scaling"] = llama3_scaling();
  json["rope_parameters"] = llama3_scaling();
  json["rope_parameters"]["rope_theta"] = 500000.0;
  Result<ModelConfig> config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  expect_llama3(*config);

  json["rope_parameters"]["factor"] = 16.0;
  std::string message = refusal(json);
  EXPECT_TRUE(contains(message, "disagree")) << message;

  json["rope_parameters"]["factor"] = 8.0;
  json["rope_theta"] = 10000.0;
  message = refusal(json);
  EXPECT_TRUE(contains(message, "disagree")) << message;
}

TEST(ModelConfigRope, UnknownRopeScalingIsRefusedByName) {
  for (const char* type : {"yarn", "dynamic", "longrope", "su"}) {
    nlohmann::json json = llama();
    json["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}};
    std::string message = refusal(json);
    EXPECT_TRUE(contains(message, std::string("\"") + type + "\"")) << message;
    EXPECT_TRUE(contains(message, "rope_scaling.rope_type")) << message;

    json.erase("rope_scaling");
    json["rope_parameters"] = {{"rope_type", type}, {"factor", 4.0}};
    message = refusal(json);
    EXPECT_TRUE(contains(message, std::string("\"") + type + "\"")) << message;
    EXPECT_TRUE(contains(message, "rope_parameters.rope_type")) << message;
  }
}

TEST(ModelConfigRope, RopeParametersAreChecked) {
  nlohmann::json json = llama();
  json["rope_scaling"] = llama3_scaling();
  json["rope_scaling"].erase("original_max_position_embeddings");
  EXPECT_TRUE(
      contains(refusal(json), "'rope_scaling.original_max_position_embeddings' is missing"));

  json["rope_scaling"] = llama3_scaling();
  json["rope_scaling"]["high_freq_factor"] = 1.0;  // equal to low: the smoothing divides by 0
  EXPECT_TRUE(contains(refusal(json), "'rope_scaling.high_freq_factor' is 1.0"));

  json["rope_scaling"] = {{"rope_type", "linear"}};
  EXPECT_TRUE(contains(refusal(json), "'rope_scaling.factor' is missing"));
  json["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -2}};
  EXPECT_TRUE(contains(refusal(json), "'rope_scaling.factor' is -2"));
  json["rope_scaling"] = {{"factor", 2.0}};
  EXPECT_TRUE(contains(refusal(json), "'rope_scaling.rope_type' is missing"));
  json["rope_scaling"] = "linear";
  EXPECT_TRUE(contains(refusal(json), "'rope_scaling' is \"linear\""));

  json = llama();
  json["rope_theta"] = 0;
  EXPECT_TRUE(contains(refusal(json), "'rope_theta' is 0"));
}

// Random damage to a valid config: every outcome is a config within the bounds or an
// InvalidArgument naming the file, never a crash.
TEST(ModelConfig, DamagedTextNeverCrashes) {
  nlohmann::json json = llama();
  json["rope_scaling"] = llama3_scaling();
  json["eos_token_id"] = {2, 3};
  const std::string original = json.dump();
  std::mt19937_64 random(777);
  const std::string alphabet = "{}[]\":,-.0123456789eE ntrufalsx";
  int parsed = 0;
  for (int round = 0; round < 2000; ++round) {
    std::string text = original;
    const int flips = 1 + static_cast<int>(random() % 3);
    for (int i = 0; i < flips; ++i)
      text[random() % text.size()] = alphabet[random() % alphabet.size()];
    Result<ModelConfig> config = parse_model_config(text, kOrigin);
    if (!config.ok()) {
      EXPECT_TRUE(contains(config.status().message(), kOrigin)) << config.status().message();
      continue;
    }
    ++parsed;
    EXPECT_GT(config->heads, 0u);
    EXPECT_EQ(config->heads % config->kv_heads, 0u) << text;
    EXPECT_EQ(config->head_dim % 2, 0u) << text;
    EXPECT_LE(config->layers, 1024u);
    for (std::int32_t id : config->eos_token_ids) {
      EXPECT_LT(static_cast<std::uint32_t>(id), config->vocab_size) << text;
    }
  }
  EXPECT_GT(parsed, 0);
}

}  // namespace
}  // namespace kvvm::model
