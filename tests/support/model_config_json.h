// A small Llama config.json for the config tests to edit, and the calls that parse it or
// expect it refused.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "kvvm/model/config.h"
#include "support/text_match.h"

// Their own namespace: the short names (parse, refusal) stay out of other helpers' way.
namespace kvvm::test::model_config {

inline constexpr const char* kOrigin = "/models/x/config.json";

using test::contains;  // for the tests that take this namespace whole

// A small Llama config every test edits.
inline nlohmann::json llama() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 256},
          {"intermediate_size", 512},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 8},
          {"num_key_value_heads", 2},
          {"vocab_size", 1000},
          {"max_position_embeddings", 4096},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"torch_dtype", "bfloat16"},
          {"bos_token_id", 1},
          {"eos_token_id", 2}};
}

inline Result<model::ModelConfig> parse(const nlohmann::json& json) {
  return model::parse_model_config(json.dump(), kOrigin);
}

// The error for `json`, which must be refused.
inline std::string refusal(const nlohmann::json& json) {
  Result<model::ModelConfig> config = parse(json);
  EXPECT_FALSE(config.ok()) << json.dump();
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(config.status().message(), kOrigin)) << config.status().message();
  return config.status().message();
}

}  // namespace kvvm::test::model_config
