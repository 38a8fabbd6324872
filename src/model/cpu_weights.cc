// Checks and converts a checkpoint's tensors to float32 for the CPU backend.
#include "model/cpu_weights.h"

#include <cstring>
#include <string>

#include "kvvm/attention.h"

namespace kvvm::model::cpu {
namespace {

Result<DType> element_of(const TensorView& tensor, const std::string& name) {
  switch (tensor.dtype) {
    case TensorDType::kF32:
      return DType::kFp32;
    case TensorDType::kBf16:
      return DType::kBf16;
    case TensorDType::kF16:
      return DType::kFp16;
    default:
      return Status::InvalidArgument("tensor " + name + " has dtype " +
                                     std::string(to_string(tensor.dtype)) +
                                     "; the CPU backend reads BF16, F16 or F32");
  }
}

// `what` names the tensor when the view has no name (weights bound by hand).
Status convert(const TensorView* tensor, const char* what, std::vector<std::uint64_t> shape,
               std::vector<float>& out) {
  if (tensor == nullptr)
    return Status::InvalidArgument(std::string("tensor ") + what + " is missing");
  const std::string name = tensor->name.empty() ? std::string(what) : tensor->name;
  if (tensor->shape != shape) {
    return Status::InvalidArgument("tensor " + name + " has shape " + shape_string(tensor->shape) +
                                   ", the config expects " + shape_string(shape));
  }
  const Result<DType> dtype = element_of(*tensor, name);
  if (!dtype.ok()) return dtype.status();
  const DType element = *dtype;
  const std::uint64_t elements = tensor->elements();
  const std::uint64_t bytes = elements * element_bytes(element);
  if (tensor->data == nullptr || tensor->bytes != bytes) {
    return Status::InvalidArgument("tensor " + name + " holds " + std::to_string(tensor->bytes) +
                                   " bytes, its shape and dtype need " + std::to_string(bytes));
  }
  out.resize(elements);
  if (element == DType::kFp32) {
    std::memcpy(out.data(), tensor->data, bytes);  // the mapping's alignment is the file's
    return Status::Ok();
  }
  const std::uint32_t size = element_bytes(element);
  for (std::uint64_t i = 0; i < elements; ++i) {
    out[i] = element_to_float(element, tensor->data + i * size);
  }
  return Status::Ok();
}

Status convert_optional(bool expected, const TensorView* tensor, const char* what,
                        std::uint64_t rows, std::vector<float>& out) {
  if (!expected) {
    if (tensor != nullptr) {
      return Status::InvalidArgument(std::string("tensor ") + what +
                                     " is given but the config has no such bias");
    }
    return Status::Ok();
  }
  return convert(tensor, what, {rows}, out);
}

std::string layer_name(std::size_t layer, const char* what) {
  return "model.layers." + std::to_string(layer) + "." + what;
}

Status convert_layer(const ModelConfig& c, const LayerWeights& w, std::size_t index,
                     CpuLayerWeights& out) {
  const std::uint64_t hidden = c.hidden_size;
  const std::uint64_t q_rows = std::uint64_t{c.heads} * c.head_dim;
  const std::uint64_t kv_rows = std::uint64_t{c.kv_heads} * c.head_dim;
  const std::uint64_t inter = c.intermediate_size;
  auto name = [&](const char* what) { return layer_name(index, what); };
  struct Entry {
    const TensorView* tensor;
    std::string what;
    std::vector<std::uint64_t> shape;
    std::vector<float>* out;
  };
  const Entry entries[] = {
      {w.input_norm, name("input_layernorm.weight"), {hidden}, &out.input_norm},
      {w.q, name("self_attn.q_proj.weight"), {q_rows, hidden}, &out.q},
      {w.k, name("self_attn.k_proj.weight"), {kv_rows, hidden}, &out.k},
      {w.v, name("self_attn.v_proj.weight"), {kv_rows, hidden}, &out.v},
      {w.o, name("self_attn.o_proj.weight"), {hidden, q_rows}, &out.o},
      {w.post_norm, name("post_attention_layernorm.weight"), {hidden}, &out.post_norm},
      {w.gate, name("mlp.gate_proj.weight"), {inter, hidden}, &out.gate},
      {w.up, name("mlp.up_proj.weight"), {inter, hidden}, &out.up},
      {w.down, name("mlp.down_proj.weight"), {hidden, inter}, &out.down},
  };
  for (const Entry& e : entries) {
    KVVM_RETURN_IF_ERROR(convert(e.tensor, e.what.c_str(), e.shape, *e.out));
  }
  KVVM_RETURN_IF_ERROR(convert_optional(c.qkv_bias, w.q_bias, name("self_attn.q_proj.bias").c_str(),
                                        q_rows, out.q_bias));
  KVVM_RETURN_IF_ERROR(convert_optional(c.qkv_bias, w.k_bias, name("self_attn.k_proj.bias").c_str(),
                                        kv_rows, out.k_bias));
  KVVM_RETURN_IF_ERROR(convert_optional(c.qkv_bias, w.v_bias, name("self_attn.v_proj.bias").c_str(),
                                        kv_rows, out.v_bias));
  return convert_optional(c.o_bias, w.o_bias, name("self_attn.o_proj.bias").c_str(), hidden,
                          out.o_bias);
}

}  // namespace

Result<CpuWeights> convert_weights(const ModelConfig& config, const ModelWeights& weights) {
  if (weights.layers.size() != config.layers) {
    return Status::InvalidArgument("the weights hold " + std::to_string(weights.layers.size()) +
                                   " layers, the config " + std::to_string(config.layers));
  }
  const std::uint64_t hidden = config.hidden_size;
  const std::uint64_t vocab = config.vocab_size;
  CpuWeights out;
  KVVM_RETURN_IF_ERROR(
      convert(weights.embed, "model.embed_tokens.weight", {vocab, hidden}, out.embed));
  out.layers.resize(config.layers);
  for (std::size_t i = 0; i < config.layers; ++i) {
    KVVM_RETURN_IF_ERROR(convert_layer(config, weights.layers[i], i, out.layers[i]));
  }
  KVVM_RETURN_IF_ERROR(convert(weights.final_norm, "model.norm.weight", {hidden}, out.final_norm));
  // Tied: the embedding's rows serve as lm_head; no second copy.
  const bool tied = config.tie_word_embeddings || weights.lm_head == weights.embed;
  if (!tied) {
    KVVM_RETURN_IF_ERROR(convert(weights.lm_head, "lm_head.weight", {vocab, hidden}, out.lm_head));
  }
  return out;
}

}  // namespace kvvm::model::cpu
