// Model geometry: what the KV cache of one model looks like per token.
//
// L layers, H KV heads, D head dim, e bytes per element; K and V both stored, so one token
// costs L * 2 * H * D * e bytes whatever the layout (docs/ARCHITECTURE.md "Layouts and
// their arithmetic"). The KV layer keeps the shape and its arithmetic only: the model layer reads
// config.json into a ModelConfig and derives a Geometry from it (kvvm/model/kv_config.h),
// the built-in models' included.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/dtype.h"
#include "kvvm/base/status.h"

namespace kvvm {

struct Geometry {
  std::string name;
  std::uint32_t layers = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;
  DType dtype = DType::kFp16;

  std::uint32_t element_bytes() const { return kvvm::element_bytes(dtype); }
  // L * 2 * H * D * e.
  std::uint64_t bytes_per_token() const;
};

}  // namespace kvvm
