// RoPE's inverse frequencies, computed once per model and shared by the CPU and CUDA
// backends so both rotate by exactly the same angles.
//
// Why float32 step by step: Hugging Face transformers builds the table in float32 tensors
// (the default table, then the `linear` or `llama3` rescaling) and multiplies positions by it
// in float32; rounding the same way keeps our angles bit-close to the reference at long
// positions, where a float64 table would drift by position * ulp.
#pragma once

#include <vector>

#include "kvvm/model/config.h"

namespace kvvm::model {

// head_dim / 2 inverse frequencies: inv_freq[i] = 1 / theta^(2i / head_dim), then
//   linear: inv_freq / factor (HF divides the positions by factor; the same angles);
//   llama3: wavelen = 2 pi / inv_freq; above original / low_freq_factor: inv_freq / factor;
//           below original / high_freq_factor: unchanged; between: a smooth blend of both.
std::vector<float> rope_inv_freq(const ModelConfig& config);

// Rotates one head of `head_dim` floats in place at `position` (the rotate_half form:
// x[i], x[i + d/2] rotated by angle position * inv_freq[i], computed in float32).
void apply_rope(float* head, std::uint32_t head_dim, const float* inv_freq, std::uint32_t position);

}  // namespace kvvm::model
