// The CPU backend's weights: every tensor converted to float32 once at load (OpenBLAS's sgemm
// reads float32), so the checkpoint's mapping may be dropped afterwards.
#pragma once

#include <vector>

#include "kvvm/model/config.h"
#include "kvvm/model/weights.h"
#include "kvvm/status.h"

namespace kvvm::model::cpu {

struct CpuLayerWeights {
  std::vector<float> input_norm;  // [hidden]
  std::vector<float> q, k, v;     // [out][hidden], as stored (the GEMM reads them transposed)
  std::vector<float> q_bias, k_bias, v_bias;  // empty unless config.qkv_bias
  std::vector<float> o;                       // [hidden][heads * head_dim]
  std::vector<float> o_bias;                  // empty unless config.o_bias
  std::vector<float> post_norm;               // [hidden]
  std::vector<float> gate, up;                // [intermediate][hidden]
  std::vector<float> down;                    // [hidden][intermediate]
};

struct CpuWeights {
  std::vector<float> embed;  // [vocab][hidden]
  std::vector<CpuLayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  std::vector<float> lm_head;     // [vocab][hidden]; empty when tied to embed
  const float* lm_head_data() const { return lm_head.empty() ? embed.data() : lm_head.data(); }
};

// Checks every tensor (present, BF16 / F16 / F32, the config's shape, its bytes) and converts
// it. InvalidArgument naming the tensor (and both shapes) otherwise; a bias given where the
// config has none is refused too, since ignoring it would change the outputs silently.
Result<CpuWeights> convert_weights(const ModelConfig& config, const ModelWeights& weights);

}  // namespace kvvm::model::cpu
