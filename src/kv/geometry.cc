// Model geometry: the per-token shape of a model's KV cache. Reading it from a config.json, or
// from a built-in model's name, is the model layer's (src/model/config/kv_config.cc).
#include "kvvm/kv/geometry.h"

namespace kvvm {

std::uint64_t Geometry::bytes_per_token() const {
  return std::uint64_t{layers} * 2 * kv_heads * head_dim * element_bytes();
}

}  // namespace kvvm
