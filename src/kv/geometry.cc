// Model geometry: the per-token shape of a model's KV cache, built in or read from a Hugging
// Face config.json.
//
// Why config.json is read field by field with its own error for each: the file comes from a
// user's disk and the first thing they need to know when it does not fit is which field was
// missing or odd, and where. Multimodal configs keep the language model's fields under
// "text_config"; those are read when the top level has no layer count.
#include "kvvm/geometry.h"

#include <array>
#include <cctype>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "base/json_reader.h"

namespace kvvm {
namespace {

struct BuiltinModel {
  const char* name;
  std::uint32_t layers;
  std::uint32_t kv_heads;
  std::uint32_t head_dim;
};

// The models the issues name, with the numbers from their published config.json files.
constexpr std::array<BuiltinModel, 5> kBuiltinModels = {{
    {"qwen2.5-0.5b", 24, 2, 64},
    {"llama-3-8b", 32, 8, 128},
    {"qwen2.5-7b", 28, 4, 128},
    {"qwen2.5-14b", 48, 8, 128},
    {"llama-3-70b", 80, 8, 128},
}};

std::string lower(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string joined_builtin_names() {
  std::string names;
  for (const BuiltinModel& model : kBuiltinModels) {
    if (!names.empty()) names += ", ";
    names += model.name;
  }
  return names;
}

// Bounds on a config's numbers: several times the largest published models (126 layers, 128
// query heads, head_dim 256, hidden size 25,600), low enough that bytes_per_token and the
// layout's sizes cannot overflow 64 bits. A number past them is a corrupt or hostile file.
constexpr std::uint32_t kMaxLayers = 1024;
constexpr std::uint32_t kMaxHeads = 4096;  // query and KV heads alike
constexpr std::uint32_t kMaxHeadDim = 4096;
constexpr std::uint32_t kMaxHiddenSize = 1u << 20;
// config.json files are a few KiB; 16 MiB leaves room for ones that carry label tables.
constexpr std::size_t kMaxConfigBytes = std::size_t{16} << 20;

// Reads a config.json field that must be a whole number in [1, maximum]. Absent (or null, as
// some configs write "head_dim": null) is std::nullopt; present but malformed is an error
// naming the field, its value, the bound and the file.
Result<std::optional<std::uint32_t>> positive_field(const nlohmann::json& config, const char* field,
                                                    std::uint32_t maximum,
                                                    const std::string& where) {
  const auto found = config.find(field);
  if (found == config.end() || found->is_null()) return std::optional<std::uint32_t>();
  if (found->is_number_unsigned()) {
    const auto value = found->get<std::uint64_t>();
    if (value >= 1 && value <= maximum) {
      return std::optional<std::uint32_t>(static_cast<std::uint32_t>(value));
    }
  }
  return Status::InvalidArgument(where + ": field '" + field + "' is " + found->dump() +
                                 ", expected a whole number in [1, " + std::to_string(maximum) +
                                 "]");
}

}  // namespace

std::uint64_t Geometry::bytes_per_token() const {
  return std::uint64_t{layers} * 2 * kv_heads * head_dim * element_bytes();
}

std::vector<std::string> builtin_geometry_names() {
  std::vector<std::string> names;
  for (const BuiltinModel& model : kBuiltinModels) names.emplace_back(model.name);
  return names;
}

Result<Geometry> builtin_geometry(std::string_view name, DType dtype) {
  const std::string wanted = lower(name);
  for (const BuiltinModel& model : kBuiltinModels) {
    if (wanted != model.name) continue;
    Geometry geometry;
    geometry.name = model.name;
    geometry.layers = model.layers;
    geometry.kv_heads = model.kv_heads;
    geometry.head_dim = model.head_dim;
    geometry.dtype = dtype;
    return geometry;
  }
  return Status::InvalidArgument("unknown model '" + std::string(name) +
                                 "'; known: " + joined_builtin_names() +
                                 ", or a path to a Hugging Face config.json");
}

Result<Geometry> geometry_from_config_json(const std::string& path, std::optional<DType> dtype) {
  const std::string where = "config.json '" + path + "'";
  JsonLimits limits;
  limits.max_bytes = kMaxConfigBytes;
  Result<nlohmann::json> read = read_json_file(path, limits);
  if (!read.ok()) return read.status().with_context("config.json");
  const nlohmann::json& parsed = *read;
  if (!parsed.is_object()) return Status::InvalidArgument(where + " is not a JSON object");

  // Vision-language configs nest the language model's numbers; its KV cache is the one sized.
  const nlohmann::json* config = &parsed;
  std::string fields_where = where;
  const auto text_config = parsed.find("text_config");
  if (!parsed.contains("num_hidden_layers") && text_config != parsed.end() &&
      text_config->is_object()) {
    config = &*text_config;
    fields_where += " (under 'text_config')";
  }

  // A malformed field is reported at once; missing ones are collected so that one run names
  // every field the file lacks.
  const auto read_field = [&](const char* name, std::uint32_t maximum) {
    return positive_field(*config, name, maximum, fields_where);
  };
  Result<std::optional<std::uint32_t>> layers = read_field("num_hidden_layers", kMaxLayers);
  if (!layers.ok()) return layers.status();
  Result<std::optional<std::uint32_t>> kv_heads = read_field("num_key_value_heads", kMaxHeads);
  if (!kv_heads.ok()) return kv_heads.status();
  Result<std::optional<std::uint32_t>> attention_heads =
      read_field("num_attention_heads", kMaxHeads);
  if (!attention_heads.ok()) return attention_heads.status();
  Result<std::optional<std::uint32_t>> head_dim = read_field("head_dim", kMaxHeadDim);
  if (!head_dim.ok()) return head_dim.status();
  Result<std::optional<std::uint32_t>> hidden_size = read_field("hidden_size", kMaxHiddenSize);
  if (!hidden_size.ok()) return hidden_size.status();
  // Grouped-query attention: each KV head serves a whole group of query heads.
  if (kv_heads->has_value() && attention_heads->has_value()) {
    const std::uint32_t kv = **kv_heads;
    const std::uint32_t query = **attention_heads;
    if (kv > query) {
      return Status::InvalidArgument(fields_where + ": 'num_key_value_heads' " +
                                     std::to_string(kv) + " is more than 'num_attention_heads' " +
                                     std::to_string(query) +
                                     " (each KV head serves a group of query heads)");
    }
    if (query % kv != 0) {
      return Status::InvalidArgument(
          fields_where + ": 'num_attention_heads' " + std::to_string(query) +
          " is not a multiple of 'num_key_value_heads' " + std::to_string(kv) +
          " (each KV head serves a whole group of query heads)");
    }
  }

  std::vector<std::string> missing;
  Geometry geometry;
  geometry.name = path;
  if (layers->has_value()) {
    geometry.layers = **layers;
  } else {
    missing.push_back("'num_hidden_layers' (the number of layers)");
  }
  // Without grouped-query attention every attention head has its own K and V.
  if (kv_heads->has_value()) {
    geometry.kv_heads = **kv_heads;
  } else if (attention_heads->has_value()) {
    geometry.kv_heads = **attention_heads;
  } else {
    missing.push_back(
        "'num_key_value_heads' (the number of KV heads; 'num_attention_heads' stands in when "
        "it is absent, and is missing too)");
  }
  if (head_dim->has_value()) {
    geometry.head_dim = **head_dim;
  } else if (!hidden_size->has_value() || !attention_heads->has_value()) {
    missing.push_back(std::string("'head_dim' (the size of one head; 'hidden_size' / "
                                  "'num_attention_heads' stands in when it is absent, and ") +
                      (hidden_size->has_value() ? "'num_attention_heads'" : "'hidden_size'") +
                      " is missing)");
  } else if (**hidden_size % **attention_heads != 0) {
    return Status::InvalidArgument(
        fields_where + ": no 'head_dim', and 'hidden_size' " + std::to_string(**hidden_size) +
        " is not a multiple of 'num_attention_heads' " + std::to_string(**attention_heads));
  } else if (**hidden_size / **attention_heads > kMaxHeadDim) {
    return Status::InvalidArgument(
        fields_where + ": no 'head_dim', and 'hidden_size' " + std::to_string(**hidden_size) +
        " / 'num_attention_heads' " + std::to_string(**attention_heads) + " = " +
        std::to_string(**hidden_size / **attention_heads) + " is over the head size bound of " +
        std::to_string(kMaxHeadDim));
  } else {
    geometry.head_dim = **hidden_size / **attention_heads;
  }

  if (dtype) {
    geometry.dtype = *dtype;
  } else {
    // Newer transformers releases write "dtype" where older ones wrote "torch_dtype"; a
    // vision-language config may keep it at the top level rather than in text_config.
    const char* field = "torch_dtype";
    const nlohmann::json* found = nullptr;
    for (const nlohmann::json* scope : {config, &parsed}) {
      for (const char* name : {"torch_dtype", "dtype"}) {
        const auto candidate = scope->find(name);
        if (found == nullptr && candidate != scope->end() && !candidate->is_null()) {
          field = name;
          found = &*candidate;
        }
      }
    }
    if (found == nullptr) {
      missing.push_back("'torch_dtype' (the element type; --dtype gives one instead)");
    } else if (!found->is_string()) {
      return Status::InvalidArgument(where + ": field '" + field + "' is " + found->dump() +
                                     ", expected a string such as \"bfloat16\"");
    } else {
      Result<DType> parsed_dtype = parse_dtype(found->get<std::string>());
      if (!parsed_dtype.ok()) {
        return parsed_dtype.status().with_context(where + ": field '" + field + "'");
      }
      geometry.dtype = *parsed_dtype;
    }
  }
  if (!missing.empty()) {
    std::string message = fields_where + ": missing field" + (missing.size() > 1 ? "s " : " ");
    for (std::size_t i = 0; i < missing.size(); ++i) message += (i > 0 ? ", " : "") + missing[i];
    return Status::InvalidArgument(message);
  }
  return geometry;
}

Result<Geometry> resolve_geometry(std::string_view model, std::optional<DType> dtype) {
  const bool is_path = model.find('/') != std::string_view::npos || model.ends_with(".json");
  if (!is_path) return builtin_geometry(model, dtype.value_or(DType::kFp16));
  std::string path(model);
  // A model directory as downloaded from the Hub holds its config.json.
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) path += "/config.json";
  return geometry_from_config_json(path, dtype);
}

}  // namespace kvvm
