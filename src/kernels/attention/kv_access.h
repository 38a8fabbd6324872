// What an attention call reads and writes besides the view: the activations' type and, for
// an fp8 cache, the scales its elements are multiplied by (1 for any other cache, whose
// scales are not read). Shared by the host paths so they agree on it.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "kvvm/kernels/attention.h"

namespace kvvm::kernels {

struct KvAccess {
  DType activations;
  float k_scale;
  float v_scale;
  KvHeadScales heads;  // an fp8 cache's per-head scales, else null

  float k_of(std::uint32_t kv_head) const {
    return heads.k != nullptr ? heads.k[kv_head] : k_scale;
  }
  float v_of(std::uint32_t kv_head) const {
    return heads.v != nullptr ? heads.v[kv_head] : v_scale;
  }
};

template <typename Params>
KvAccess kv_access_of(const Params& p) {
  const bool fp8 = p.view.element == DType::kFp8;
  return {activations_of(p.view, p.activations), fp8 ? p.k_scale : 1.0f, fp8 ? p.v_scale : 1.0f,
          fp8 ? p.head_scales : KvHeadScales{}};
}

// The host paths read per-head scales from host memory: each must be finite and positive, as
// check_activations requires of k_scale and v_scale.
inline Status check_host_head_scales(const KvView& view, const KvHeadScales& heads,
                                     std::uint32_t kv_heads, const char* what) {
  if (view.element != DType::kFp8 || heads.k == nullptr) return Status::Ok();
  for (std::uint32_t h = 0; h < kv_heads; ++h) {
    for (const auto& [name, scale] : {std::pair{"k", heads.k[h]}, std::pair{"v", heads.v[h]}}) {
      if (!std::isfinite(scale) || scale <= 0.0f) {
        return Status::InvalidArgument(std::string(what) + ": KV head " + std::to_string(h) +
                                       "'s " + name + " scale " + std::to_string(scale) +
                                       " is not a finite positive scale");
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvvm::kernels
