// Binds every tensor the forward pass reads to its view in the checkpoint and checks it
// against the config, so a checkpoint that does not fit fails here, naming the tensor.
#include "kvvm/model/weights.h"

#include <string>

namespace kvvm::model {
namespace {

class Binder {
 public:
  explicit Binder(const WeightFiles& files) : files_(files) {}

  Result<const TensorView*> bind(const std::string& name,
                                 const std::vector<std::uint64_t>& shape) const {
    const TensorView* view = files_.find(name);
    if (view == nullptr) {
      return Status::InvalidArgument(name + ": missing from the checkpoint, which the config (" +
                                     shape_string(shape) + ") needs");
    }
    if (view->dtype != TensorDType::kBf16 && view->dtype != TensorDType::kF16 &&
        view->dtype != TensorDType::kF32) {
      return Status::InvalidArgument(name + ": dtype " + std::string(to_string(view->dtype)) +
                                     ", but the model runtime computes with BF16, F16 or F32");
    }
    if (view->shape != shape) {
      return Status::InvalidArgument(name + ": shape " + shape_string(view->shape) +
                                     " but the config needs " + shape_string(shape));
    }
    return view;
  }

 private:
  const WeightFiles& files_;
};

}  // namespace

Result<ModelWeights> bind_weights(const ModelConfig& config, const WeightFiles& files) {
  const Binder binder(files);
  const std::uint64_t hidden = config.hidden_size;
  const std::uint64_t q_rows = std::uint64_t{config.heads} * config.head_dim;
  const std::uint64_t kv_rows = std::uint64_t{config.kv_heads} * config.head_dim;
  const std::uint64_t intermediate = config.intermediate_size;
  const std::uint64_t vocab = config.vocab_size;

  ModelWeights weights;
  // Each bind either fills its slot or returns the error naming the tensor.
  const auto bind = [&](const TensorView*& slot, const std::string& name,
                        const std::vector<std::uint64_t>& shape) -> Status {
    Result<const TensorView*> view = binder.bind(name, shape);
    if (!view.ok()) return view.status();
    slot = *view;
    return Status::Ok();
  };
  KVVM_RETURN_IF_ERROR(bind(weights.embed, "model.embed_tokens.weight", {vocab, hidden}));
  weights.layers.resize(config.layers);
  for (std::uint32_t i = 0; i < config.layers; ++i) {
    LayerWeights& layer = weights.layers[i];
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    const std::string attn = prefix + "self_attn.";
    KVVM_RETURN_IF_ERROR(bind(layer.input_norm, prefix + "input_layernorm.weight", {hidden}));
    KVVM_RETURN_IF_ERROR(bind(layer.q, attn + "q_proj.weight", {q_rows, hidden}));
    KVVM_RETURN_IF_ERROR(bind(layer.k, attn + "k_proj.weight", {kv_rows, hidden}));
    KVVM_RETURN_IF_ERROR(bind(layer.v, attn + "v_proj.weight", {kv_rows, hidden}));
    // Biases the config does not ask for are ignored, as transformers ignores them.
    if (config.qkv_bias) {
      KVVM_RETURN_IF_ERROR(bind(layer.q_bias, attn + "q_proj.bias", {q_rows}));
      KVVM_RETURN_IF_ERROR(bind(layer.k_bias, attn + "k_proj.bias", {kv_rows}));
      KVVM_RETURN_IF_ERROR(bind(layer.v_bias, attn + "v_proj.bias", {kv_rows}));
    }
    KVVM_RETURN_IF_ERROR(bind(layer.o, attn + "o_proj.weight", {hidden, q_rows}));
    if (config.o_bias) {
      KVVM_RETURN_IF_ERROR(bind(layer.o_bias, attn + "o_proj.bias", {hidden}));
    }
    KVVM_RETURN_IF_ERROR(
        bind(layer.post_norm, prefix + "post_attention_layernorm.weight", {hidden}));
    KVVM_RETURN_IF_ERROR(bind(layer.gate, prefix + "mlp.gate_proj.weight", {intermediate, hidden}));
    KVVM_RETURN_IF_ERROR(bind(layer.up, prefix + "mlp.up_proj.weight", {intermediate, hidden}));
    KVVM_RETURN_IF_ERROR(bind(layer.down, prefix + "mlp.down_proj.weight", {hidden, intermediate}));
  }
  KVVM_RETURN_IF_ERROR(bind(weights.final_norm, "model.norm.weight", {hidden}));
  if (config.tie_word_embeddings) {
    // transformers ties lm_head to the embedding; a stored lm_head.weight is not read.
    weights.lm_head = weights.embed;
  } else {
    KVVM_RETURN_IF_ERROR(bind(weights.lm_head, "lm_head.weight", {vocab, hidden}));
  }
  return weights;
}

}  // namespace kvvm::model
