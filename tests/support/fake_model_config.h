// The config of a one-layer model that exists only as a test's fake forward pass: small
// enough that a test writes its logits by hand, shaped enough for a KV space to plan.
#pragma once

#include <cstdint>

#include "kvvm/model/config.h"

namespace kvvm::engine::testing {

inline constexpr std::uint32_t kFakeVocab = 16;

inline model::ModelConfig fake_model_config(std::uint32_t max_positions = 64) {
  model::ModelConfig config;
  config.architecture = "FakeForCausalLM";
  config.hidden_size = 4;
  config.intermediate_size = 8;
  config.layers = 1;
  config.heads = 1;
  config.kv_heads = 1;
  config.head_dim = 4;
  config.vocab_size = kFakeVocab;
  config.max_position_embeddings = max_positions;
  return config;
}

}  // namespace kvvm::engine::testing
