// RoPE's inverse frequencies as transformers computes them (float32), and the rotation.
#include "model/rope.h"

#include <cmath>
#include <cstdint>
#include <numbers>

namespace kvvm::model {
namespace {

// transformers' _compute_default_rope_parameters: 1 / theta^(arange(0, d, 2).float() / d).
// The power is rounded once to float32 (as a float32 pow does, to within an ulp).
std::vector<float> default_inv_freq(double theta, std::uint32_t head_dim) {
  std::vector<float> inv_freq(head_dim / 2);
  for (std::uint32_t i = 0; i < inv_freq.size(); ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const auto power = static_cast<float>(std::pow(static_cast<float>(theta), double{exponent}));
    inv_freq[i] = 1.0f / power;
  }
  return inv_freq;
}

// transformers' _compute_llama3_parameters, with its float32 tensor arithmetic.
void llama3_rescale(const RopeConfig& rope, std::vector<float>& inv_freq) {
  const auto factor = static_cast<float>(rope.factor);
  const auto low = static_cast<float>(rope.low_freq_factor);
  const auto original = static_cast<float>(rope.original_max_position);
  const auto low_freq_wavelen =
      static_cast<float>(rope.original_max_position / rope.low_freq_factor);
  const auto high_freq_wavelen =
      static_cast<float>(rope.original_max_position / rope.high_freq_factor);
  const auto two_pi = static_cast<float>(2 * std::numbers::pi);
  const auto spread = static_cast<float>(rope.high_freq_factor - rope.low_freq_factor);
  for (float& f : inv_freq) {
    const float wavelen = two_pi / f;
    if (wavelen > low_freq_wavelen) {
      f = f / factor;
    } else if (!(wavelen < high_freq_wavelen)) {
      const float smooth = (original / wavelen - low) / spread;
      f = (1.0f - smooth) * f / factor + smooth * f;
    }
  }
}

}  // namespace

std::vector<float> rope_inv_freq(const ModelConfig& config) {
  std::vector<float> inv_freq = default_inv_freq(config.rope.theta, config.head_dim);
  switch (config.rope.scaling) {
    case RopeScaling::kNone:
      break;
    case RopeScaling::kLinear: {
      const auto factor = static_cast<float>(config.rope.factor);
      for (float& f : inv_freq) f = f / factor;
      break;
    }
    case RopeScaling::kLlama3:
      llama3_rescale(config.rope, inv_freq);
      break;
  }
  return inv_freq;
}

void apply_rope(float* head, std::uint32_t head_dim, const float* inv_freq,
                std::uint32_t position) {
  const std::uint32_t half = head_dim / 2;
  const auto p = static_cast<float>(position);
  for (std::uint32_t i = 0; i < half; ++i) {
    const float angle = p * inv_freq[i];  // float32, as HF's inv_freq @ positions
    const auto c = static_cast<float>(std::cos(double{angle}));
    const auto s = static_cast<float>(std::sin(double{angle}));
    const float x0 = head[i];
    const float x1 = head[i + half];
    head[i] = x0 * c - x1 * s;
    head[i + half] = x1 * c + x0 * s;
  }
}

}  // namespace kvvm::model
