// KvScales: the scales of an fp8 (e4m3) KV cache, one per layer (vLLM's default scheme) or one
// per layer and KV head. The cache stores value / scale, so a scale is the largest magnitude a
// layer's K (or V) may take divided by 448 (e4m3's largest finite value); a value beyond
// scale * 448 saturates.
//
// Where they come from, in order: the checkpoint's `model.layers.{i}.self_attn.k_scale` /
// `v_scale` tensors (as vLLM and compressed-tensors checkpoints store them: one value, or one
// per KV head); else a calibration over the first prefill when asked for
// (Model::calibrate_kv_scales); else 1.0 (the range of e4m3 itself, vLLM's default). A bf16 /
// fp16 / fp32 cache ignores them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"

namespace kvvm::model {

enum class KvScaleSource : std::uint8_t {
  kDefault,     // 1.0 for every layer
  kCheckpoint,  // read from the checkpoint's k_scale / v_scale tensors
  kCalibrated,  // measured over the first prefill: max |value| / kCalibrationRange per layer
};

// "default", "checkpoint", "calibrated".
std::string_view to_string(KvScaleSource source);

// A calibration maps the largest |K| (or |V|) of the first prefill to 224, half of e4m3's 448:
// later tokens up to twice as large still fit, and e4m3's relative precision is the same over
// its whole normal range (three mantissa bits), so the headroom costs only the smallest
// magnitudes (below 2^-6 of the scale, where the subnormals start).
inline constexpr float kCalibrationRange = 224.0f;

struct KvScales {
  KvScaleSource source = KvScaleSource::kDefault;
  std::uint32_t heads = 1;  // values per layer: 1 (one per layer) or the model's KV heads
  std::vector<float> k;     // [layers][heads], each finite and > 0
  std::vector<float> v;

  // Ones for `layers` layers, one per layer.
  static KvScales ones(std::uint32_t layers);
  bool per_head() const { return heads > 1; }
  // Layer `layer`'s scale of KV head `head` (one per layer: the layer's, whatever the head).
  float k_of(std::uint32_t layer, std::uint32_t head = 0) const { return at(k, layer, head); }
  float v_of(std::uint32_t layer, std::uint32_t head = 0) const { return at(v, layer, head); }
  // The layer's [heads] scales when per head, else null (the kernels' KvHeadScales).
  const float* k_heads(std::uint32_t layer) const { return row(k, layer); }
  const float* v_heads(std::uint32_t layer) const { return row(v, layer); }
  // One line for start-up: the source and the range over layers (and heads), e.g.
  // "k_scale 0.0123..0.0456, v_scale 0.0031..0.0101 (from the checkpoint)".
  std::string describe() const;
  // A digest of the element type's scheme for prefix-cache keys: two caches whose scales
  // differ in any bit never share K / V.
  std::string fingerprint() const;

 private:
  float at(const std::vector<float>& values, std::uint32_t layer, std::uint32_t head) const {
    const std::size_t i = std::size_t{layer} * heads + (head < heads ? head : 0);
    return i < values.size() ? values[i] : 1.0f;
  }
  const float* row(const std::vector<float>& values, std::uint32_t layer) const {
    const std::size_t i = std::size_t{layer} * heads;
    return per_head() && i + heads <= values.size() ? values.data() + i : nullptr;
  }
};

// InvalidArgument naming the layer (and head) and the value when a scale is not finite and
// positive, or the vectors are not `heads` per layer with heads 1 or `kv_heads`.
Status check_kv_scales(const KvScales& scales, std::uint32_t layers, std::uint32_t kv_heads);

}  // namespace kvvm::model
