// What an attention call reads and writes besides the view: the activations' type and, for
// an fp8 cache, the scales its elements are multiplied by (1 for any other cache, whose
// scales are not read). Shared by the host paths so they agree on it.
#pragma once

#include "kvvm/attention.h"

namespace kvvm::kernels {

struct KvAccess {
  DType activations;
  float k_scale;
  float v_scale;
};

template <typename Params>
KvAccess kv_access_of(const Params& p) {
  const bool fp8 = p.view.element == DType::kFp8;
  return {activations_of(p.view, p.activations), fp8 ? p.k_scale : 1.0f, fp8 ? p.v_scale : 1.0f};
}

}  // namespace kvvm::kernels
