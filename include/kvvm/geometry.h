// Model geometry: what the KV cache of one model looks like per token.
//
// L layers, H KV heads, D head dim, e bytes per element; K and V both stored, so one token
// costs L * 2 * H * D * e bytes whatever the layout (DESIGN.md, "Layouts and their
// arithmetic"). Built-in geometries cover the models the issues name; any Hugging Face
// config.json can be read too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/dtype.h"
#include "kvvm/status.h"

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

// qwen2.5-0.5b (24, 2, 64), llama-3-8b (32, 8, 128), qwen2.5-7b (28, 4, 128),
// qwen2.5-14b (48, 8, 128), llama-3-70b (80, 8, 128); fp16 unless told otherwise.
// InvalidArgument naming the known names for anything else.
Result<Geometry> builtin_geometry(std::string_view name, DType dtype = DType::kFp16);
std::vector<std::string> builtin_geometry_names();

// Reads num_hidden_layers, num_key_value_heads (num_attention_heads when absent, as in
// models without GQA), head_dim (or hidden_size / num_attention_heads) and torch_dtype from a
// Hugging Face config.json. InvalidArgument naming the missing or malformed field and the
// path; also for KV heads that exceed or do not divide the query heads, and for numbers past
// the bounds (layers <= 1024, heads <= 4096, head_dim <= 4096, hidden_size <= 2^20), a file
// over 16 MiB, nested over 64 deep or not UTF-8. `dtype`, when given, overrides torch_dtype.
Result<Geometry> geometry_from_config_json(const std::string& path,
                                           std::optional<DType> dtype = std::nullopt);

// A built-in name, or a path to a config.json (anything containing '/' or ending in .json).
Result<Geometry> resolve_geometry(std::string_view model, std::optional<DType> dtype);

}  // namespace kvvm
