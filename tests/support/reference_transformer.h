// A float64 reference of the decoder-only forward pass the model layer implements (Llama /
// Qwen2 / Qwen3 / Mistral, and the mixtures Qwen3-MoE / Mixtral / Qwen2-MoE, as Hugging Face
// defines them), for tests: every position recomputed from
// scratch with full causal attention, no KV cache, no packing, no GEMM library, so a bug in
// the cache, the batching or the kernels shows as a difference.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvvm/model/config.h"
#include "kvvm/model/weights.h"

namespace kvvm::testing {

// RoPE's inverse frequencies in float64, from the definitions (transformers' default,
// `linear` and `llama3` computations), written independently of src/model/rope.cc.
std::vector<double> reference_inv_freq(const model::ModelConfig& config);

class ReferenceTransformer {
 public:
  // Copies the weights to float64 (F32, BF16 or F16 tensors; REQUIRES: bound and shaped as
  // the config says).
  ReferenceTransformer(const model::ModelConfig& config, const model::ModelWeights& weights);

  // The logits at every position of `tokens` (positions 0 .. n-1): [n][vocab].
  std::vector<std::vector<double>> logits(std::span<const std::int32_t> tokens) const;

 private:
  using Matrix = std::vector<double>;  // row-major, [out][in] as Hugging Face stores it
  struct Layer {
    Matrix input_norm, q, k, v, q_bias, k_bias, v_bias, o, o_bias, post_norm, gate, up, down;
    Matrix q_norm, k_norm;  // [head_dim] each; empty without q/k norms
    // A sparse layer's: the router, each expert's gate, up, down, the shared expert and its gate.
    Matrix router;
    std::vector<Matrix> expert_gate, expert_up, expert_down;
    Matrix shared_gate_proj, shared_up, shared_down, shared_gate;
  };
  // The feed-forward of one token's normed row: the dense MLP, or the mixture of experts.
  std::vector<double> feed_forward(const Layer& w, const std::vector<double>& xn) const;
  std::vector<double> mlp(const Matrix& gate, const Matrix& up, const Matrix& down,
                          std::size_t inter, const std::vector<double>& xn) const;
  model::ModelConfig config_;
  Matrix embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  std::vector<double> inv_freq_;
};

// max |a - b| / max |b|: the logits comparison of the parity tests.
double max_relative_difference(std::span<const float> actual, std::span<const double> expected);

}  // namespace kvvm::testing
