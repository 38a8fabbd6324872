// KvScales: the per-layer scales of an fp8 (e4m3) KV cache. The cache stores value / scale,
// so a scale is the largest magnitude a layer's K (or V) may take divided by 448 (e4m3's
// largest finite value); a value beyond scale * 448 saturates.
//
// Where they come from, in order: the checkpoint's `model.layers.{i}.self_attn.k_scale` /
// `v_scale` scalars (as vLLM and compressed-tensors checkpoints store them); else a
// calibration over the first prefill when asked for; else 1.0 (the range of e4m3 itself,
// vLLM's default). A bf16 / fp16 / fp32 cache ignores them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/status.h"

namespace kvvm::model {

enum class KvScaleSource : std::uint8_t {
  kDefault,     // 1.0 for every layer
  kCheckpoint,  // read from the checkpoint's k_scale / v_scale tensors
  kCalibrated,  // measured over the first prefill: max |value| / 448 per layer
};

// "default", "checkpoint", "calibrated".
std::string_view to_string(KvScaleSource source);

struct KvScales {
  KvScaleSource source = KvScaleSource::kDefault;
  std::vector<float> k;  // one per layer, each finite and > 0
  std::vector<float> v;

  // Ones for `layers` layers.
  static KvScales ones(std::uint32_t layers);
  float k_of(std::uint32_t layer) const { return layer < k.size() ? k[layer] : 1.0f; }
  float v_of(std::uint32_t layer) const { return layer < v.size() ? v[layer] : 1.0f; }
  // One line for start-up: the source and the range over layers, e.g.
  // "k_scale 0.0123..0.0456, v_scale 0.0031..0.0101 (from the checkpoint)".
  std::string describe() const;
  // A digest of the element type's scheme for prefix-cache keys: two caches whose scales
  // differ in any bit never share K / V.
  std::string fingerprint() const;
};

// InvalidArgument naming the layer and the value when a scale is not finite and positive, or
// the vectors are not one per layer.
Status check_kv_scales(const KvScales& scales, std::uint32_t layers);

}  // namespace kvvm::model
