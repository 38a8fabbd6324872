#include "model/cuda_rope_table.h"

#include <cmath>
#include <numbers>

namespace kvvm::model::detail {

std::vector<float> cuda_rope_inv_freq(const ModelConfig& config) {
  const std::uint32_t dim = config.head_dim;
  std::vector<float> inv_freq(dim / 2);
  const float base = static_cast<float>(config.rope.theta);
  for (std::uint32_t i = 0; i < dim / 2; ++i) {
    // 1.0 / (base ** (arange(0, dim, 2).float() / dim)), every step in float32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv_freq[i] = 1.0f / std::pow(base, exponent);
  }
  const RopeConfig& rope = config.rope;
  const float factor = static_cast<float>(rope.factor);
  if (rope.scaling == RopeScaling::kLinear) {
    for (float& f : inv_freq) f /= factor;
  } else if (rope.scaling == RopeScaling::kLlama3) {
    const float original = static_cast<float>(rope.original_max_position);
    const float low_wavelen = static_cast<float>(rope.original_max_position / rope.low_freq_factor);
    const float high_wavelen =
        static_cast<float>(rope.original_max_position / rope.high_freq_factor);
    const float span = static_cast<float>(rope.high_freq_factor - rope.low_freq_factor);
    const float two_pi = static_cast<float>(2 * std::numbers::pi);
    for (float& f : inv_freq) {
      const float wavelen = two_pi / f;
      float scaled = wavelen > low_wavelen ? f / factor : f;
      const float smooth = (original / wavelen - static_cast<float>(rope.low_freq_factor)) / span;
      const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) scaled = smoothed;
      f = scaled;
    }
  }
  return inv_freq;
}

}  // namespace kvvm::model::detail
