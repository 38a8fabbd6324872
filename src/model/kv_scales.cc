#include "kvvm/model/kv_scales.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

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
  return "k_scale " + range_of(k) + ", v_scale " + range_of(v) + " (" + from + ")";
}

std::string KvScales::fingerprint() const {
  std::string bits(k.size() * 4 + v.size() * 4, '\0');
  if (!k.empty()) std::memcpy(bits.data(), k.data(), k.size() * 4);
  if (!v.empty()) std::memcpy(bits.data() + k.size() * 4, v.data(), v.size() * 4);
  return bits;
}

Status check_kv_scales(const KvScales& scales, std::uint32_t layers) {
  if (scales.k.size() != layers || scales.v.size() != layers) {
    return Status::InvalidArgument("KV scales: " + std::to_string(scales.k.size()) + " k and " +
                                   std::to_string(scales.v.size()) + " v scales for " +
                                   std::to_string(layers) + " layers");
  }
  for (std::uint32_t i = 0; i < layers; ++i) {
    for (const auto& [name, value] :
         {std::pair{"k_scale", scales.k[i]}, std::pair{"v_scale", scales.v[i]}}) {
      if (!std::isfinite(value) || value <= 0.0f) {
        return Status::InvalidArgument("KV scales: layer " + std::to_string(i) + "'s " + name +
                                       " is " + std::to_string(value) +
                                       "; a scale must be finite and positive");
      }
    }
  }
  return Status::Ok();
}

Status Model::set_kv_scales(KvScales scales) {
  KVVM_RETURN_IF_ERROR(check_kv_scales(scales, config_.layers));
  kv_scales_ = std::move(scales);
  return Status::Ok();
}

}  // namespace kvvm::model
