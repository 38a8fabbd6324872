// A Hugging Face config.json (and generation_config.json) read into a ModelConfig, field by
// field, each error naming the file, the field and its value.
//
// Multimodal configs keep the language model's fields under "text_config": they are read
// there when the top level has no layer count, and the fields a wrapper may keep at its top level
// (architectures, model_type, dtype, tie_word_embeddings, token ids) are looked for in text_config
// first, then at the top.
#include "kvvm/model/config.h"

#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "base/json_reader.h"
#include "model/config/config_fields.h"

namespace kvvm::model {
namespace {

using detail::ConfigFields;
using detail::kMaxHeadDim;
using detail::kMaxHeads;
using detail::kMaxHiddenSize;
using detail::kMaxIntermediateSize;
using detail::kMaxLayers;
using detail::kMaxPositions;
using detail::kMaxVocabSize;
using detail::Scopes;

struct Family {
  const char* architecture;
  const char* model_type;
  // The dense family whose attention it has (itself for a dense one), and its experts' kind.
  const char* attention;
  bool moe = false;
  detail::MoeFamily moe_family = detail::MoeFamily::kQwen3Moe;
};
constexpr Family kFamilies[] = {
    {"LlamaForCausalLM", "llama", "llama"},
    {"Qwen2ForCausalLM", "qwen2", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3", "qwen3"},
    {"MistralForCausalLM", "mistral", "mistral"},
    {"Qwen3MoeForCausalLM", "qwen3_moe", "qwen3", true, detail::MoeFamily::kQwen3Moe},
    {"MixtralForCausalLM", "mixtral", "mistral", true, detail::MoeFamily::kMixtral},
    {"Qwen2MoeForCausalLM", "qwen2_moe", "qwen2", true, detail::MoeFamily::kQwen2Moe},
};
constexpr const char* kFamilyList =
    "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, "
    "Qwen3MoeForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM";

bool is_family(const Family& family, std::string_view model_type) {
  return std::string_view(family.model_type) == model_type;
}

// Whether the family's attention is that of the dense family `model_type` (Qwen3-MoE's is
// Qwen3's, Mixtral's Mistral's, Qwen2-MoE's Qwen2's).
bool attends_as(const Family& family, std::string_view model_type) {
  return std::string_view(family.attention) == model_type;
}

Result<const Family*> read_family(const Scopes& scopes) {
  const Family* family = nullptr;
  const ConfigFields& arch_scope = scopes.holding("architectures");
  if (const nlohmann::json* architectures = arch_scope.find("architectures")) {
    if (!architectures->is_array() || architectures->empty() || !(*architectures)[0].is_string()) {
      return arch_scope.bad("architectures", *architectures,
                            "a list of class names such as [\"LlamaForCausalLM\"]");
    }
    const std::string name = (*architectures)[0].get<std::string>();
    for (const Family& candidate : kFamilies) {
      if (name == candidate.architecture) family = &candidate;
    }
    if (family == nullptr) {
      return Status::InvalidArgument(arch_scope.where() + ": field 'architectures[0]' is " +
                                     detail::show(nlohmann::json(name)) +
                                     ", which this runtime does not run (it runs " + kFamilyList +
                                     ")");
    }
  }
  const ConfigFields& type_scope = scopes.holding("model_type");
  KVVM_ASSIGN_OR_RETURN(std::optional<std::string> model_type, type_scope.string("model_type"));
  if (family == nullptr) {
    // Without architectures the model type names the family.
    if (!model_type.has_value()) {
      return scopes.inner.missing("architectures", std::string("one of ") + kFamilyList);
    }
    for (const Family& candidate : kFamilies) {
      if (*model_type == candidate.model_type) family = &candidate;
    }
    if (family == nullptr) {
      return type_scope.bad("model_type", nlohmann::json(*model_type),
                            "llama, qwen2, qwen3, mistral, qwen3_moe, mixtral or qwen2_moe (no "
                            "'architectures' names the class)");
    }
  } else if (model_type.has_value() && *model_type != family->model_type) {
    return type_scope.bad("model_type", nlohmann::json(*model_type),
                          std::string("\"") + family->model_type + "\" for " +
                              family->architecture + " (architectures[0])");
  }
  return family;
}

// Qwen3's config class declares head_dim = 128, so transformers builds a Qwen3 without the
// field with heads of 128 whatever hidden_size / num_attention_heads is.
constexpr std::uint32_t kQwen3DefaultHeadDim = 128;

// The attention shape: heads, KV heads and the head size, with the checks RoPE and grouped-
// query attention need.
Status read_attention(const ConfigFields& fields, const Family& family, ModelConfig& config) {
  KVVM_ASSIGN_OR_RETURN(std::uint32_t heads,
                        fields.required_whole("num_attention_heads", 1, kMaxHeads));
  config.heads = heads;
  KVVM_ASSIGN_OR_RETURN(std::optional<std::uint32_t> kv_heads,
                        fields.whole("num_key_value_heads", 1, kMaxHeads));
  // Without grouped-query attention every query head has its own K and V.
  config.kv_heads = kv_heads.value_or(config.heads);
  if (config.heads % config.kv_heads != 0) {
    return Status::InvalidArgument(
        fields.where() + ": 'num_attention_heads' " + std::to_string(config.heads) +
        " is not a multiple of 'num_key_value_heads' " + std::to_string(config.kv_heads) +
        " (each KV head serves a whole group of query heads)");
  }
  KVVM_ASSIGN_OR_RETURN(std::optional<std::uint32_t> head_dim,
                        fields.whole("head_dim", 1, kMaxHeadDim));
  if (head_dim.has_value()) {
    config.head_dim = *head_dim;
  } else if (is_family(family, "qwen3")) {
    config.head_dim = kQwen3DefaultHeadDim;
  } else if (config.hidden_size % config.heads != 0) {
    return Status::InvalidArgument(fields.where() + ": no 'head_dim', and 'hidden_size' " +
                                   std::to_string(config.hidden_size) +
                                   " is not a multiple of 'num_attention_heads' " +
                                   std::to_string(config.heads));
  } else {
    config.head_dim = config.hidden_size / config.heads;
  }
  if (config.head_dim > kMaxHeadDim || config.head_dim % 2 != 0) {
    return Status::InvalidArgument(fields.where() + ": the head size (" +
                                   (head_dim.has_value() || is_family(family, "qwen3")
                                        ? std::string("'head_dim'")
                                        : "'hidden_size' / 'num_attention_heads'") +
                                   ") is " + std::to_string(config.head_dim) +
                                   ", expected an even number (RoPE rotates " +
                                   "pairs) of at most " + std::to_string(kMaxHeadDim));
  }
  return Status::Ok();
}

// Features that change the outputs when ignored: refused unless off.
Status read_features(const ConfigFields& fields, const Family& family, ModelConfig& config) {
  KVVM_ASSIGN_OR_RETURN(std::optional<bool> mlp_bias, fields.boolean("mlp_bias"));
  if (mlp_bias.value_or(false)) {
    return fields.bad("mlp_bias", nlohmann::json(true),
                      "false: MLP biases are not implemented by this runtime");
  }
  KVVM_ASSIGN_OR_RETURN(std::optional<bool> attention_bias, fields.boolean("attention_bias"));
  if (attends_as(family, "qwen2")) {
    // Qwen2's attention always has q/k/v biases and never an o bias, whatever the file says.
    config.qkv_bias = true;
    config.o_bias = false;
    if (family.moe) {
      // Newer Qwen2-MoE configs may say whether the biases exist; one without them is a model
      // this runtime has not been checked against, so it is refused rather than guessed.
      KVVM_ASSIGN_OR_RETURN(std::optional<bool> qkv_bias, fields.boolean("qkv_bias"));
      if (!qkv_bias.value_or(true)) {
        return fields.bad("qkv_bias", nlohmann::json(false),
                          "true or absent: Qwen2-MoE's attention without q/k/v biases is not "
                          "implemented by this runtime");
      }
    }
  } else {
    config.qkv_bias = attention_bias.value_or(false);
    config.o_bias = config.qkv_bias;
  }
  // Qwen3 normalises every q and k head; no config field turns it off.
  config.qk_norm = attends_as(family, "qwen3");
  KVVM_ASSIGN_OR_RETURN(std::optional<std::string> act, fields.string("hidden_act"));
  if (act.has_value() && *act != "silu" && *act != "swish") {
    return fields.bad("hidden_act", nlohmann::json(*act),
                      "\"silu\" (the MLP's activation this runtime implements)");
  }
  // transformers v5 lists each layer's attention kind; a sliding one is a window in disguise.
  if (const nlohmann::json* layer_types = fields.find("layer_types")) {
    if (!layer_types->is_array()) {
      return fields.bad("layer_types", *layer_types, "a list of attention kinds");
    }
    for (std::size_t i = 0; i < layer_types->size(); ++i) {
      const nlohmann::json& kind = (*layer_types)[i];
      if (kind != "full_attention") {
        return Status::InvalidArgument(
            fields.where() + ": field 'layer_types[" + std::to_string(i) + "]' is " +
            detail::show(kind) +
            ", expected \"full_attention\" (other attention kinds, such as sliding-window "
            "attention, are not implemented by this runtime)");
      }
    }
  }
  // A window at least as long as the context never drops a token, so it changes nothing.
  if (attends_as(family, "mistral")) {
    if (const nlohmann::json* window = fields.find("sliding_window")) {
      KVVM_ASSIGN_OR_RETURN(
          std::optional<std::uint32_t> size,
          fields.whole("sliding_window", 1, std::numeric_limits<std::uint32_t>::max()));
      if (*size < config.max_position_embeddings) {
        return fields.bad("sliding_window", *window,
                          "null or at least max_position_embeddings " +
                              std::to_string(config.max_position_embeddings) +
                              ": sliding-window attention is not implemented by this runtime");
      }
    }
  }
  if (attends_as(family, "qwen2") || attends_as(family, "qwen3")) {
    KVVM_ASSIGN_OR_RETURN(std::optional<bool> sliding, fields.boolean("use_sliding_window"));
    if (sliding.value_or(false)) {
      return fields.bad("use_sliding_window", nlohmann::json(true),
                        "false: sliding-window attention is not implemented by this runtime");
    }
  }
  return Status::Ok();
}

// bos / eos ids of `scopes` override those already in `config` where present.
Status read_token_ids(const ConfigFields& fields, ModelConfig& config) {
  KVVM_ASSIGN_OR_RETURN(std::optional<std::vector<std::int32_t>> bos,
                        fields.token_ids("bos_token_id", config.vocab_size));
  if (bos.has_value()) config.bos_token_ids = std::move(*bos);
  KVVM_ASSIGN_OR_RETURN(std::optional<std::vector<std::int32_t>> eos,
                        fields.token_ids("eos_token_id", config.vocab_size));
  if (eos.has_value()) config.eos_token_ids = std::move(*eos);
  return Status::Ok();
}

Result<ModelConfig> parse_config_json(const nlohmann::json& parsed, const std::string& origin) {
  if (!parsed.is_object()) {
    return Status::InvalidArgument(origin + ": " + detail::show(parsed) + " is not a JSON object");
  }
  const Scopes scopes = detail::config_scopes(parsed, origin);
  const ConfigFields& fields = scopes.inner;

  KVVM_ASSIGN_OR_RETURN(const Family* family, read_family(scopes));
  ModelConfig config;
  config.architecture = family->architecture;

  struct Whole {
    const char* field;
    std::uint32_t maximum;
    std::uint32_t* out;
  };
  for (const Whole& whole : {
           Whole{"hidden_size", kMaxHiddenSize, &config.hidden_size},
           Whole{"intermediate_size", kMaxIntermediateSize, &config.intermediate_size},
           Whole{"num_hidden_layers", kMaxLayers, &config.layers},
           Whole{"vocab_size", kMaxVocabSize, &config.vocab_size},
           Whole{"max_position_embeddings", kMaxPositions, &config.max_position_embeddings},
       }) {
    KVVM_ASSIGN_OR_RETURN(std::uint32_t value,
                          fields.required_whole(whole.field, 1, whole.maximum));
    *whole.out = value;
  }
  KVVM_RETURN_IF_ERROR(read_attention(fields, *family, config));
  KVVM_ASSIGN_OR_RETURN(std::optional<double> eps, fields.positive("rms_norm_eps", 1.0));
  config.rms_norm_eps = eps.value_or(1e-6);
  KVVM_ASSIGN_OR_RETURN(RopeConfig rope, detail::parse_rope(fields));
  config.rope = rope;
  KVVM_RETURN_IF_ERROR(read_features(fields, *family, config));
  if (family->moe) KVVM_RETURN_IF_ERROR(detail::parse_moe(fields, family->moe_family, config));

  const ConfigFields& tie_scope = scopes.holding("tie_word_embeddings");
  KVVM_ASSIGN_OR_RETURN(std::optional<bool> tie, tie_scope.boolean("tie_word_embeddings"));
  config.tie_word_embeddings = tie.value_or(false);
  // Without one, the tensors carry their own dtypes and the default stands.
  KVVM_ASSIGN_OR_RETURN(std::optional<DType> dtype,
                        detail::read_dtype(scopes, /*allow_fp8=*/false));
  if (dtype.has_value()) config.dtype = *dtype;
  KVVM_ASSIGN_OR_RETURN(WeightQuant quant, detail::parse_quantization(scopes, config));
  config.weight_quant = quant;
  KVVM_RETURN_IF_ERROR(read_token_ids(scopes.top, config));
  if (&scopes.inner.object() != &scopes.top.object()) {
    KVVM_RETURN_IF_ERROR(read_token_ids(scopes.inner, config));
  }
  return config;
}

}  // namespace

Result<ModelConfig> parse_model_config(std::string_view config_json, std::string_view origin) {
  const std::string where(origin);
  KVVM_ASSIGN_OR_RETURN(nlohmann::json parsed,
                        read_json(config_json, detail::config_limits(), where));
  return parse_config_json(parsed, where);
}

Result<ModelConfig> load_config_file(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    return Status::NotFound("'" + path + "' not found: a model directory holds its config.json");
  }
  KVVM_ASSIGN_OR_RETURN(nlohmann::json parsed, read_json_file(path, detail::config_limits()));
  return parse_config_json(parsed, path);
}

Result<ModelConfig> load_model_config(const std::string& dir) {
  const std::filesystem::path base(dir);
  KVVM_ASSIGN_OR_RETURN(ModelConfig config, load_config_file((base / "config.json").string()));
  std::error_code error;

  // generation_config.json, when present, says what generate() stops at; its ids win.
  const std::string generation_path = (base / "generation_config.json").string();
  if (!std::filesystem::exists(generation_path, error)) return config;
  KVVM_ASSIGN_OR_RETURN(nlohmann::json generation,
                        read_json_file(generation_path, detail::config_limits()));
  if (!generation.is_object()) {
    return Status::InvalidArgument(generation_path + ": " + detail::show(generation) +
                                   " is not a JSON object");
  }
  KVVM_RETURN_IF_ERROR(read_token_ids(ConfigFields(generation, generation_path), config));
  return config;
}

}  // namespace kvvm::model
