// Binds every tensor the forward pass reads to its view in the checkpoint and checks it
// against the config, so a checkpoint that does not fit fails here, naming the tensor.
#include "kvvm/model/weights.h"

#include <string>
#include <tuple>

#include "kvvm/attention.h"

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
    // fp8 KV scales are optional; their values are checked by kv_scales_of.
    layer.k_scale = files.find(attn + "k_scale");
    layer.v_scale = files.find(attn + "v_scale");
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

namespace {

// The one value of a scale tensor (shape [] or [1]) as float.
Result<float> scalar_of(const TensorView& t) {
  if (t.elements() != 1) {
    return Status::InvalidArgument(t.name + ": shape " + shape_string(t.shape) +
                                   "; only one scale per layer is read (per-head KV scales are "
                                   "not supported)");
  }
  const auto* at = reinterpret_cast<const unsigned char*>(t.data);
  switch (t.dtype) {
    case TensorDType::kF32:
      return element_to_float(DType::kFp32, at);
    case TensorDType::kBf16:
      return element_to_float(DType::kBf16, at);
    case TensorDType::kF16:
      return element_to_float(DType::kFp16, at);
    default:
      return Status::InvalidArgument(t.name + ": dtype " + std::string(to_string(t.dtype)) +
                                     "; a KV scale is F32, BF16 or F16");
  }
}

}  // namespace

Result<KvScales> kv_scales_of(const ModelWeights& weights) {
  const auto layers = static_cast<std::uint32_t>(weights.layers.size());
  std::uint32_t present = 0;
  for (const LayerWeights& layer : weights.layers) {
    present += (layer.k_scale != nullptr) + (layer.v_scale != nullptr);
  }
  if (present == 0) return KvScales::ones(layers);
  KvScales scales;
  scales.source = KvScaleSource::kCheckpoint;
  for (std::uint32_t i = 0; i < layers; ++i) {
    const LayerWeights& layer = weights.layers[i];
    for (const auto& [tensor, name, out] : {std::tuple{layer.k_scale, "k_scale", &scales.k},
                                            std::tuple{layer.v_scale, "v_scale", &scales.v}}) {
      if (tensor == nullptr) {
        return Status::InvalidArgument("model.layers." + std::to_string(i) + ".self_attn." + name +
                                       ": missing, while other layers have KV scales");
      }
      Result<float> value = scalar_of(*tensor);
      if (!value.ok()) return value.status();
      out->push_back(*value);
    }
  }
  KVVM_RETURN_IF_ERROR(check_kv_scales(scales, layers));
  return scales;
}

Result<KvScales> checkpoint_kv_scales(const ModelConfig& config, const ModelWeights& weights,
                                      LoadFormat format) {
  if (format == LoadFormat::kDummy) return KvScales::ones(config.layers);
  return kv_scales_of(weights);
}

}  // namespace kvvm::model
