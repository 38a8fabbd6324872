// The CPU forward pass's mixture-of-experts feed-forward in float32: the router's softmax and
// top k as transformers computes them, each expert's MLP over the rows routed to it (one sgemm
// per projection per expert), the weighted sum in the order transformers adds it (experts in
// ascending id), and Qwen2-MoE's gated shared expert.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/model/config.h"
#include "model/cpu/cpu_weights.h"

namespace kvvm::model::cpu {

// For each of `tokens` rows of `experts` logits: p = softmax(logits) (float32, max subtracted;
// a NaN logit left out of the max and sum, its p NaN and ranked below every number, as the CUDA
// router does), the top_k largest p in descending order with the lower id first among equals,
// each divided by the sum of the chosen when `renormalize`. ids and weights are
// [tokens][top_k].
void route_top_k(const float* logits, std::size_t tokens, std::uint32_t experts,
                 std::uint32_t top_k, bool renormalize, std::int32_t* ids, float* weights);

class CpuMoe {
 public:
  // Scratch for up to `max_tokens` rows.
  CpuMoe(const ModelConfig& config, std::size_t max_tokens);

  // out[t] = layer `layer`'s mixture applied to x[t] (the post-attention normed rows), for
  // `tokens` rows of hidden; out does not alias x. The wanted experts come from `weights` in
  // ascending id, in waves of at most its expert_capacity() (the cache's slots); the sum is
  // the same, bit for bit, however many waves. A failed expert copy fails the step.
  Status run(CpuWeights& weights, std::uint32_t layer, const float* x, std::size_t tokens,
             float* out);

  // The last run's choices, [tokens][top_k] (tests, and the routing statistics).
  const std::vector<std::int32_t>& ids() const { return ids_; }
  const std::vector<float>& weights() const { return weights_; }

 private:
  // y[n][hidden] = down(silu(gate(x)) * up(x)) for n rows of x.
  void expert_mlp(const CpuExpert& e, std::uint32_t inter, const float* x, std::size_t n, float* y);

  const ModelConfig& config_;
  std::vector<float> logits_;
  std::vector<std::int32_t> ids_;
  std::vector<float> weights_;
  // Adds expert e's weighted MLP over its routed rows into out.
  void add_expert(const CpuExpert& expert, std::uint32_t e, const float* x, std::size_t tokens,
                  float* out);

  std::vector<std::uint32_t> wanted_, wanted_rows_;  // the step's experts, ascending, and rows
  std::vector<CpuExpert> wave_;
  std::vector<std::uint32_t> rows_;  // one expert's token rows
  std::vector<float> row_weights_;
  std::vector<float> gathered_, gate_, up_, y_;
};

}  // namespace kvvm::model::cpu
