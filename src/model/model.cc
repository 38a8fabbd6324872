// The small pieces of the model layer's public types that every backend shares.
#include "kvvm/model/model.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace kvvm::model {

std::string_view to_string(Backend backend) {
  switch (backend) {
    case Backend::kCpu:
      return "cpu";
    case Backend::kCuda:
      return "cuda";
  }
  return "unknown";
}

std::size_t logprob_row_count(const StepBatch& batch) {
  const std::size_t chunks = std::min(batch.chunks.size(), batch.sampling.size());
  std::size_t rows = 0;
  for (std::size_t c = 0; c < chunks; ++c) {
    switch (batch.sampling[c].logprob_rows) {
      case LogprobRows::kNone:
        break;
      case LogprobRows::kLast:
        rows += 1;
        break;
      case LogprobRows::kAll:
        rows += batch.chunks[c].tokens;
        break;
    }
  }
  return rows;
}

Geometry ModelConfig::kv_geometry(DType kv_dtype) const {
  Geometry geometry;
  geometry.name = architecture;
  geometry.layers = layers;
  geometry.kv_heads = kv_heads;
  geometry.head_dim = head_dim;
  geometry.dtype = kv_dtype;
  return geometry;
}

Status Model::capture_decode_graphs(const DecodeGraphOptions& /*options*/) {
  return Status::Unavailable("the " + std::string(to_string(backend())) +
                             " backend has no decode graphs (only CUDA captures steps)");
}

std::uint64_t TensorView::elements() const {
  return std::accumulate(shape.begin(), shape.end(), std::uint64_t{1},
                         [](std::uint64_t a, std::uint64_t b) { return a * b; });
}

std::string shape_string(const std::vector<std::uint64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

}  // namespace kvvm::model
