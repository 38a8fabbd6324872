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

// An expert's three projections (gate and up as one [2 * inter][hidden] run, as the dense MLP
// keeps them) at `at` in layer `l`'s block, with their scales' offsets when the store keeps any.
void add_expert(const ModelConfig& c, const WeightLayout& layout, std::uint32_t l,
                const std::string& name, const ExpertWeights* w, std::uint64_t inter,
                const ExpertOffsets& at, std::uint32_t& next_id, std::vector<WeightTensor>& out) {
  const std::uint64_t hidden = c.hidden_size;
  const std::uint32_t psize = element_bytes(layout.projection);
  const bool mixtral =
      c.moe.naming == ExpertNaming::kMixtral && name.find("shared") == std::string::npos;
  const char* names[3] = {"gate_proj", "up_proj", "down_proj"};
  if (mixtral) names[0] = "w1", names[1] = "w3", names[2] = "w2";
  const TensorView* sources[3] = {w ? w->gate : nullptr, w ? w->up : nullptr,
                                  w ? w->down : nullptr};
  const TensorView* scale_sources[3] = {w ? w->gate_weight_scale : nullptr,
                                        w ? w->up_weight_scale : nullptr,
                                        w ? w->down_weight_scale : nullptr};
  const std::uint64_t offsets[3] = {at.gate_up, at.gate_up + inter * hidden * psize, at.down};
  const std::uint64_t shapes[3][2] = {{inter, hidden}, {inter, hidden}, {hidden, inter}};
  std::uint64_t scale_at = at.gate_up_scale;
  for (int i = 0; i < 3; ++i) {
    WeightTensor t;
    t.name = name + names[i] + ".weight";
    t.shape = {shapes[i][0], shapes[i][1]};
    t.source = sources[i];
    t.region = l;
    t.offset = offsets[i];
    t.elements = shapes[i][0] * shapes[i][1];
    t.dummy_id = next_id++;
    t.scale = fan_in_scale(shapes[i][1]);
    if (c.weight_quant != WeightQuant::kNone) {
      t.quant = c.weight_quant;
      t.scale_source = scale_sources[i];
      t.scale_count = weight_scale_count(c.weight_quant, t.shape[0], t.shape[1]);
      if (i == 2) scale_at = at.down_scale;
      t.scale_offset = scale_at;
      if (scale_at != kNoTensor) {
        scale_at += device_scale_count(c.weight_quant, t.shape[0], t.shape[1]) * sizeof(float);
      }
    }
    out.push_back(std::move(t));
  }
}

// A sparse layer's router, shared expert and experts, where layout.sparse places them.
void add_sparse_layer(const ModelConfig& c, const WeightLayout& layout, std::uint32_t l,
                      const LayerWeights* w, std::uint32_t& next_id,
                      std::vector<WeightTensor>& out) {
  const MoeConfig& moe = c.moe;
  const SparseOffsets& sparse = layout.sparse;
  const std::uint64_t hidden = c.hidden_size;
  const std::string module =
      "model.layers." + std::to_string(l) +
      (moe.naming == ExpertNaming::kMixtral ? ".block_sparse_moe." : ".mlp.");
  auto plain = [&](std::string name, std::vector<std::uint64_t> shape, const TensorView* source,
                   std::uint64_t offset) {
    WeightTensor t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.source = source;
    t.region = l;
    t.offset = offset;
    t.elements = t.shape[0] * t.shape[1];
    t.dummy_id = next_id++;
    t.scale = fan_in_scale(hidden);
    out.push_back(std::move(t));
  };
  // Named as the checkpoint names them when bound (a fused tensor's slice says which expert).
  auto named = [](const TensorView* source, std::string fallback) {
    return source != nullptr ? source->name : std::move(fallback);
  };
  plain(named(w ? w->router : nullptr, module + "gate.weight"), {moe.experts, hidden},
        w ? w->router : nullptr, sparse.router);
  if (moe.shared_intermediate > 0) {
    plain(named(w ? w->shared_gate : nullptr, module + "shared_expert_gate.weight"), {1, hidden},
          w ? w->shared_gate : nullptr, sparse.shared_gate);
    add_expert(c, layout, l, module + "shared_expert.", w ? &w->shared : nullptr,
               moe.shared_intermediate, sparse.shared, next_id, out);
  }
  for (std::uint32_t e = 0; e < moe.experts; ++e) {
    ExpertOffsets at = sparse.expert;
    const std::uint64_t base = sparse.experts + std::uint64_t{e} * sparse.expert_stride;
    at.gate_up += base;
    at.down += base;
    if (at.gate_up_scale != kNoTensor) at.gate_up_scale += base;
    if (at.down_scale != kNoTensor) at.down_scale += base;
    const std::size_t first = out.size();
    add_expert(c, layout, l, module + "experts." + std::to_string(e) + ".",
               w ? &w->experts[e] : nullptr, moe.expert_intermediate, at, next_id, out);
    if (w != nullptr) {
      // A fused tensor's slices keep their own names (the checkpoint has no per-expert name).
      for (std::size_t i = first; i < out.size(); ++i) {
        if (out[i].source != nullptr) out[i].name = out[i].source->name;
      }
    }
  }
}

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
    const bool sparse = c.moe.sparse_layer(l);
    if (!sparse) {
      // gate and up are one [2 * intermediate][hidden] matrix in the block (one GEMM on CUDA).
      add(p + "mlp.gate_proj.weight", {inter, hidden}, view(&LayerWeights::gate), l, k.gate_up,
          fan_in_scale(hidden), 0);
      add(p + "mlp.up_proj.weight", {inter, hidden}, view(&LayerWeights::up), l,
          k.gate_up + inter * hidden * psize, fan_in_scale(hidden), 0);
      add(p + "mlp.down_proj.weight", {hidden, inter}, view(&LayerWeights::down), l, k.down,
          fan_in_scale(inter), 0);
    }
    if (c.weight_quant != WeightQuant::kNone) {
      // The projections just added, in the order of their scales in the block.
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
      const int count = sparse ? 4 : 7;
      const bool stored = k.qkv_scale != kNoTensor;
      std::uint64_t at = kNoTensor;
      WeightTensor* projection = &out[out.size() - count];
      for (int i = 0; i < count; ++i, ++projection) {
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
    if (sparse) add_sparse_layer(c, layout, l, w, next_id, out);
  }
  if (!dummy) {
    for (const WeightTensor& t : out) KVVM_RETURN_IF_ERROR(check_source(t));
  }
  return out;
}

}  // namespace kvvm::model::detail
