// A mixture of experts' fields of config.json: the experts, the router's top k and whether it
// renormalises, which layers are sparse, a shared expert; any other routing scheme refused by
// its field.
#include <algorithm>
#include <string>

#include "kvvm/kernels/moe_kernels.h"
#include "model/config/config_fields.h"

namespace kvvm::model {

std::uint32_t MoeConfig::sparse_layers() const {
  if (!enabled()) return 0;
  return static_cast<std::uint32_t>(std::count(sparse.begin(), sparse.end(), true));
}

namespace detail {
namespace {

// Fields of other routers (DeepSeek's grouped top-k and score correction, sigmoid scoring,
// routed scaling, shared experts counted DeepSeek's way): a config carrying one does not route
// as transformers' Qwen / Mixtral blocks do, so it is refused rather than run wrong. The value
// each may hold and still mean nothing here, null meaning only an absent or null field.
struct ForeignField {
  const char* name;
  const char* neutral;  // JSON text, or null: any value is refused
  const char* what;
};
constexpr ForeignField kForeignFields[] = {
    {"n_group", "1", "grouped top-k routing"},
    {"topk_group", "1", "grouped top-k routing"},
    {"topk_method", "\"greedy\"", "another top-k method"},
    {"scoring_func", "\"softmax\"", "another router scoring function"},
    {"routed_scaling_factor", "1.0", "scaled routing weights"},
    {"n_shared_experts", "0", "DeepSeek's shared experts"},
    {"e_score_correction_bias", nullptr, "an expert score bias"},
    {"router_bias", "false", "a router bias"},
    {"moe_layer_freq", "1", "another sparse-layer pattern"},
    {"first_k_dense_replace", "0", "another sparse-layer pattern"},
    {"num_experts_per_group", nullptr, "grouped experts"},
};

Status refuse_foreign_fields(const ConfigFields& fields) {
  for (const ForeignField& field : kForeignFields) {
    const nlohmann::json* value = fields.find(field.name);
    if (value == nullptr) continue;
    if (field.neutral != nullptr) {
      const nlohmann::json neutral = nlohmann::json::parse(field.neutral);
      if (*value == neutral) continue;
    }
    return fields.bad(field.name, *value,
                      (field.neutral != nullptr ? std::string(field.neutral) + " or absent"
                                                : std::string("absent")) +
                          ": " + field.what + " is not implemented by this runtime");
  }
  return Status::Ok();
}

// Which layers are sparse (transformers' rule): not listed in mlp_only_layers, and (l + 1) a
// multiple of decoder_sparse_step.
Status read_sparse_layers(const ConfigFields& fields, ModelConfig& config) {
  KVVM_ASSIGN_OR_RETURN(std::optional<std::uint32_t> step,
                        fields.whole("decoder_sparse_step", 1, kMaxLayers));
  const std::uint32_t every = step.value_or(1);
  config.moe.sparse.assign(config.layers, false);
  for (std::uint32_t l = 0; l < config.layers; ++l) config.moe.sparse[l] = (l + 1) % every == 0;
  if (const nlohmann::json* dense = fields.find("mlp_only_layers")) {
    if (!dense->is_array() || dense->size() > kMaxLayers) {
      return fields.bad("mlp_only_layers", *dense, "a list of layer indices");
    }
    for (std::size_t i = 0; i < dense->size(); ++i) {
      const nlohmann::json& entry = (*dense)[i];
      if (!entry.is_number_integer() || entry.get<std::int64_t>() < 0 ||
          entry.get<std::int64_t>() >= config.layers) {
        return fields.bad(("mlp_only_layers[" + std::to_string(i) + "]").c_str(), entry,
                          "a layer index below num_hidden_layers " + std::to_string(config.layers));
      }
      config.moe.sparse[entry.get<std::size_t>()] = false;
    }
  }
  if (config.moe.sparse_layers() == 0) {
    return Status::InvalidArgument(fields.where() + ": no layer is sparse (decoder_sparse_step " +
                                   std::to_string(every) +
                                   " and mlp_only_layers leave every layer dense): a mixture of "
                                   "experts without experts");
  }
  return Status::Ok();
}

}  // namespace

Status parse_moe(const ConfigFields& fields, MoeFamily family, ModelConfig& config) {
  KVVM_RETURN_IF_ERROR(refuse_foreign_fields(fields));
  MoeConfig& moe = config.moe;
  const bool mixtral = family == MoeFamily::kMixtral;
  moe.naming = mixtral ? ExpertNaming::kMixtral : ExpertNaming::kQwen;
  // Qwen's Hub configs say num_experts; transformers 5 saves Qwen3-MoE's as num_local_experts,
  // Mixtral's name. Either is read; both must agree.
  const char* experts_field =
      mixtral || (!fields.has("num_experts") && fields.has("num_local_experts"))
          ? "num_local_experts"
          : "num_experts";
  KVVM_ASSIGN_OR_RETURN(moe.experts, fields.required_whole(experts_field, 1, kMoeMaxExperts));
  if (!mixtral && fields.has("num_experts") && fields.has("num_local_experts")) {
    KVVM_ASSIGN_OR_RETURN(std::uint32_t local,
                          fields.required_whole("num_local_experts", 1, kMoeMaxExperts));
    if (local != moe.experts) {
      return Status::InvalidArgument(fields.where() + ": num_experts " +
                                     std::to_string(moe.experts) + " and num_local_experts " +
                                     std::to_string(local) + " disagree: give one");
    }
  }
  KVVM_ASSIGN_OR_RETURN(moe.top_k,
                        fields.required_whole("num_experts_per_tok", 1,
                                              std::min<std::uint32_t>(moe.experts, kMoeMaxTopK)));
  if (mixtral) {
    // Mixtral's experts are its MLPs: intermediate_size is theirs, and it always renormalises
    // (softmax over the chosen logits).
    moe.expert_intermediate = config.intermediate_size;
    moe.renormalize = true;
    moe.sparse.assign(config.layers, true);
    return Status::Ok();
  }
  KVVM_ASSIGN_OR_RETURN(moe.expert_intermediate,
                        fields.required_whole("moe_intermediate_size", 1, kMaxIntermediateSize));
  KVVM_ASSIGN_OR_RETURN(std::optional<bool> renormalize, fields.boolean("norm_topk_prob"));
  moe.renormalize = renormalize.value_or(false);
  KVVM_RETURN_IF_ERROR(read_sparse_layers(fields, config));
  if (family == MoeFamily::kQwen2Moe) {
    KVVM_ASSIGN_OR_RETURN(std::optional<std::uint32_t> shared,
                          fields.whole("shared_expert_intermediate_size", 0, kMaxIntermediateSize));
    moe.shared_intermediate = shared.value_or(0);
    if (moe.shared_intermediate == 0) {
      return fields.missing("shared_expert_intermediate_size",
                            "Qwen2-MoE's layers each have a shared expert of this size");
    }
  }
  return Status::Ok();
}

}  // namespace detail
}  // namespace kvvm::model
