// The CPU mixture of experts (model/cpu/cpu_moe.h).
#include "model/cpu/cpu_moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>

#include "model/cpu/cpu_ops.h"

namespace kvvm::model::cpu {
namespace {

// Whether a ranks before b: larger first, a NaN below every number, the lower id among equals.
bool ranks_before(float a, std::int32_t a_id, float b, std::int32_t b_id) {
  const bool a_nan = std::isnan(a), b_nan = std::isnan(b);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a != b) return a > b;
  return a_id < b_id;
}

}  // namespace

void route_top_k(const float* logits, std::size_t tokens, std::uint32_t experts,
                 std::uint32_t top_k, bool renormalize, std::int32_t* ids, float* weights) {
  std::vector<float> p(experts);
  std::vector<std::int32_t> order(experts);
  for (std::size_t t = 0; t < tokens; ++t) {
    const float* row = logits + t * experts;
    // A NaN logit stays out of the max and the sum (its own probability NaN, ranked last), so
    // one broken expert's logit does not make every choice NaN; the CUDA router does the same.
    float most = -INFINITY;
    for (std::uint32_t e = 0; e < experts; ++e) {
      if (!std::isnan(row[e])) most = std::max(most, row[e]);
    }
    float sum = 0.0f;
    for (std::uint32_t e = 0; e < experts; ++e) {
      p[e] = std::exp(row[e] - most);
      if (!std::isnan(p[e])) sum += p[e];
    }
    for (std::uint32_t e = 0; e < experts; ++e) p[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(
        order.begin(), order.begin() + top_k, order.end(),
        [&](std::int32_t a, std::int32_t b) { return ranks_before(p[a], a, p[b], b); });
    float chosen = 0.0f;
    for (std::uint32_t j = 0; j < top_k; ++j) chosen += p[order[j]];
    for (std::uint32_t j = 0; j < top_k; ++j) {
      ids[t * top_k + j] = order[j];
      weights[t * top_k + j] = renormalize ? p[order[j]] / chosen : p[order[j]];
    }
  }
}

CpuMoe::CpuMoe(const ModelConfig& config, std::size_t max_tokens) : config_(config) {
  const MoeConfig& moe = config.moe;
  const std::size_t hidden = config.hidden_size;
  const std::size_t inter = std::max(moe.expert_intermediate, moe.shared_intermediate);
  logits_.resize(max_tokens * moe.experts);
  ids_.resize(max_tokens * moe.top_k);
  weights_.resize(max_tokens * moe.top_k);
  rows_.resize(max_tokens);
  row_weights_.resize(max_tokens);
  gathered_.resize(max_tokens * hidden);
  gate_.resize(max_tokens * inter);
  up_.resize(max_tokens * inter);
  y_.resize(max_tokens * hidden);
}

void CpuMoe::expert_mlp(const CpuExpert& e, std::uint32_t inter, const float* x, std::size_t n,
                        float* y) {
  silu_mlp(x, n, config_.hidden_size, e.gate, e.up, e.down, inter, gate_.data(), up_.data(), y);
}

void CpuMoe::add_expert(const CpuExpert& expert, std::uint32_t e, const float* x,
                        std::size_t tokens, float* out) {
  const std::size_t hidden = config_.hidden_size;
  const std::uint32_t k = config_.moe.top_k;
  std::size_t n = 0;
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::uint32_t j = 0; j < k; ++j) {
      if (ids_[t * k + j] != static_cast<std::int32_t>(e)) continue;
      rows_[n] = static_cast<std::uint32_t>(t);
      row_weights_[n] = weights_[t * k + j];
      std::memcpy(&gathered_[n * hidden], x + t * hidden, hidden * sizeof(float));
      ++n;
    }
  }
  expert_mlp(expert, config_.moe.expert_intermediate, gathered_.data(), n, y_.data());
  for (std::size_t r = 0; r < n; ++r) {
    float* to = out + std::size_t{rows_[r]} * hidden;
    const float* from = &y_[r * hidden];
    for (std::size_t i = 0; i < hidden; ++i) to[i] += from[i] * row_weights_[r];
  }
}

Status CpuMoe::run(CpuWeights& weights, std::uint32_t layer, const float* x, std::size_t tokens,
                   float* out) {
  const CpuLayerWeights& w = weights.layers[layer];
  const MoeConfig& moe = config_.moe;
  const std::size_t hidden = config_.hidden_size;
  const std::uint32_t k = moe.top_k;
  linear(x, tokens, hidden, w.router, moe.experts, logits_.data());
  route_top_k(logits_.data(), tokens, moe.experts, k, moe.renormalize, ids_.data(),
              weights_.data());
  std::memset(out, 0, tokens * hidden * sizeof(float));
  KVVM_RETURN_IF_ERROR(detail::wanted_experts(std::span<const std::int32_t>(ids_).first(tokens * k),
                                              moe.experts, wanted_, wanted_rows_));
  // Expert by expert in ascending id, as transformers adds them (waves of the capacity keep
  // that order): each one's rows gathered, its MLP over all of them, each row's output times
  // its weight added into its token's sum.
  const std::size_t capacity = weights.expert_capacity();
  for (std::size_t first = 0; first < wanted_.size(); first += capacity) {
    const std::size_t n = std::min(capacity, wanted_.size() - first);
    wave_.resize(n);
    KVVM_RETURN_IF_ERROR(
        weights.experts_for(layer, std::span<const std::uint32_t>(wanted_).subspan(first, n),
                            std::span<const std::uint32_t>(wanted_rows_).subspan(first, n), wave_));
    for (std::size_t i = 0; i < n; ++i) add_expert(wave_[i], wanted_[first + i], x, tokens, out);
  }
  if (w.shared_gate == nullptr) return Status::Ok();
  // Qwen2-MoE: sigmoid(shared_expert_gate(x)) * shared_expert(x), added after the experts.
  expert_mlp(w.shared, moe.shared_intermediate, x, tokens, y_.data());
  linear(x, tokens, hidden, w.shared_gate, 1, row_weights_.data());
  for (std::size_t t = 0; t < tokens; ++t) {
    const float gate = 1.0f / (1.0f + std::exp(-row_weights_[t]));
    for (std::size_t i = 0; i < hidden; ++i) out[t * hidden + i] += gate * y_[t * hidden + i];
  }
  return Status::Ok();
}

}  // namespace kvvm::model::cpu
