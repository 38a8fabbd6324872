// The rotary embedding's inverse frequencies of a config, as the CUDA model uploads them.
// Private to the CUDA model until the shared src/model/rope.h lands (then this goes).
#pragma once

#include <vector>

#include "kvvm/model/config.h"

namespace kvvm::model::detail {

// [head_dim / 2] floats, computed in float32 step by step as Hugging Face's
// _compute_default_rope_parameters / _compute_linear_scaling_rope_parameters /
// _compute_llama3_parameters compute them, so the angles match bit for bit.
std::vector<float> cuda_rope_inv_freq(const ModelConfig& config);

}  // namespace kvvm::model::detail
