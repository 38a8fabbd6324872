#include "kvvm/model/kv_scales.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "kvvm/base/log.h"
#include "kvvm/model/model.h"

namespace kvvm::model {

std::string_view to_string(KvScaleSource source) {
  switch (source) {
    case KvScaleSource::kDefault:
      return "default";
    case KvScaleSource::kCheckpoint:
      return "checkpoint";
    case KvScaleSource::kCalibrated:
      return "calibrated";
  }
  return "unknown";
}

KvScales KvScales::ones(std::uint32_t layers) {
  KvScales scales;
  scales.k.assign(layers, 1.0f);
  scales.v.assign(layers, 1.0f);
  return scales;
}

namespace {

std::string range_of(const std::vector<float>& values) {
  if (values.empty()) return "none";
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  std::ostringstream out;
  out.precision(4);
  out << *low;
  if (*high != *low) out << ".." << *high;
  return out.str();
}

}  // namespace

std::string KvScales::describe() const {
  const char* from = source == KvScaleSource::kCheckpoint   ? "from the checkpoint"
                     : source == KvScaleSource::kCalibrated ? "calibrated on the first prefill"
                                                            : "the default: no scales given";
  return "k_scale " + range_of(k) + ", v_scale " + range_of(v) +
         (per_head() ? " per KV head" : "") + " (" + from + ")";
}

std::string KvScales::fingerprint() const {
  std::string bits(4 + k.size() * 4 + v.size() * 4, '\0');
  std::memcpy(bits.data(), &heads, 4);
  if (!k.empty()) std::memcpy(bits.data() + 4, k.data(), k.size() * 4);
  if (!v.empty()) std::memcpy(bits.data() + 4 + k.size() * 4, v.data(), v.size() * 4);
  return bits;
}

Status check_kv_scales(const KvScales& scales, std::uint32_t layers, std::uint32_t kv_heads) {
  if (scales.heads != 1 && scales.heads != kv_heads) {
    return Status::InvalidArgument("KV scales: " + std::to_string(scales.heads) +
                                   " per layer; one, or one per KV head (" +
                                   std::to_string(kv_heads) + ")");
  }
  const std::size_t count = std::size_t{layers} * scales.heads;
  if (scales.k.size() != count || scales.v.size() != count) {
    return Status::InvalidArgument("KV scales: " + std::to_string(scales.k.size()) + " k and " +
                                   std::to_string(scales.v.size()) + " v scales for " +
                                   std::to_string(layers) + " layers of " +
                                   std::to_string(scales.heads) + " each");
  }
  for (std::size_t i = 0; i < count; ++i) {
    for (const auto& [name, value] :
         {std::pair{"k_scale", scales.k[i]}, std::pair{"v_scale", scales.v[i]}}) {
      if (!std::isfinite(value) || value <= 0.0f) {
        const std::string head =
            scales.per_head() ? " (KV head " + std::to_string(i % scales.heads) + ")" : "";
        return Status::InvalidArgument("KV scales: layer " + std::to_string(i / scales.heads) +
                                       "'s " + name + head + " is " + std::to_string(value) +
                                       "; a scale must be finite and positive");
      }
    }
  }
  return Status::Ok();
}

Status Model::set_kv_scales(KvScales scales) {
  KVVM_RETURN_IF_ERROR(check_kv_scales(scales, config_.layers, config_.kv_heads));
  kv_scales_ = std::move(scales);
  return kv_scales_changed();
}

Status Model::calibrate_kv_scales() {
  KVVM_RETURN_IF_ERROR(set_kv_scales(KvScales::ones(config_.layers)));
  calibration_pending_ = true;
  return Status::Ok();
}

bool Model::calibrates(const StepBatch& batch) const {
  if (!calibration_pending_) return false;
  return std::any_of(batch.chunks.begin(), batch.chunks.end(),
                     [](const Chunk& chunk) { return chunk.start == 0; });
}

Status Model::set_calibrated_layer(std::uint32_t layer, float k_max, float v_max) {
  // Zero everywhere (any scale stores zeros exactly), so small the scale would round to zero,
  // or not finite (the values are lost anyway): the default.
  const auto scale_of = [](float most) {
    const float scale = most / kCalibrationRange;
    return std::isfinite(scale) && scale > 0.0f ? scale : 1.0f;
  };
  kv_scales_.k[layer] = scale_of(k_max);
  kv_scales_.v[layer] = scale_of(v_max);
  return kv_scales_changed();
}

void Model::end_calibration() {
  kv_scales_.source = KvScaleSource::kCalibrated;
  calibration_pending_ = false;
  // The start-up line could only say they would be measured: say what they are.
  log(LogLevel::kInfo, "fp8 (e4m3) KV scales: " + kv_scales_.describe());
}

}  // namespace kvvm::model
