// The float64 reference forward pass.
#include "support/reference_transformer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kvvm/kernels/attention.h"

namespace kvvm::testing {
namespace {

using model::TensorDType;
using model::TensorView;

std::vector<double> to_doubles(const TensorView* tensor) {
  std::vector<double> out;
  if (tensor == nullptr) return out;
  const DType element = tensor->dtype == TensorDType::kBf16  ? DType::kBf16
                        : tensor->dtype == TensorDType::kF16 ? DType::kFp16
                                                             : DType::kFp32;
  const std::uint32_t bytes = element_bytes(element);
  out.resize(tensor->elements());
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = element_to_float(element, tensor->data + i * bytes);
  }
  return out;
}

// y[n] = W[n][k] x[k] (+ bias)
std::vector<double> apply(const std::vector<double>& w, const std::vector<double>& bias,
                          const std::vector<double>& x, std::size_t n) {
  const std::size_t k = x.size();
  std::vector<double> y(n);
  for (std::size_t r = 0; r < n; ++r) {
    double sum = bias.empty() ? 0.0 : bias[r];
    for (std::size_t i = 0; i < k; ++i) sum += w[r * k + i] * x[i];
    y[r] = sum;
  }
  return y;
}

std::vector<double> rms_norm(const std::vector<double>& x, const std::vector<double>& weight,
                             double eps) {
  double sum = 0;
  for (double value : x) sum += value * value;
  const double inverse = 1.0 / std::sqrt(sum / static_cast<double>(x.size()) + eps);
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inverse * weight[i];
  return out;
}

// Each head's row of `v` RMS-normalised with `weight` (Qwen3's q_norm / k_norm).
void norm_heads(std::vector<double>& v, std::size_t heads, std::size_t dim,
                const std::vector<double>& weight, double eps) {
  for (std::size_t h = 0; h < heads; ++h) {
    const auto begin = v.begin() + static_cast<std::ptrdiff_t>(h * dim);
    const std::vector<double> normed =
        rms_norm(std::vector<double>(begin, begin + static_cast<std::ptrdiff_t>(dim)), weight, eps);
    std::copy(normed.begin(), normed.end(), begin);
  }
}

void rotate(std::vector<double>& v, std::size_t heads, std::size_t dim,
            const std::vector<double>& inv_freq, std::size_t position) {
  const std::size_t half = dim / 2;
  for (std::size_t h = 0; h < heads; ++h) {
    double* x = &v[h * dim];
    for (std::size_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(position) * inv_freq[i];
      const double a = x[i], b = x[i + half];
      x[i] = a * std::cos(angle) - b * std::sin(angle);
      x[i + half] = b * std::cos(angle) + a * std::sin(angle);
    }
  }
}

}  // namespace

std::vector<double> reference_inv_freq(const model::ModelConfig& config) {
  const std::size_t half = config.head_dim / 2;
  std::vector<double> inv_freq(half);
  const model::RopeConfig& rope = config.rope;
  for (std::size_t i = 0; i < half; ++i) {
    double f = std::pow(rope.theta, -2.0 * static_cast<double>(i) / config.head_dim);
    if (rope.scaling == model::RopeScaling::kLinear) f /= rope.factor;
    if (rope.scaling == model::RopeScaling::kLlama3) {
      const double wavelen = 2 * std::numbers::pi / f;
      const double low_wavelen = rope.original_max_position / rope.low_freq_factor;
      const double high_wavelen = rope.original_max_position / rope.high_freq_factor;
      if (wavelen > low_wavelen) {
        f /= rope.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) /
                              (rope.high_freq_factor - rope.low_freq_factor);
        f = (1 - smooth) * f / rope.factor + smooth * f;
      }
    }
    inv_freq[i] = f;
  }
  return inv_freq;
}

ReferenceTransformer::ReferenceTransformer(const model::ModelConfig& config,
                                           const model::ModelWeights& weights)
    : config_(config),
      embed_(to_doubles(weights.embed)),
      final_norm_(to_doubles(weights.final_norm)),
      lm_head_(config.tie_word_embeddings || weights.lm_head == nullptr
                   ? embed_
                   : to_doubles(weights.lm_head)),
      inv_freq_(reference_inv_freq(config)) {
  for (const model::LayerWeights& w : weights.layers) {
    Layer& layer = layers_.emplace_back();
    layer.input_norm = to_doubles(w.input_norm);
    layer.q = to_doubles(w.q);
    layer.k = to_doubles(w.k);
    layer.v = to_doubles(w.v);
    layer.q_bias = to_doubles(w.q_bias);
    layer.k_bias = to_doubles(w.k_bias);
    layer.v_bias = to_doubles(w.v_bias);
    layer.o = to_doubles(w.o);
    layer.o_bias = to_doubles(w.o_bias);
    layer.post_norm = to_doubles(w.post_norm);
    layer.gate = to_doubles(w.gate);
    layer.up = to_doubles(w.up);
    layer.down = to_doubles(w.down);
    layer.q_norm = to_doubles(w.q_norm);
    layer.k_norm = to_doubles(w.k_norm);
    layer.router = to_doubles(w.router);
    for (const model::ExpertWeights& e : w.experts) {
      layer.expert_gate.push_back(to_doubles(e.gate));
      layer.expert_up.push_back(to_doubles(e.up));
      layer.expert_down.push_back(to_doubles(e.down));
    }
    layer.shared_gate_proj = to_doubles(w.shared.gate);
    layer.shared_up = to_doubles(w.shared.up);
    layer.shared_down = to_doubles(w.shared.down);
    layer.shared_gate = to_doubles(w.shared_gate);
  }
}

std::vector<double> ReferenceTransformer::mlp(const Matrix& gate_w, const Matrix& up_w,
                                              const Matrix& down_w, std::size_t inter,
                                              const std::vector<double>& xn) const {
  std::vector<double> gate = apply(gate_w, {}, xn, inter);
  const std::vector<double> up = apply(up_w, {}, xn, inter);
  for (std::size_t i = 0; i < gate.size(); ++i)
    gate[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
  return apply(down_w, {}, gate, config_.hidden_size);
}

std::vector<double> ReferenceTransformer::feed_forward(const Layer& w,
                                                       const std::vector<double>& xn) const {
  const model::ModelConfig& c = config_;
  if (w.router.empty()) return mlp(w.gate, w.up, w.down, c.intermediate_size, xn);
  const model::MoeConfig& moe = c.moe;
  // softmax over every expert, the top k (the lower id first among equals), renormalised.
  const std::vector<double> logits = apply(w.router, {}, xn, moe.experts);
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(moe.experts);
  double sum = 0;
  for (std::size_t e = 0; e < p.size(); ++e) sum += (p[e] = std::exp(logits[e] - top));
  for (double& value : p) value /= sum;
  std::vector<std::size_t> order(moe.experts);
  for (std::size_t e = 0; e < order.size(); ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return p[a] > p[b]; });
  double chosen = 0;
  for (std::size_t j = 0; j < moe.top_k; ++j) chosen += p[order[j]];
  std::vector<double> out(c.hidden_size, 0.0);
  for (std::size_t j = 0; j < moe.top_k; ++j) {
    const std::size_t e = order[j];
    const double weight = moe.renormalize ? p[e] / chosen : p[e];
    const std::vector<double> y =
        mlp(w.expert_gate[e], w.expert_up[e], w.expert_down[e], moe.expert_intermediate, xn);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] += weight * y[i];
  }
  if (!w.shared_gate.empty()) {
    const std::vector<double> y =
        mlp(w.shared_gate_proj, w.shared_up, w.shared_down, moe.shared_intermediate, xn);
    const double gate = 1 / (1 + std::exp(-apply(w.shared_gate, {}, xn, 1)[0]));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] += gate * y[i];
  }
  return out;
}

std::vector<std::vector<double>> ReferenceTransformer::logits(
    std::span<const std::int32_t> tokens) const {
  const model::ModelConfig& c = config_;
  const std::size_t n = tokens.size(), hidden = c.hidden_size, dim = c.head_dim;
  const std::size_t q_width = std::size_t{c.heads} * dim, kv_width = std::size_t{c.kv_heads} * dim;
  const std::size_t group = c.heads / c.kv_heads;
  std::vector<std::vector<double>> x(n);
  for (std::size_t t = 0; t < n; ++t) {
    const auto id = static_cast<std::size_t>(tokens[t]);
    x[t].assign(embed_.begin() + static_cast<std::ptrdiff_t>(id * hidden),
                embed_.begin() + static_cast<std::ptrdiff_t>((id + 1) * hidden));
  }
  for (const Layer& w : layers_) {
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (std::size_t t = 0; t < n; ++t) {
      const std::vector<double> xn = rms_norm(x[t], w.input_norm, c.rms_norm_eps);
      q[t] = apply(w.q, w.q_bias, xn, q_width);
      k[t] = apply(w.k, w.k_bias, xn, kv_width);
      v[t] = apply(w.v, w.v_bias, xn, kv_width);
      if (c.qk_norm) {
        norm_heads(q[t], c.heads, dim, w.q_norm, c.rms_norm_eps);
        norm_heads(k[t], c.kv_heads, dim, w.k_norm, c.rms_norm_eps);
      }
      rotate(q[t], c.heads, dim, inv_freq_, t);
      rotate(k[t], c.kv_heads, dim, inv_freq_, t);
    }
    for (std::size_t t = 0; t < n; ++t) {
      std::vector<double> attn(q_width, 0.0);
      for (std::size_t h = 0; h < c.heads; ++h) {
        const std::size_t kv_head = h / group;
        std::vector<double> scores(t + 1);
        for (std::size_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (std::size_t d = 0; d < dim; ++d) dot += q[t][h * dim + d] * k[s][kv_head * dim + d];
          scores[s] = dot / std::sqrt(static_cast<double>(dim));
        }
        const double top = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (double& score : scores) sum += (score = std::exp(score - top));
        for (std::size_t s = 0; s <= t; ++s) {
          for (std::size_t d = 0; d < dim; ++d) {
            attn[h * dim + d] += scores[s] / sum * v[s][kv_head * dim + d];
          }
        }
      }
      const std::vector<double> o = apply(w.o, w.o_bias, attn, hidden);
      for (std::size_t i = 0; i < hidden; ++i) x[t][i] += o[i];
      const std::vector<double> xn = rms_norm(x[t], w.post_norm, c.rms_norm_eps);
      const std::vector<double> down = feed_forward(w, xn);
      for (std::size_t i = 0; i < hidden; ++i) x[t][i] += down[i];
    }
  }
  std::vector<std::vector<double>> logits(n);
  for (std::size_t t = 0; t < n; ++t) {
    logits[t] = apply(lm_head_, {}, rms_norm(x[t], final_norm_, c.rms_norm_eps), c.vocab_size);
  }
  return logits;
}

double max_relative_difference(std::span<const float> actual, std::span<const double> expected) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double d = std::fabs(double{actual[i]} - expected[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    scale = std::max(scale, std::fabs(expected[i]));
  }
  return diff / scale;
}

}  // namespace kvvm::testing
