#include "support/cuda_model_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>

#include "kvvm/attention.h"

namespace kvvm::testing {
namespace {

using model::TensorDType;
using model::TensorView;
using Matrix = std::vector<std::vector<double>>;

DType element_of(TensorDType dtype) {
  return dtype == TensorDType::kBf16  ? DType::kBf16
         : dtype == TensorDType::kF16 ? DType::kFp16
                                      : DType::kFp32;
}

// Adds a tensor of `shape` with values drawn from [low, high], rounded to the spec's dtype.
const TensorView* add_tensor(TinyModel& model, TensorDType dtype, const std::string& name,
                             std::vector<std::uint64_t> shape, double low, double high,
                             std::mt19937_64& random) {
  TensorView view;
  view.name = name;
  view.dtype = dtype;
  view.shape = std::move(shape);
  const std::uint64_t elements = view.elements();
  const std::uint32_t size = model::element_size(dtype);
  std::vector<std::uint8_t>& bytes = model.storage.emplace_back(elements * size);
  std::uniform_real_distribution<double> draw(low, high);
  for (std::uint64_t i = 0; i < elements; ++i) {
    const float value = static_cast<float>(draw(random));
    float_to_element(element_of(dtype), value, &bytes[i * size]);
  }
  view.data = reinterpret_cast<const std::byte*>(bytes.data());
  view.bytes = bytes.size();
  return &model.tensors.emplace_back(std::move(view));
}

std::vector<double> read_tensor(const TensorView& tensor) {
  const DType element = element_of(tensor.dtype);
  const std::uint32_t size = model::element_size(tensor.dtype);
  std::vector<double> values(tensor.elements());
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = element_to_float(element, tensor.data + i * size);
  }
  return values;
}

// y[r] = W x[r] (+ b), W [out][in] row-major.
Matrix linear(const Matrix& x, const std::vector<double>& w, const TensorView* bias,
              std::size_t out) {
  const std::size_t in = x.empty() ? 0 : x[0].size();
  const std::vector<double> b = bias != nullptr ? read_tensor(*bias) : std::vector<double>();
  Matrix y(x.size(), std::vector<double>(out));
  for (std::size_t r = 0; r < x.size(); ++r) {
    for (std::size_t o = 0; o < out; ++o) {
      double sum = b.empty() ? 0.0 : b[o];
      for (std::size_t i = 0; i < in; ++i) sum += w[o * in + i] * x[r][i];
      y[r][o] = sum;
    }
  }
  return y;
}

Matrix rmsnorm(const Matrix& x, const TensorView& weight, double eps) {
  const std::vector<double> w = read_tensor(weight);
  Matrix y = x;
  for (auto& row : y) {
    double squares = 0;
    for (double v : row) squares += v * v;
    const double scale = 1.0 / std::sqrt(squares / static_cast<double>(row.size()) + eps);
    for (std::size_t i = 0; i < row.size(); ++i) row[i] = row[i] * scale * w[i];
  }
  return y;
}

void rope(Matrix& x, std::uint32_t heads, std::uint32_t dim, const std::vector<double>& inv_freq) {
  const std::uint32_t half = dim / 2;
  for (std::size_t t = 0; t < x.size(); ++t) {
    for (std::uint32_t h = 0; h < heads; ++h) {
      double* row = &x[t][h * dim];
      for (std::uint32_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(t) * inv_freq[i];
        const double c = std::cos(angle), s = std::sin(angle);
        const double x1 = row[i], x2 = row[i + half];
        row[i] = x1 * c - x2 * s;
        row[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

Matrix attention(const Matrix& q, const Matrix& k, const Matrix& v, std::uint32_t heads,
                 std::uint32_t kv_heads, std::uint32_t dim) {
  const std::size_t tokens = q.size();
  const std::uint32_t group = heads / kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  Matrix out(tokens, std::vector<double>(std::size_t{heads} * dim, 0.0));
  std::vector<double> scores(tokens);
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::uint32_t h = 0; h < heads; ++h) {
      const std::uint32_t kv = h / group;
      double most = -INFINITY;
      for (std::size_t j = 0; j <= t; ++j) {
        double dot = 0;
        for (std::uint32_t d = 0; d < dim; ++d) dot += q[t][h * dim + d] * k[j][kv * dim + d];
        scores[j] = dot * scale;
        most = std::max(most, scores[j]);
      }
      double total = 0;
      for (std::size_t j = 0; j <= t; ++j) total += (scores[j] = std::exp(scores[j] - most));
      for (std::size_t j = 0; j <= t; ++j) {
        for (std::uint32_t d = 0; d < dim; ++d) {
          out[t][h * dim + d] += scores[j] / total * v[j][kv * dim + d];
        }
      }
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<TinyModel> make_tiny_model(const TinyModelSpec& spec, std::uint64_t seed) {
  auto made = std::make_unique<TinyModel>();
  model::ModelConfig& c = made->config;
  c.architecture = spec.architecture;
  c.hidden_size = spec.hidden;
  c.intermediate_size = spec.intermediate;
  c.layers = spec.layers;
  c.heads = spec.heads;
  c.kv_heads = spec.kv_heads;
  c.head_dim = spec.head_dim;
  c.vocab_size = spec.vocab;
  c.rms_norm_eps = 1e-6;
  c.rope = spec.rope;
  c.tie_word_embeddings = spec.tied;
  c.qkv_bias = spec.qkv_bias;
  c.o_bias = spec.o_bias;
  c.max_position_embeddings = spec.max_positions;
  c.dtype = element_of(spec.dtype) == DType::kFp32 ? DType::kFp32 : element_of(spec.dtype);
  std::mt19937_64 random(seed);
  const TensorDType t = spec.dtype;
  const std::uint64_t hidden = spec.hidden, inter = spec.intermediate;
  const std::uint64_t q_dim = std::uint64_t{spec.heads} * spec.head_dim;
  const std::uint64_t kv_dim = std::uint64_t{spec.kv_heads} * spec.head_dim;
  auto projection = [&](const std::string& name, std::uint64_t out, std::uint64_t in) {
    const double bound = std::sqrt(3.0 / static_cast<double>(in));  // std 1 / sqrt(in)
    return add_tensor(*made, t, name, {out, in}, -bound, bound, random);
  };
  model::ModelWeights& w = made->weights;
  w.embed = add_tensor(*made, t, "model.embed_tokens.weight", {spec.vocab, hidden}, -1, 1, random);
  for (std::uint32_t l = 0; l < spec.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    model::LayerWeights& layer = w.layers.emplace_back();
    layer.input_norm =
        add_tensor(*made, t, p + "input_layernorm.weight", {hidden}, 0.5, 1.5, random);
    layer.q = projection(p + "self_attn.q_proj.weight", q_dim, hidden);
    layer.k = projection(p + "self_attn.k_proj.weight", kv_dim, hidden);
    layer.v = projection(p + "self_attn.v_proj.weight", kv_dim, hidden);
    if (spec.qkv_bias) {
      layer.q_bias = add_tensor(*made, t, p + "self_attn.q_proj.bias", {q_dim}, -0.2, 0.2, random);
      layer.k_bias = add_tensor(*made, t, p + "self_attn.k_proj.bias", {kv_dim}, -0.2, 0.2, random);
      layer.v_bias = add_tensor(*made, t, p + "self_attn.v_proj.bias", {kv_dim}, -0.2, 0.2, random);
    }
    layer.o = projection(p + "self_attn.o_proj.weight", hidden, q_dim);
    if (spec.o_bias) {
      layer.o_bias = add_tensor(*made, t, p + "self_attn.o_proj.bias", {hidden}, -0.2, 0.2, random);
    }
    layer.post_norm =
        add_tensor(*made, t, p + "post_attention_layernorm.weight", {hidden}, 0.5, 1.5, random);
    layer.gate = projection(p + "mlp.gate_proj.weight", inter, hidden);
    layer.up = projection(p + "mlp.up_proj.weight", inter, hidden);
    layer.down = projection(p + "mlp.down_proj.weight", hidden, inter);
  }
  w.final_norm = add_tensor(*made, t, "model.norm.weight", {hidden}, 0.5, 1.5, random);
  w.lm_head = spec.tied ? w.embed : projection("lm_head.weight", spec.vocab, hidden);
  return made;
}

std::vector<double> reference_inv_freq(const model::ModelConfig& config) {
  const std::uint32_t dim = config.head_dim;
  std::vector<double> inv_freq(dim / 2);
  const model::RopeConfig& rope = config.rope;
  for (std::uint32_t i = 0; i < dim / 2; ++i) {
    double f = 1.0 / std::pow(rope.theta, 2.0 * i / dim);
    if (rope.scaling == model::RopeScaling::kLinear) {
      f /= rope.factor;
    } else if (rope.scaling == model::RopeScaling::kLlama3) {
      const double wavelen = 2 * std::numbers::pi / f;
      const double low_wavelen = rope.original_max_position / rope.low_freq_factor;
      const double high_wavelen = rope.original_max_position / rope.high_freq_factor;
      if (wavelen > low_wavelen) {
        f /= rope.factor;                    // low frequencies: scaled
      } else if (wavelen >= high_wavelen) {  // between: interpolated
        const double smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) /
                              (rope.high_freq_factor - rope.low_freq_factor);
        f = (1 - smooth) * f / rope.factor + smooth * f;
      }
    }
    inv_freq[i] = f;
  }
  return inv_freq;
}

std::vector<std::vector<double>> reference_logits(const model::ModelConfig& c,
                                                  const model::ModelWeights& w,
                                                  std::span<const std::int32_t> ids) {
  const std::vector<double> embed = read_tensor(*w.embed);
  const std::size_t hidden = c.hidden_size;
  Matrix x(ids.size(), std::vector<double>(hidden));
  for (std::size_t t = 0; t < ids.size(); ++t) {
    std::copy_n(embed.begin() + static_cast<std::ptrdiff_t>(ids[t] * hidden), hidden, x[t].begin());
  }
  const std::vector<double> inv_freq = reference_inv_freq(c);
  const std::size_t q_dim = std::size_t{c.heads} * c.head_dim;
  const std::size_t kv_dim = std::size_t{c.kv_heads} * c.head_dim;
  for (const model::LayerWeights& layer : w.layers) {
    Matrix h = rmsnorm(x, *layer.input_norm, c.rms_norm_eps);
    Matrix q = linear(h, read_tensor(*layer.q), c.qkv_bias ? layer.q_bias : nullptr, q_dim);
    Matrix k = linear(h, read_tensor(*layer.k), c.qkv_bias ? layer.k_bias : nullptr, kv_dim);
    Matrix v = linear(h, read_tensor(*layer.v), c.qkv_bias ? layer.v_bias : nullptr, kv_dim);
    rope(q, c.heads, c.head_dim, inv_freq);
    rope(k, c.kv_heads, c.head_dim, inv_freq);
    const Matrix o = linear(attention(q, k, v, c.heads, c.kv_heads, c.head_dim),
                            read_tensor(*layer.o), c.o_bias ? layer.o_bias : nullptr, hidden);
    for (std::size_t t = 0; t < x.size(); ++t) {
      for (std::size_t i = 0; i < hidden; ++i) x[t][i] += o[t][i];
    }
    h = rmsnorm(x, *layer.post_norm, c.rms_norm_eps);
    const Matrix gate = linear(h, read_tensor(*layer.gate), nullptr, c.intermediate_size);
    Matrix up = linear(h, read_tensor(*layer.up), nullptr, c.intermediate_size);
    for (std::size_t t = 0; t < up.size(); ++t) {
      for (std::size_t i = 0; i < up[t].size(); ++i) {
        const double g = gate[t][i];
        up[t][i] *= g / (1 + std::exp(-g));
      }
    }
    const Matrix down = linear(up, read_tensor(*layer.down), nullptr, hidden);
    for (std::size_t t = 0; t < x.size(); ++t) {
      for (std::size_t i = 0; i < hidden; ++i) x[t][i] += down[t][i];
    }
  }
  const Matrix normed = rmsnorm(x, *w.final_norm, c.rms_norm_eps);
  return linear(normed, read_tensor(*w.lm_head), nullptr, c.vocab_size);
}

double logits_relative_error(std::span<const float> got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return NAN;
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}

std::int32_t top_index(const std::vector<double>& row) {
  return static_cast<std::int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

double top_margin(const std::vector<double>& row) {
  const std::int32_t top = top_index(row);
  double second = -INFINITY;
  for (std::size_t i = 0; i < row.size(); ++i) {
    if (static_cast<std::int32_t>(i) != top) second = std::max(second, row[i]);
  }
  return row[static_cast<std::size_t>(top)] - second;
}

}  // namespace kvvm::testing
