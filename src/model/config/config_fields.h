// Typed reads of config.json fields, each error naming the file, the field, its value and
// what was expected: the model config's parser (config.cc) and its RoPE part (config_rope.cc)
// share them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/json_reader.h"
#include "kvvm/base/dtype.h"
#include "kvvm/base/status.h"
#include "kvvm/model/config.h"
#include "model/json_show.h"

namespace kvvm::model::detail {

// Bounds on a config's numbers: several times the largest published models (126 layers, 128
// query heads, head_dim 256, hidden size 25,600), low enough that every weight's byte size and
// the KV layout's sizes stay far from 64-bit overflow. A number past them is a corrupt or
// hostile file.
inline constexpr std::uint32_t kMaxLayers = 1024;
inline constexpr std::uint32_t kMaxHeads = 4096;  // query and KV heads alike
inline constexpr std::uint32_t kMaxHeadDim = 4096;
inline constexpr std::uint32_t kMaxHiddenSize = 1u << 20;
inline constexpr std::uint32_t kMaxIntermediateSize = 1u << 22;
inline constexpr std::uint32_t kMaxVocabSize = 1u << 22;
inline constexpr std::uint32_t kMaxPositions = 1u << 24;

// config.json files are a few KiB; 16 MiB leaves room for ones that carry label tables.
JsonLimits config_limits();

class ConfigFields {
 public:
  // `object` must outlive this; `where` prefixes every error ("DIR/config.json", or that
  // with " (under 'text_config')"); `prefix` names the object ("rope_scaling.") in messages.
  ConfigFields(const nlohmann::json& object, std::string where, std::string prefix = {})
      : object_(object), where_(std::move(where)), prefix_(std::move(prefix)) {}

  const nlohmann::json& object() const { return object_; }
  const std::string& where() const { return where_; }

  // Null when absent or JSON null (HF writes "head_dim": null).
  const nlohmann::json* find(const char* field) const;
  bool has(const char* field) const { return find(field) != nullptr; }

  // A whole number in [minimum, maximum]; std::nullopt when absent.
  Result<std::optional<std::uint32_t>> whole(const char* field, std::uint32_t minimum,
                                             std::uint32_t maximum) const;
  // Like whole(), but absence is an error.
  Result<std::uint32_t> required_whole(const char* field, std::uint32_t minimum,
                                       std::uint32_t maximum) const;
  // A finite number > 0 (and < `below` when given); std::nullopt when absent.
  Result<std::optional<double>> positive(const char* field,
                                         std::optional<double> below = std::nullopt) const;
  Result<std::optional<bool>> boolean(const char* field) const;
  Result<std::optional<std::string>> string(const char* field) const;
  // A token id or a list of them, each in [0, vocab_size); std::nullopt when absent.
  Result<std::optional<std::vector<std::int32_t>>> token_ids(const char* field,
                                                             std::uint32_t vocab_size) const;

  // "WHERE: field 'PREFIXfield' is VALUE, expected EXPECTED".
  Status bad(const char* field, const nlohmann::json& value, const std::string& expected) const;
  // "WHERE: field 'PREFIXfield' is missing (WHY)".
  Status missing(const char* field, const std::string& why) const;
  std::string name(const char* field) const { return prefix_ + field; }

 private:
  const nlohmann::json& object_;
  std::string where_;
  std::string prefix_;
};

// RoPE from either form a checkpoint may carry: transformers v5's `rope_parameters`
// {rope_type, rope_theta, factor, ...}, or the older `rope_theta` beside `rope_scaling`
// {type | rope_type, factor, ...}. A scaling this runtime does not implement (yarn, dynamic,
// longrope, ...) is refused by name.
Result<RopeConfig> parse_rope(const ConfigFields& fields);

// The two scopes fields are read from: text_config when the file nests one (multimodal configs
// keep the language model's fields there) and has no layer count at the top, and the top level.
struct Scopes {
  ConfigFields inner;
  ConfigFields top;

  // The first of inner, top that holds `field`.
  const ConfigFields& holding(const char* field) const { return inner.has(field) ? inner : top; }
};
// `parsed` must be an object and outlive the result.
Scopes config_scopes(const nlohmann::json& parsed, const std::string& origin);

// quantization_config (model/config_quant.cc), from text_config first, then the top level:
// WeightQuant::kNone without one; Hugging Face's "fp8" with 128 x 128 blocks and dynamic
// activations, or compressed-tensors' FP8-dynamic; anything else (another method, block,
// strategy, static activation scales, a list leaving one of `config`'s quantized projections
// unquantized: attention, dense MLP, a mixture's experts) refused naming the field and its value.
// REQUIRES config's layers and mixture read.
Result<WeightQuant> parse_quantization(const Scopes& scopes, const ModelConfig& config);

// The mixtures of experts' families, which name their fields differently.
enum class MoeFamily : std::uint8_t { kQwen3Moe, kMixtral, kQwen2Moe };

// config.moe from `fields` (model/config_moe.cc), after the dense fields (layers,
// intermediate_size) are read: the experts, top k, renormalisation, the sparse layers, Qwen2-MoE's
// shared expert. InvalidArgument naming the field for one missing or out of bounds, and for the
// fields of routers this runtime does not implement (grouped top-k, score bias, another scoring
// function, routed scaling).
Status parse_moe(const ConfigFields& fields, MoeFamily family, ModelConfig& config);

// torch_dtype, or "dtype" as newer transformers releases write it, from text_config first, then
// the top level; std::nullopt when neither scope has one. fp8 is a KV element type but no
// checkpoint's, so only `allow_fp8` takes it.
Result<std::optional<DType>> read_dtype(const Scopes& scopes, bool allow_fp8);

}  // namespace kvvm::model::detail
