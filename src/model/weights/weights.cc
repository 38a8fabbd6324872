// Binds every tensor the forward pass reads to its view in the checkpoint and checks it
// against the config, so a checkpoint that does not fit fails here, naming the tensor.
#include "kvvm/model/weights.h"

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kvvm/kernels/attention.h"

namespace kvvm::model {
namespace {

class Binder {
 public:
  Binder(const WeightFiles& files, WeightQuant quant) : files_(files), quant_(quant) {}

  Result<const TensorView*> bind(const std::string& name,
                                 const std::vector<std::uint64_t>& shape) const {
    const TensorView* view = files_.find(name);
    if (view == nullptr) return missing(name, shape);
    if (view->dtype != TensorDType::kBf16 && view->dtype != TensorDType::kF16 &&
        view->dtype != TensorDType::kF32) {
      const bool fp8 = view->dtype == TensorDType::kF8E4M3 || view->dtype == TensorDType::kF8E5M2;
      std::string why;
      if (fp8) {
        why = quant_ == WeightQuant::kNone
                  ? " (config.json has no quantization_config, which an FP8 checkpoint needs)"
                  : " (only the q, k, v, o, gate, up and down projections are quantized)";
      }
      return Status::InvalidArgument(name + ": dtype " + std::string(to_string(view->dtype)) +
                                     ", but the model runtime computes with BF16, F16 or F32" +
                                     why);
    }
    return shaped(name, view, shape);
  }

  // A quantized checkpoint's projection: F8_E4M3 of `shape`.
  Result<const TensorView*> bind_fp8(const std::string& name,
                                     const std::vector<std::uint64_t>& shape) const {
    const TensorView* view = files_.find(name);
    if (view == nullptr) return missing(name, shape);
    if (view->dtype != TensorDType::kF8E4M3) {
      return Status::InvalidArgument(name + ": dtype " + std::string(to_string(view->dtype)) +
                                     ", but the config's quantization_config (" +
                                     std::string(to_string(quant_)) +
                                     ") stores every projection as F8_E4M3");
    }
    return shaped(name, view, shape);
  }

  // A quantized projection's scales (`weight` names it): F32, BF16 or F16 of `shape`.
  Result<const TensorView*> bind_scale(const std::string& name, const std::string& weight,
                                       const std::vector<std::uint64_t>& shape) const {
    const TensorView* view = files_.find(name);
    if (view == nullptr) {
      return Status::InvalidArgument(name + ": missing from the checkpoint; " + weight +
                                     " is F8_E4M3 and the config's quantization_config (" +
                                     std::string(to_string(quant_)) + ") needs its scales " +
                                     shape_string(shape));
    }
    if (view->dtype != TensorDType::kF32 && view->dtype != TensorDType::kBf16 &&
        view->dtype != TensorDType::kF16) {
      return Status::InvalidArgument(name + ": dtype " + std::string(to_string(view->dtype)) +
                                     ", but a weight scale is F32, BF16 or F16");
    }
    if (view->shape != shape) {
      return Status::InvalidArgument(
          name + ": shape " + shape_string(view->shape) + " but the config (" +
          std::string(to_string(quant_)) + ") needs " + shape_string(shape) +
          (quant_ == WeightQuant::kFp8Block ? ", one scale per 128 x 128 block of " + weight
                                            : ", one scale per output row of " + weight));
    }
    return view;
  }

 private:
  static Status missing(const std::string& name, const std::vector<std::uint64_t>& shape) {
    return Status::InvalidArgument(name + ": missing from the checkpoint, which the config (" +
                                   shape_string(shape) + ") needs");
  }
  static Result<const TensorView*> shaped(const std::string& name, const TensorView* view,
                                          const std::vector<std::uint64_t>& shape) {
    if (view->shape != shape) {
      return Status::InvalidArgument(name + ": shape " + shape_string(view->shape) +
                                     " but the config needs " + shape_string(shape));
    }
    return view;
  }

  const WeightFiles& files_;
  WeightQuant quant_;
};

// A view of rows [first, first + rows) of expert `e` in a fused [experts][R][in] tensor.
const TensorView* slice_of(const TensorView& fused, std::uint64_t e, std::uint64_t first,
                           std::uint64_t rows,
                           std::vector<std::shared_ptr<const TensorView>>& slices) {
  const std::uint64_t in = fused.shape[2];
  const std::uint64_t size = element_size(fused.dtype);
  auto view = std::make_shared<TensorView>();
  view->name = fused.name + "[" + std::to_string(e) + "]" +
               (rows == fused.shape[1]
                    ? ""
                    : "[" + std::to_string(first) + ":" + std::to_string(first + rows) + "]");
  view->dtype = fused.dtype;
  view->shape = {rows, in};
  view->data = fused.data + ((e * fused.shape[1] + first) * in) * size;
  view->bytes = rows * in * size;
  view->file = fused.file;
  slices.push_back(std::move(view));
  return slices.back().get();
}

// A sparse layer's router, experts (per expert, or transformers 5's fused tensors) and shared
// expert.
template <typename Bind, typename BindProjection>
Status bind_sparse_layer(const ModelConfig& config, const WeightFiles& files,
                         const std::string& prefix, const Bind& bind,
                         const BindProjection& bind_projection, LayerWeights& layer,
                         std::vector<std::shared_ptr<const TensorView>>& slices) {
  const MoeConfig& moe = config.moe;
  const std::uint64_t hidden = config.hidden_size, inter = moe.expert_intermediate;
  const bool mixtral = moe.naming == ExpertNaming::kMixtral;
  // Mixtral's module is block_sparse_moe as released; transformers 5 may save it as mlp.
  std::string module = prefix + (mixtral ? "block_sparse_moe." : "mlp.");
  if (mixtral && files.find(module + "gate.weight") == nullptr &&
      files.find(prefix + "mlp.gate.weight") != nullptr) {
    module = prefix + "mlp.";
  }
  KVVM_RETURN_IF_ERROR(bind(layer.router, module + "gate.weight", {moe.experts, hidden}));
  layer.experts.resize(moe.experts);
  const TensorView* fused_gate_up = files.find(module + "experts.gate_up_proj");
  const TensorView* fused_down = files.find(module + "experts.down_proj");
  if (fused_gate_up != nullptr || fused_down != nullptr) {
    if (config.weight_quant != WeightQuant::kNone) {
      return Status::InvalidArgument(
          module +
          "experts.gate_up_proj: fused experts in an FP8 checkpoint are not read by "
          "this runtime (it reads each expert's projections and their scales by name)");
    }
    const TensorView* gate_up = nullptr;
    const TensorView* down = nullptr;
    KVVM_RETURN_IF_ERROR(
        bind(gate_up, module + "experts.gate_up_proj", {moe.experts, 2 * inter, hidden}));
    KVVM_RETURN_IF_ERROR(bind(down, module + "experts.down_proj", {moe.experts, hidden, inter}));
    for (std::uint32_t e = 0; e < moe.experts; ++e) {
      layer.experts[e].gate = slice_of(*gate_up, e, 0, inter, slices);
      layer.experts[e].up = slice_of(*gate_up, e, inter, inter, slices);
      layer.experts[e].down = slice_of(*down, e, 0, hidden, slices);
    }
  } else {
    const char* names[3] = {"gate_proj", "up_proj", "down_proj"};
    if (mixtral) names[0] = "w1", names[1] = "w3", names[2] = "w2";
    for (std::uint32_t e = 0; e < moe.experts; ++e) {
      ExpertWeights& x = layer.experts[e];
      const std::string at = module + "experts." + std::to_string(e) + ".";
      KVVM_RETURN_IF_ERROR(
          bind_projection(x.gate, x.gate_weight_scale, at + names[0], inter, hidden));
      KVVM_RETURN_IF_ERROR(bind_projection(x.up, x.up_weight_scale, at + names[1], inter, hidden));
      KVVM_RETURN_IF_ERROR(
          bind_projection(x.down, x.down_weight_scale, at + names[2], hidden, inter));
    }
  }
  if (moe.shared_intermediate > 0) {
    const std::uint64_t shared = moe.shared_intermediate;
    ExpertWeights& x = layer.shared;
    const std::string at = module + "shared_expert.";
    KVVM_RETURN_IF_ERROR(
        bind_projection(x.gate, x.gate_weight_scale, at + "gate_proj", shared, hidden));
    KVVM_RETURN_IF_ERROR(bind_projection(x.up, x.up_weight_scale, at + "up_proj", shared, hidden));
    KVVM_RETURN_IF_ERROR(
        bind_projection(x.down, x.down_weight_scale, at + "down_proj", hidden, shared));
    KVVM_RETURN_IF_ERROR(
        bind(layer.shared_gate, module + "shared_expert_gate.weight", {1, hidden}));
  }
  return Status::Ok();
}

}  // namespace

Result<ModelWeights> bind_weights(const ModelConfig& config, const WeightFiles& files) {
  const Binder binder(files, config.weight_quant);
  const std::uint64_t hidden = config.hidden_size;
  const std::uint64_t q_rows = std::uint64_t{config.heads} * config.head_dim;
  const std::uint64_t kv_rows = std::uint64_t{config.kv_heads} * config.head_dim;
  const std::uint64_t intermediate = config.intermediate_size;
  const std::uint64_t vocab = config.vocab_size;

  ModelWeights weights;
  // Each bind either fills its slot or returns the error naming the tensor.
  const auto bind = [&](const TensorView*& slot, const std::string& name,
                        const std::vector<std::uint64_t>& shape) -> Status {
    KVVM_ASSIGN_OR_RETURN(const TensorView* view, binder.bind(name, shape));
    slot = view;
    return Status::Ok();
  };
  // A projection ("...q_proj"): as any tensor unquantized; else its F8_E4M3 weight and scales.
  const WeightQuant quant = config.weight_quant;
  const auto bind_projection = [&](const TensorView*& slot, const TensorView*& scale_slot,
                                   const std::string& module, std::uint64_t rows,
                                   std::uint64_t in) -> Status {
    const std::string name = module + ".weight";
    if (quant == WeightQuant::kNone) return bind(slot, name, {rows, in});
    KVVM_ASSIGN_OR_RETURN(const TensorView* view, binder.bind_fp8(name, {rows, in}));
    slot = view;
    const std::uint64_t block = kFp8WeightBlock;
    const bool blocks = quant == WeightQuant::kFp8Block;
    KVVM_ASSIGN_OR_RETURN(
        const TensorView* scale,
        binder.bind_scale(module + (blocks ? ".weight_scale_inv" : ".weight_scale"), name,
                          blocks ? std::vector<std::uint64_t>{(rows + block - 1) / block,
                                                              (in + block - 1) / block}
                                 : std::vector<std::uint64_t>{rows, 1}));
    scale_slot = scale;
    return Status::Ok();
  };
  KVVM_RETURN_IF_ERROR(bind(weights.embed, "model.embed_tokens.weight", {vocab, hidden}));
  weights.layers.resize(config.layers);
  for (std::uint32_t i = 0; i < config.layers; ++i) {
    LayerWeights& layer = weights.layers[i];
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    const std::string attn = prefix + "self_attn.";
    KVVM_RETURN_IF_ERROR(bind(layer.input_norm, prefix + "input_layernorm.weight", {hidden}));
    KVVM_RETURN_IF_ERROR(
        bind_projection(layer.q, layer.q_weight_scale, attn + "q_proj", q_rows, hidden));
    KVVM_RETURN_IF_ERROR(
        bind_projection(layer.k, layer.k_weight_scale, attn + "k_proj", kv_rows, hidden));
    KVVM_RETURN_IF_ERROR(
        bind_projection(layer.v, layer.v_weight_scale, attn + "v_proj", kv_rows, hidden));
    // Biases the config does not ask for are ignored, as transformers ignores them.
    if (config.qkv_bias) {
      KVVM_RETURN_IF_ERROR(bind(layer.q_bias, attn + "q_proj.bias", {q_rows}));
      KVVM_RETURN_IF_ERROR(bind(layer.k_bias, attn + "k_proj.bias", {kv_rows}));
      KVVM_RETURN_IF_ERROR(bind(layer.v_bias, attn + "v_proj.bias", {kv_rows}));
    }
    KVVM_RETURN_IF_ERROR(
        bind_projection(layer.o, layer.o_weight_scale, attn + "o_proj", hidden, q_rows));
    if (config.o_bias) {
      KVVM_RETURN_IF_ERROR(bind(layer.o_bias, attn + "o_proj.bias", {hidden}));
    }
    if (config.qk_norm) {
      const std::uint64_t head_dim = config.head_dim;
      KVVM_RETURN_IF_ERROR(bind(layer.q_norm, attn + "q_norm.weight", {head_dim}));
      KVVM_RETURN_IF_ERROR(bind(layer.k_norm, attn + "k_norm.weight", {head_dim}));
    }
    KVVM_RETURN_IF_ERROR(
        bind(layer.post_norm, prefix + "post_attention_layernorm.weight", {hidden}));
    if (config.moe.sparse_layer(i)) {
      KVVM_RETURN_IF_ERROR(
          bind_sparse_layer(config, files, prefix, bind, bind_projection, layer, weights.slices));
    } else {
      KVVM_RETURN_IF_ERROR(bind_projection(layer.gate, layer.gate_weight_scale,
                                           prefix + "mlp.gate_proj", intermediate, hidden));
      KVVM_RETURN_IF_ERROR(bind_projection(layer.up, layer.up_weight_scale, prefix + "mlp.up_proj",
                                           intermediate, hidden));
      KVVM_RETURN_IF_ERROR(bind_projection(layer.down, layer.down_weight_scale,
                                           prefix + "mlp.down_proj", hidden, intermediate));
    }
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

// A scale tensor's values as float: one (shape [] or [1]) or one per KV head.
Result<std::vector<float>> scales_of(const TensorView& t, std::uint32_t kv_heads) {
  const std::uint64_t count = t.elements();
  if (count != 1 && count != kv_heads) {
    return Status::InvalidArgument(t.name + ": shape " + shape_string(t.shape) +
                                   "; a KV scale holds " + "one value, or one per KV head (" +
                                   std::to_string(kv_heads) + ")");
  }
  DType element = DType::kUnset;
  switch (t.dtype) {
    case TensorDType::kF32:
      element = DType::kFp32;
      break;
    case TensorDType::kBf16:
      element = DType::kBf16;
      break;
    case TensorDType::kF16:
      element = DType::kFp16;
      break;
    default:
      return Status::InvalidArgument(t.name + ": dtype " + std::string(to_string(t.dtype)) +
                                     "; a KV scale is F32, BF16 or F16");
  }
  const auto* at = reinterpret_cast<const unsigned char*>(t.data);
  std::vector<float> values(count);
  for (std::uint64_t i = 0; i < count; ++i) {
    values[i] = element_to_float(element, at + i * element_bytes(element));
  }
  return values;
}

}  // namespace

Result<KvScales> kv_scales_of(const ModelWeights& weights, std::uint32_t kv_heads) {
  const auto layers = static_cast<std::uint32_t>(weights.layers.size());
  std::uint32_t present = 0;
  for (const LayerWeights& layer : weights.layers) {
    present += (layer.k_scale != nullptr) + (layer.v_scale != nullptr);
  }
  if (present == 0) return KvScales::ones(layers);
  // Each tensor's values; one per head for all when any tensor has one per head (a tensor of
  // one value then holds for every head of its layer).
  std::vector<std::vector<float>> read[2];
  std::uint32_t heads = 1;
  for (std::uint32_t i = 0; i < layers; ++i) {
    const LayerWeights& layer = weights.layers[i];
    for (const auto& [tensor, name, kv] :
         {std::tuple{layer.k_scale, "k_scale", 0}, std::tuple{layer.v_scale, "v_scale", 1}}) {
      if (tensor == nullptr) {
        return Status::InvalidArgument("model.layers." + std::to_string(i) + ".self_attn." + name +
                                       ": missing, while other layers have KV scales");
      }
      KVVM_ASSIGN_OR_RETURN(std::vector<float> values, scales_of(*tensor, kv_heads));
      heads = std::max(heads, static_cast<std::uint32_t>(values.size()));
      read[kv].push_back(std::move(values));
    }
  }
  KvScales scales;
  scales.source = KvScaleSource::kCheckpoint;
  scales.heads = heads;
  for (std::uint32_t kv = 0; kv < 2; ++kv) {
    std::vector<float>& out = kv == 0 ? scales.k : scales.v;
    for (const std::vector<float>& values : read[kv]) {
      for (std::uint32_t h = 0; h < heads; ++h) out.push_back(values[values.size() == 1 ? 0 : h]);
    }
  }
  KVVM_RETURN_IF_ERROR(check_kv_scales(scales, layers, kv_heads));
  return scales;
}

Result<KvScales> checkpoint_kv_scales(const ModelConfig& config, const ModelWeights& weights,
                                      LoadFormat format) {
  if (format == LoadFormat::kDummy) return KvScales::ones(config.layers);
  return kv_scales_of(weights, config.kv_heads);
}

}  // namespace kvvm::model
