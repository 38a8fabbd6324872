// A tiny random transformer for the model tests, and a naive float64 forward pass over it.
//
// Why a separate naive reference: the backends (CPU float32, CUDA bf16 / fp16) share the
// config and weights but none of their arithmetic with it; it is written straight from the
// Hugging Face modelling code (RMSNorm, rotate_half RoPE with the default, linear and llama3
// frequencies, grouped-query causal attention, SiLU MLP), in double, without rounding.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvvm/model/config.h"
#include "kvvm/model/weights.h"

namespace kvvm::testing {

struct TinyModelSpec {
  std::string architecture = "Qwen2ForCausalLM";
  std::uint32_t hidden = 256;
  std::uint32_t intermediate = 512;
  std::uint32_t layers = 2;
  std::uint32_t heads = 4;
  std::uint32_t kv_heads = 2;
  std::uint32_t head_dim = 64;
  std::uint32_t vocab = 300;
  std::uint32_t max_positions = 256;
  bool qkv_bias = true;
  bool o_bias = false;
  bool tied = true;
  model::RopeConfig rope;
  model::TensorDType dtype = model::TensorDType::kBf16;  // of every tensor
};

// The config, the tensors' bytes and the TensorViews (stable addresses) the weights point at.
struct TinyModel {
  model::ModelConfig config;
  std::deque<std::vector<std::uint8_t>> storage;
  std::deque<model::TensorView> tensors;
  model::ModelWeights weights;
};

// Random weights (seeded): embeddings in [-1, 1], projections uniform with a standard
// deviation of about 1 / sqrt(fan in), norms in [0.5, 1.5], biases in [-0.2, 0.2].
std::unique_ptr<TinyModel> make_tiny_model(const TinyModelSpec& spec, std::uint64_t seed);

// inv_freq[head_dim / 2] of the config's RoPE, in double.
std::vector<double> reference_inv_freq(const model::ModelConfig& config);

// Logits of every position of one sequence ([ids.size()][vocab]), causal, from position 0.
std::vector<std::vector<double>> reference_logits(const model::ModelConfig& config,
                                                  const model::ModelWeights& weights,
                                                  std::span<const std::int32_t> ids);

// ||got - want|| / ||want||.
double logits_relative_error(std::span<const float> got, const std::vector<double>& want);

// Top-1 minus top-2 of a row (its greedy margin), and the top-1 index (lowest among equals).
double top_margin(const std::vector<double>& row);
std::int32_t top_index(const std::vector<double>& row);

}  // namespace kvvm::testing
