// The weight tensors of a model, bound to a checkpoint's views and checked, or described for the
// dummy format.
#include "model/weights/weight_tensors.h"

#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/model/safetensors.h"

namespace kvvm::model::detail {
namespace {

bool readable(TensorDType dtype) {
  return dtype == TensorDType::kBf16 || dtype == TensorDType::kF16 || dtype == TensorDType::kF32;
}

// The bytes of `view` are those of `elements` of its dtype, and present.
Status check_bytes(const TensorView& view, const std::string& name, std::uint64_t elements) {
  const std::uint64_t bytes = elements * element_size(view.dtype);
  if (view.bytes != bytes || (bytes > 0 && view.data == nullptr)) {
    return Status::InvalidArgument("tensor " + name + " holds " + std::to_string(view.bytes) +
                                   " bytes, its shape and dtype need " + std::to_string(bytes));
  }
  return Status::Ok();
}

// Where a quantized projection's scales are stored beside it: "<module>.weight_scale_inv"
// (block-scaled) or "<module>.weight_scale" (per channel).
std::string scale_name(const WeightTensor& t) {
  const std::string_view weight = ".weight";
  std::string module = t.name;
  if (module.ends_with(weight)) module.resize(module.size() - weight.size());
  return module + (t.quant == WeightQuant::kFp8Block ? ".weight_scale_inv" : ".weight_scale");
}

// A quantized projection's scales: present, F32 / BF16 / F16, [ceil(rows / 128)][ceil(in /
// 128)] or [rows][1].
Status check_scale(const WeightTensor& t) {
  const std::string name = scale_name(t);
  const TensorView* view = t.scale_source;
  if (view == nullptr) {
    return Status::InvalidArgument("tensor " + name + " is missing (the scales of " + t.name +
                                   ", " + std::string(to_string(t.quant)) + ")");
  }
  if (!readable(view->dtype)) {
    return Status::InvalidArgument("tensor " + name + " has dtype " +
                                   std::string(to_string(view->dtype)) +
                                   "; a weight scale is F32, BF16 or F16");
  }
  const std::uint64_t block = kFp8WeightBlock;
  const std::uint64_t rows = t.shape[0], in = t.shape[1];
  const std::vector<std::uint64_t> shape =
      t.quant == WeightQuant::kFp8Block
          ? std::vector<std::uint64_t>{(rows + block - 1) / block, (in + block - 1) / block}
          : std::vector<std::uint64_t>{rows, 1};
  if (view->shape != shape) {
    return Status::InvalidArgument("tensor " + name + " has shape " + shape_string(view->shape) +
                                   ", the config (" + std::string(to_string(t.quant)) +
                                   ") expects " + shape_string(shape));
  }
  return check_bytes(*view, name, t.scale_count);
}

Status check_source(const WeightTensor& t) {
  const TensorView* view = t.source;
  if (view == nullptr) return Status::InvalidArgument("tensor " + t.name + " is missing");
  const bool quantized = t.quant != WeightQuant::kNone;
  if (quantized && view->dtype != TensorDType::kF8E4M3) {
    return Status::InvalidArgument("tensor " + t.name + " has dtype " +
                                   std::string(to_string(view->dtype)) +
                                   "; the config's quantization_config (" +
                                   std::string(to_string(t.quant)) + ") stores it as F8_E4M3");
  }
  if (!quantized && !readable(view->dtype)) {
    return Status::InvalidArgument("tensor " + t.name + " has dtype " +
                                   std::string(to_string(view->dtype)) +
                                   "; the model runtime reads BF16, F16 or F32");
  }
  if (view->shape != t.shape) {
    return Status::InvalidArgument("tensor " + t.name + " has shape " + shape_string(view->shape) +
                                   ", the config expects " + shape_string(t.shape));
  }
  KVVM_RETURN_IF_ERROR(check_bytes(*view, t.name, t.elements));
  return quantized ? check_scale(t) : Status::Ok();
}

// A uniform draw of this half-width has the variance of 1 / fan_in: activations keep their
// size through a dummy model's layers.
float fan_in_scale(std::uint64_t fan_in) { return std::sqrt(3.0f / static_cast<float>(fan_in)); }

}  // namespace

Result<std::vector<WeightTensor>> weight_tensors(const ModelConfig& c, const WeightLayout& layout,
                                                 const ModelWeights* weights) {
  const std::uint64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const std::uint64_t vocab = c.vocab_size;
  const std::uint64_t q_dim = std::uint64_t{c.heads} * c.head_dim;
  const std::uint64_t kv_dim = std::uint64_t{c.kv_heads} * c.head_dim;
  // The projections' element: fp8 kept as stored, or what the backend computes in.
  const std::uint32_t psize = element_bytes(layout.projection);
  std::vector<WeightTensor> out;
  std::uint32_t next_id = 0;
  auto add = [&](std::string name, std::vector<std::uint64_t> shape, const TensorView* source,
                 std::uint32_t region, std::uint64_t offset, float scale, float constant) {
    WeightTensor t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.source = source;
    t.region = region;
    t.offset = offset;
    t.elements = 1;
    for (std::uint64_t d : t.shape) t.elements *= d;
    t.dummy_id = next_id++;
    t.scale = scale;
    t.constant = constant;
    out.push_back(std::move(t));
  };
  const bool dummy = weights == nullptr;
  if (!dummy && weights->layers.size() != c.layers) {
    return Status::InvalidArgument("the weights hold " + std::to_string(weights->layers.size()) +
                                   " layers, the config " + std::to_string(c.layers));
  }
  add("model.embed_tokens.weight", {vocab, hidden}, dummy ? nullptr : weights->embed, kBaseRegion,
      layout.embed, 1.0f, 0);
  const bool tied = layout.lm_head == layout.embed;
  if (!tied) {
    add("lm_head.weight", {vocab, hidden}, dummy ? nullptr : weights->lm_head, kBaseRegion,
        layout.lm_head, fan_in_scale(hidden), 0);
  }
  add("model.norm.weight", {hidden}, dummy ? nullptr : weights->final_norm, kBaseRegion,
      layout.final_norm, 0, 1.0f);
  for (std::uint32_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const LayerWeights* w = dummy ? nullptr : &weights->layers[l];
    const LayerBaseOffsets& b = layout.layers[l];
    const LayerBlockOffsets& k = layout.block;
    auto view = [&](const TensorView* LayerWeights::*member) {
      return w == nullptr ? nullptr : w->*member;
    };
    add(p + "input_layernorm.weight", {hidden}, view(&LayerWeights::input_norm), kBaseRegion,
        b.input_norm, 0, 1.0f);
    add(p + "post_attention_layernorm.weight", {hidden}, view(&LayerWeights::post_norm),
        kBaseRegion, b.post_norm, 0, 1.0f);
    const std::pair<const char*, const TensorView * LayerWeights::*> biases[] = {
        {"self_attn.q_proj.bias", &LayerWeights::q_bias},
        {"self_attn.k_proj.bias", &LayerWeights::k_bias},
        {"self_attn.v_proj.bias", &LayerWeights::v_bias},
        {"self_attn.o_proj.bias", &LayerWeights::o_bias}};
    const std::uint64_t bias_at[] = {b.q_bias, b.k_bias, b.v_bias, b.o_bias};
    const std::uint64_t bias_rows[] = {q_dim, kv_dim, kv_dim, hidden};
    for (int i = 0; i < 4; ++i) {
      if (bias_at[i] == kNoTensor) {
        if (view(biases[i].second) != nullptr) {
          return Status::InvalidArgument("tensor " + p + biases[i].first +
                                         " is given but the config has no such bias");
        }
        continue;
      }
      add(p + biases[i].first, {bias_rows[i]}, view(biases[i].second), kBaseRegion, bias_at[i], 0,
          0.0f);
    }
    const std::pair<const char*, const TensorView * LayerWeights::*> head_norms[] = {
        {"self_attn.q_norm.weight", &LayerWeights::q_norm},
        {"self_attn.k_norm.weight", &LayerWeights::k_norm}};
    const std::uint64_t head_norm_at[] = {b.q_norm, b.k_norm};
    for (int i = 0; i < 2; ++i) {
      if (head_norm_at[i] == kNoTensor) {
        if (view(head_norms[i].second) != nullptr) {
          return Status::InvalidArgument("tensor " + p + head_norms[i].first +
                                         " is given but the config has no q/k norm");
        }
        continue;
      }
      add(p + head_norms[i].first, {c.head_dim}, view(head_norms[i].second), kBaseRegion,
          head_norm_at[i], 0, 1.0f);
    }
    add(p + "self_attn.q_proj.weight", {q_dim, hidden}, view(&LayerWeights::q), l, k.q,
        fan_in_scale(hidden), 0);
    add(p + "self_attn.k_proj.weight", {kv_dim, hidden}, view(&LayerWeights::k), l, k.k,
        fan_in_scale(hidden), 0);
    add(p + "self_attn.v_proj.weight", {kv_dim, hidden}, view(&LayerWeights::v), l, k.v,
        fan_in_scale(hidden), 0);
    add(p + "self_attn.o_proj.weight", {hidden, q_dim}, view(&LayerWeights::o), l, k.o,
        fan_in_scale(q_dim), 0);
    // gate and up are one [2 * intermediate][hidden] matrix in the block (one GEMM on CUDA).
    add(p + "mlp.gate_proj.weight", {inter, hidden}, view(&LayerWeights::gate), l, k.gate_up,
        fan_in_scale(hidden), 0);
    add(p + "mlp.up_proj.weight", {inter, hidden}, view(&LayerWeights::up), l,
        k.gate_up + inter * hidden * psize, fan_in_scale(hidden), 0);
    add(p + "mlp.down_proj.weight", {hidden, inter}, view(&LayerWeights::down), l, k.down,
        fan_in_scale(inter), 0);
    if (c.weight_quant != WeightQuant::kNone) {
      // The seven projections just added, in the order of their scales in the block.
      const TensorView* LayerWeights::*const scales[] = {
          &LayerWeights::q_weight_scale,    &LayerWeights::k_weight_scale,
          &LayerWeights::v_weight_scale,    &LayerWeights::o_weight_scale,
          &LayerWeights::gate_weight_scale, &LayerWeights::up_weight_scale,
          &LayerWeights::down_weight_scale};
      // Each run of scales starts at its offset in the layout, the next projection's where the
      // previous ends as the store keeps it (device_scale_count: rows of blocks padded): k
      // after q, v after k, up after gate.
      const std::uint64_t runs[] = {k.qkv_scale,     kNoTensor, kNoTensor,   k.o_scale,
                                    k.gate_up_scale, kNoTensor, k.down_scale};
      const bool stored = k.qkv_scale != kNoTensor;
      std::uint64_t at = kNoTensor;
      WeightTensor* projection = &out[out.size() - 7];
      for (int i = 0; i < 7; ++i, ++projection) {
        WeightTensor& t = *projection;
        t.quant = c.weight_quant;
        t.scale_source = view(scales[i]);
        t.scale_count = weight_scale_count(c.weight_quant, t.shape[0], t.shape[1]);
        if (runs[i] != kNoTensor) at = runs[i];
        t.scale_offset = stored ? at : kNoTensor;
        if (stored) {
          at += device_scale_count(c.weight_quant, t.shape[0], t.shape[1]) * sizeof(float);
        }
      }
    }
  }
  if (!dummy) {
    for (const WeightTensor& t : out) KVVM_RETURN_IF_ERROR(check_source(t));
  }
  return out;
}

}  // namespace kvvm::model::detail
