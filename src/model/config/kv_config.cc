// The KV shape of a config.json, and the built-in models, through the model config's field
// reader: one parser, two depths of checking (see kvvm/model/kv_config.h).
//
// Why every missing field is collected before the error: the user sizing a cache from a
// config.json they found wants one run to name everything the file lacks.
#include "kvvm/model/kv_config.h"

#include <array>
#include <cctype>
#include <string>
#include <utility>

#include "base/json_reader.h"
#include "model/config/config_fields.h"

namespace kvvm::model {
namespace {

using detail::ConfigFields;
using detail::kMaxHeadDim;
using detail::kMaxHeads;
using detail::kMaxHiddenSize;
using detail::kMaxLayers;

// The shape fields, present or not; a malformed one is an error at once.
struct ShapeFields {
  std::optional<std::uint32_t> layers;
  std::optional<std::uint32_t> kv_heads;
  std::optional<std::uint32_t> heads;
  std::optional<std::uint32_t> head_dim;
  std::optional<std::uint32_t> hidden_size;
};

Result<ShapeFields> read_shape_fields(const ConfigFields& fields) {
  ShapeFields shape;
  struct Whole {
    const char* field;
    std::uint32_t maximum;
    std::optional<std::uint32_t>* out;
  };
  for (const Whole& whole : {
           Whole{"num_hidden_layers", kMaxLayers, &shape.layers},
           Whole{"num_key_value_heads", kMaxHeads, &shape.kv_heads},
           Whole{"num_attention_heads", kMaxHeads, &shape.heads},
           Whole{"head_dim", kMaxHeadDim, &shape.head_dim},
           Whole{"hidden_size", kMaxHiddenSize, &shape.hidden_size},
       }) {
    KVVM_ASSIGN_OR_RETURN(std::optional<std::uint32_t> value,
                          fields.whole(whole.field, 1, whole.maximum));
    *whole.out = value;
  }
  // Grouped-query attention: each KV head serves a whole group of query heads.
  if (shape.kv_heads && shape.heads) {
    if (*shape.kv_heads > *shape.heads) {
      return Status::InvalidArgument(
          fields.where() + ": 'num_key_value_heads' " + std::to_string(*shape.kv_heads) +
          " is more than 'num_attention_heads' " + std::to_string(*shape.heads) +
          " (each KV head serves a group of query heads)");
    }
    if (*shape.heads % *shape.kv_heads != 0) {
      return Status::InvalidArgument(
          fields.where() + ": 'num_attention_heads' " + std::to_string(*shape.heads) +
          " is not a multiple of 'num_key_value_heads' " + std::to_string(*shape.kv_heads) +
          " (each KV head serves a whole group of query heads)");
    }
  }
  return shape;
}

Result<ModelConfig> parse_kv_json(const nlohmann::json& parsed, const std::string& origin,
                                  bool dtype_given) {
  if (!parsed.is_object()) {
    return Status::InvalidArgument(origin + ": " + detail::show(parsed) + " is not a JSON object");
  }
  const detail::Scopes scopes = detail::config_scopes(parsed, origin);
  const ConfigFields& fields = scopes.inner;
  KVVM_ASSIGN_OR_RETURN(ShapeFields shape, read_shape_fields(fields));

  ModelConfig config;
  config.name = origin;
  // The architecture is named when the file names one, never checked: any decoder's KV
  // cache has this shape.
  if (const nlohmann::json* architectures = scopes.holding("architectures").find("architectures");
      architectures != nullptr && architectures->is_array() && !architectures->empty() &&
      (*architectures)[0].is_string()) {
    config.architecture = (*architectures)[0].get<std::string>();
  }
  std::vector<std::string> missing;
  if (shape.layers) {
    config.layers = *shape.layers;
  } else {
    missing.push_back("'num_hidden_layers' (the number of layers)");
  }
  config.heads = shape.heads.value_or(0);
  config.hidden_size = shape.hidden_size.value_or(0);
  // Without grouped-query attention every attention head has its own K and V.
  if (shape.kv_heads || shape.heads) {
    config.kv_heads = shape.kv_heads ? *shape.kv_heads : *shape.heads;
  } else {
    missing.push_back(
        "'num_key_value_heads' (the number of KV heads; 'num_attention_heads' stands in when "
        "it is absent, and is missing too)");
  }
  if (shape.head_dim) {
    config.head_dim = *shape.head_dim;
  } else if (!shape.hidden_size || !shape.heads) {
    missing.push_back(std::string("'head_dim' (the size of one head; 'hidden_size' / "
                                  "'num_attention_heads' stands in when it is absent, and ") +
                      (shape.hidden_size ? "'num_attention_heads'" : "'hidden_size'") +
                      " is missing)");
  } else if (*shape.hidden_size % *shape.heads != 0) {
    return Status::InvalidArgument(fields.where() + ": no 'head_dim', and 'hidden_size' " +
                                   std::to_string(*shape.hidden_size) +
                                   " is not a multiple of 'num_attention_heads' " +
                                   std::to_string(*shape.heads));
  } else if (*shape.hidden_size / *shape.heads > kMaxHeadDim) {
    return Status::InvalidArgument(
        fields.where() + ": no 'head_dim', and 'hidden_size' " +
        std::to_string(*shape.hidden_size) + " / 'num_attention_heads' " +
        std::to_string(*shape.heads) + " = " + std::to_string(*shape.hidden_size / *shape.heads) +
        " is over the head size bound of " + std::to_string(kMaxHeadDim));
  } else {
    config.head_dim = *shape.hidden_size / *shape.heads;
  }

  // The KV cache may be fp8 even where no checkpoint is, so fp8 is taken here.
  KVVM_ASSIGN_OR_RETURN(std::optional<DType> dtype, detail::read_dtype(scopes, /*allow_fp8=*/true));
  if (dtype.has_value()) {
    config.dtype = *dtype;
  } else if (!dtype_given) {
    missing.push_back("'torch_dtype' (the element type; --kv-dtype gives one instead)");
  }
  if (!missing.empty()) {
    std::string message = fields.where() + ": missing field" + (missing.size() > 1 ? "s " : " ");
    for (std::size_t i = 0; i < missing.size(); ++i) message += (i > 0 ? ", " : "") + missing[i];
    return Status::InvalidArgument(message);
  }
  return config;
}

// The built-in models, with the numbers from their published config.json files.
struct BuiltinModel {
  const char* name;
  const char* architecture;
  std::uint32_t hidden_size;
  std::uint32_t intermediate_size;
  std::uint32_t layers;
  std::uint32_t heads;
  std::uint32_t kv_heads;
  std::uint32_t head_dim;  // 0: hidden_size / heads
  std::uint32_t vocab_size;
  std::uint32_t max_position_embeddings;
  double rope_theta;
  bool tie_word_embeddings;
  // A mixture of experts (every layer sparse): experts, top k, each expert's intermediate size,
  // renormalised, the shared expert's size.
  std::uint32_t experts = 0;
  std::uint32_t top_k = 0;
  std::uint32_t expert_intermediate = 0;
  bool renormalize = false;
  std::uint32_t shared_intermediate = 0;
};

constexpr std::array<BuiltinModel, 10> kBuiltinModels = {{
    {"qwen2.5-0.5b", "Qwen2ForCausalLM", 896, 4864, 24, 14, 2, 0, 151936, 32768, 1e6, true},
    {"llama-3-8b", "LlamaForCausalLM", 4096, 14336, 32, 32, 8, 0, 128256, 8192, 5e5, false},
    {"qwen2.5-7b", "Qwen2ForCausalLM", 3584, 18944, 28, 28, 4, 0, 152064, 32768, 1e6, false},
    {"qwen2.5-14b", "Qwen2ForCausalLM", 5120, 13824, 48, 40, 8, 0, 152064, 32768, 1e6, false},
    {"llama-3-70b", "LlamaForCausalLM", 8192, 28672, 80, 64, 8, 0, 128256, 8192, 5e5, false},
    // Qwen3's heads are 128 wide whatever hidden_size / heads is (0.6B: 16 x 128 over 1024).
    {"qwen3-0.6b", "Qwen3ForCausalLM", 1024, 3072, 28, 16, 8, 128, 151936, 40960, 1e6, true},
    {"qwen3-8b", "Qwen3ForCausalLM", 4096, 12288, 36, 32, 8, 128, 151936, 40960, 1e6, false},
    {"qwen3-30b-a3b", "Qwen3MoeForCausalLM", 2048, 6144, 48, 32, 4, 128, 151936, 40960, 1e6, false,
     128, 8, 768, true, 0},
    {"mixtral-8x7b", "MixtralForCausalLM", 4096, 14336, 32, 32, 8, 0, 32000, 32768, 1e6, false, 8,
     2, 14336, true, 0},
    {"qwen2-57b-a14b", "Qwen2MoeForCausalLM", 3584, 18944, 28, 28, 4, 0, 151936, 131072, 1e6, false,
     64, 8, 2560, false, 20480},
}};

ModelConfig to_config(const BuiltinModel& model) {
  ModelConfig config;
  config.name = model.name;
  config.architecture = model.architecture;
  config.hidden_size = model.hidden_size;
  config.intermediate_size = model.intermediate_size;
  config.layers = model.layers;
  config.heads = model.heads;
  config.kv_heads = model.kv_heads;
  config.head_dim = model.head_dim != 0 ? model.head_dim : model.hidden_size / model.heads;
  config.vocab_size = model.vocab_size;
  config.max_position_embeddings = model.max_position_embeddings;
  config.rope.theta = model.rope_theta;
  config.tie_word_embeddings = model.tie_word_embeddings;
  // Qwen2's attention always has q/k/v biases; Qwen3's normalises q and k instead.
  const std::string_view architecture = model.architecture;
  config.qkv_bias = architecture == "Qwen2ForCausalLM" || architecture == "Qwen2MoeForCausalLM";
  config.qk_norm = architecture == "Qwen3ForCausalLM" || architecture == "Qwen3MoeForCausalLM";
  if (model.experts > 0) {
    MoeConfig& moe = config.moe;
    moe.experts = model.experts;
    moe.top_k = model.top_k;
    moe.expert_intermediate = model.expert_intermediate;
    moe.renormalize = model.renormalize;
    moe.shared_intermediate = model.shared_intermediate;
    moe.naming =
        architecture == "MixtralForCausalLM" ? ExpertNaming::kMixtral : ExpertNaming::kQwen;
    moe.sparse.assign(model.layers, true);
  }
  config.rms_norm_eps = config.qkv_bias || config.qk_norm ? 1e-6 : 1e-5;
  config.dtype = DType::kBf16;
  return config;
}

std::string lower(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

Result<ModelConfig> parse_kv_config(std::string_view config_json, std::string_view origin,
                                    bool dtype_given) {
  const std::string where(origin);
  KVVM_ASSIGN_OR_RETURN(nlohmann::json parsed,
                        read_json(config_json, detail::config_limits(), where));
  return parse_kv_json(parsed, where, dtype_given);
}

Result<ModelConfig> load_kv_config(const std::string& path, bool dtype_given) {
  Result<nlohmann::json> parsed = read_json_file(path, detail::config_limits());
  if (!parsed.ok()) return parsed.status().with_context("config.json");
  Result<ModelConfig> config = parse_kv_json(*parsed, "config.json '" + path + "'", dtype_given);
  if (config.ok()) config->name = path;
  return config;
}

Geometry kv_geometry(const ModelConfig& config, std::optional<DType> dtype) {
  Geometry geometry;
  geometry.name = config.name.empty() ? config.architecture : config.name;
  geometry.layers = config.layers;
  geometry.kv_heads = config.kv_heads;
  geometry.head_dim = config.head_dim;
  geometry.dtype = dtype.value_or(config.dtype);
  return geometry;
}

std::vector<std::string> builtin_model_names() {
  std::vector<std::string> names;
  for (const BuiltinModel& model : kBuiltinModels) names.emplace_back(model.name);
  return names;
}

Result<ModelConfig> builtin_model_config(std::string_view name) {
  const std::string wanted = lower(name);
  for (const BuiltinModel& model : kBuiltinModels) {
    if (wanted == model.name) return to_config(model);
  }
  std::string names;
  for (const BuiltinModel& model : kBuiltinModels) {
    names += (names.empty() ? "" : ", ") + std::string(model.name);
  }
  return Status::InvalidArgument("unknown model '" + std::string(name) + "'; known: " + names +
                                 ", or a path to a Hugging Face config.json");
}

Result<Geometry> builtin_geometry(std::string_view name, DType dtype) {
  KVVM_ASSIGN_OR_RETURN(ModelConfig config, builtin_model_config(name));
  return kv_geometry(config, dtype);
}

}  // namespace kvvm::model
