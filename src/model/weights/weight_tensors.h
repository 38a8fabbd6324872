// Every weight tensor of a model as the stores place it: its name, shape, region and offset
// (model/weight_layout.h), its checkpoint view, and how the dummy format draws it. One list for
// both backends, so the CPU and the CUDA loaders check the same things and a dummy model holds
// the same values on both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/model/config.h"
#include "kvvm/model/weights.h"
#include "model/weights/weight_layout.h"

namespace kvvm::model::detail {

inline constexpr std::uint32_t kBaseRegion = ~std::uint32_t{0};

struct WeightTensor {
  std::string name;  // the checkpoint's name (Hugging Face's)
  std::vector<std::uint64_t> shape;
  const TensorView* source = nullptr;  // null for the dummy format
  std::uint32_t region = kBaseRegion;  // kBaseRegion, or the layer whose block holds it
  std::uint64_t offset = 0;            // bytes from the region's start
  std::uint64_t elements = 0;
  // Dummy format: uniform in [-scale, scale) from tensor id `dummy_id`; scale 0: `constant`.
  std::uint32_t dummy_id = 0;
  float scale = 0;
  float constant = 0;
  // A quantized checkpoint's projection (config.weight_quant; kNone for every other tensor):
  // `source` is F8_E4M3 and `scale_source` its scale_count scales as the checkpoint stores
  // them (weight_scale_count; F32, BF16 or F16; null for the dummy format), w = e4m3 * the
  // scale of its 128 x 128 block or of its row. scale_offset: where the store keeps them as
  // float32 (device_scale_count of them: rows of blocks padded), bytes from the start of the
  // layer's block (q's, k's and v's back to back, gate's then up's); kNoTensor where the layout
  // keeps none (the projections in float32, the CPU backend's: it multiplies them in at load).
  WeightQuant quant = WeightQuant::kNone;
  const TensorView* scale_source = nullptr;
  std::uint64_t scale_count = 0;
  std::uint64_t scale_offset = kNoTensor;
};

// The tensors of `layout` in load order. With `weights` (null: the dummy format) each is bound
// to its view and checked: present, BF16 / F16 / F32 (a quantized projection F8_E4M3, with its
// scales present, F32 / BF16 / F16, of their shape), the config's shape, its bytes; a bias the
// config does not have is refused. InvalidArgument naming the tensor (and both shapes).
Result<std::vector<WeightTensor>> weight_tensors(const ModelConfig& config,
                                                 const WeightLayout& layout,
                                                 const ModelWeights* weights);

}  // namespace kvvm::model::detail
