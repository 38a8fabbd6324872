// The KV cache's geometry of a model, derived from its ModelConfig: from a Hugging Face
// config.json read by the model layer's one parser, or from a built-in model's config.
//
// Why a KV-shape read beside parse_model_config: `kvvm plan` and `simulate` size the KV cache
// of any decoder config.json, including architectures this runtime does not run, so the
// shape read checks the fields the KV cache needs (layers, heads, head size, dtype, with
// their bounds) and leaves the architecture and the runtime's feature checks to
// parse_model_config.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/dtype.h"
#include "kvvm/base/status.h"
#include "kvvm/kv/geometry.h"
#include "kvvm/model/config.h"

namespace kvvm::model {

// Reads num_hidden_layers, num_attention_heads, num_key_value_heads (num_attention_heads when
// absent), head_dim (or hidden_size / num_attention_heads), hidden_size and torch_dtype /
// dtype, from text_config for multimodal configs. InvalidArgument naming every missing field
// at once, or the malformed one with its value and bound; also for KV heads that exceed or do
// not divide the query heads. `dtype_given`: a missing torch_dtype is no error (the caller
// has one). The other fields of the result keep their defaults.
Result<ModelConfig> parse_kv_config(std::string_view config_json, std::string_view origin,
                                    bool dtype_given = false);

// parse_kv_config of the file at `path` (a config.json), read under the same limits as
// load_model_config (16 MiB, 64 levels deep, UTF-8). The result's name is `path`.
Result<ModelConfig> load_kv_config(const std::string& path, bool dtype_given = false);

// layers, kv_heads, head_dim of `config` in `dtype` (the config's own when absent), named
// config.name (its architecture when it has none).
Geometry kv_geometry(const ModelConfig& config, std::optional<DType> dtype = std::nullopt);

// The built-in models: qwen2.5-0.5b, llama-3-8b, qwen2.5-7b, qwen2.5-14b, llama-3-70b,
// qwen3-0.6b, qwen3-8b and the mixtures qwen3-30b-a3b, mixtral-8x7b, qwen2-57b-a14b, each the
// ModelConfig of its published config.json. Names ignore case.
// InvalidArgument naming the known names for anything else.
Result<ModelConfig> builtin_model_config(std::string_view name);
std::vector<std::string> builtin_model_names();
// kv_geometry(builtin_model_config(name), dtype): qwen2.5-0.5b (24, 2, 64), llama-3-8b
// (32, 8, 128), qwen2.5-7b (28, 4, 128), qwen2.5-14b (48, 8, 128), llama-3-70b (80, 8, 128),
// qwen3-0.6b (28, 8, 128), qwen3-8b (36, 8, 128), qwen3-30b-a3b (48, 4, 128), mixtral-8x7b
// (32, 8, 128), qwen2-57b-a14b (28, 4, 128).
Result<Geometry> builtin_geometry(std::string_view name, DType dtype = DType::kFp16);

}  // namespace kvvm::model
