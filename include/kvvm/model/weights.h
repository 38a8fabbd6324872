// ModelWeights: every tensor the forward pass reads, bound by name from a checkpoint and
// checked (presence, dtype, shape) before the first byte is used, so a bad checkpoint fails
// at load with the tensor's name and both shapes, never in the middle of a step.
//
// Hugging Face names (Llama / Qwen2 / Qwen3 / Mistral):
//   model.embed_tokens.weight                     [vocab, hidden]
//   model.layers.{i}.input_layernorm.weight       [hidden]
//   model.layers.{i}.self_attn.q_proj.weight      [heads * head_dim, hidden]   (+ .bias)
//   model.layers.{i}.self_attn.k_proj.weight      [kv_heads * head_dim, hidden] (+ .bias)
//   model.layers.{i}.self_attn.v_proj.weight      [kv_heads * head_dim, hidden] (+ .bias)
//   model.layers.{i}.self_attn.o_proj.weight      [hidden, heads * head_dim]   (+ .bias)
//   model.layers.{i}.self_attn.q_norm.weight      [head_dim]   (Qwen3: config.qk_norm)
//   model.layers.{i}.self_attn.k_norm.weight      [head_dim]
//   model.layers.{i}.post_attention_layernorm.weight [hidden]
//   model.layers.{i}.mlp.gate_proj.weight         [intermediate, hidden]
//   model.layers.{i}.mlp.up_proj.weight           [intermediate, hidden]
//   model.layers.{i}.mlp.down_proj.weight         [hidden, intermediate]
//   model.norm.weight                             [hidden]
//   lm_head.weight                                [vocab, hidden] (embed_tokens when tied)
//
// A mixture of experts (config.moe) has, in place of the mlp.* projections on each sparse layer
// (a layer config.moe.sparse_layer() names; the others keep the dense MLP above):
//   model.layers.{i}.mlp.gate.weight                          [experts, hidden]  the router
//   model.layers.{i}.mlp.experts.{e}.gate_proj.weight         [expert_intermediate, hidden]
//   model.layers.{i}.mlp.experts.{e}.up_proj.weight           [expert_intermediate, hidden]
//   model.layers.{i}.mlp.experts.{e}.down_proj.weight         [hidden, expert_intermediate]
//   model.layers.{i}.mlp.shared_expert.{gate,up,down}_proj.weight   (Qwen2-MoE) [shared, ...]
//   model.layers.{i}.mlp.shared_expert_gate.weight            [1, hidden]        (Qwen2-MoE)
// Mixtral names them block_sparse_moe.gate and block_sparse_moe.experts.{e}.w1 (gate), .w3 (up),
// .w2 (down). transformers 5 may instead save each layer's experts fused:
// <mlp or block_sparse_moe>.experts.gate_up_proj [experts, 2 * expert_intermediate, hidden] (gate
// rows, then up rows) and .experts.down_proj [experts, hidden, expert_intermediate]; each
// expert's gate, up and down are then views into those. The router and the shared expert's gate
// are never quantized; an FP8 checkpoint stores each expert's projections per expert.
//
// A quantized checkpoint (config.weight_quant) stores each of the seven projections' .weight as
// F8_E4M3 beside its scales (F32, BF16 or F16), w = e4m3 * scale:
//   fp8-block128: <projection>.weight_scale_inv [ceil(out / 128), ceil(in / 128)], one per
//                 128 x 128 block
//   fp8-channel:  <projection>.weight_scale     [out, 1], one per output row
#pragma once

#include <memory>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/model/config.h"
#include "kvvm/model/kv_scales.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weight_memory.h"

namespace kvvm::model {

// One expert's projections (and their scales when quantized).
struct ExpertWeights {
  const TensorView* gate = nullptr;
  const TensorView* up = nullptr;
  const TensorView* down = nullptr;
  const TensorView* gate_weight_scale = nullptr;
  const TensorView* up_weight_scale = nullptr;
  const TensorView* down_weight_scale = nullptr;
};

struct LayerWeights {
  const TensorView* input_norm = nullptr;
  const TensorView* q = nullptr;
  const TensorView* k = nullptr;
  const TensorView* v = nullptr;
  const TensorView* q_bias = nullptr;  // null unless config.qkv_bias
  const TensorView* k_bias = nullptr;
  const TensorView* v_bias = nullptr;
  const TensorView* o = nullptr;
  const TensorView* o_bias = nullptr;  // null unless config.o_bias
  const TensorView* q_norm = nullptr;  // null unless config.qk_norm
  const TensorView* k_norm = nullptr;
  const TensorView* post_norm = nullptr;
  // The dense MLP; null on a mixture's sparse layers.
  const TensorView* gate = nullptr;
  const TensorView* up = nullptr;
  const TensorView* down = nullptr;
  // A sparse layer's router, experts and (Qwen2-MoE) shared expert; empty / null otherwise.
  const TensorView* router = nullptr;
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
  const TensorView* shared_gate = nullptr;
  // The projections' scales when config.weight_quant is not kNone (the projections are then
  // F8_E4M3); null otherwise.
  const TensorView* q_weight_scale = nullptr;
  const TensorView* k_weight_scale = nullptr;
  const TensorView* v_weight_scale = nullptr;
  const TensorView* o_weight_scale = nullptr;
  const TensorView* gate_weight_scale = nullptr;
  const TensorView* up_weight_scale = nullptr;
  const TensorView* down_weight_scale = nullptr;
  // fp8 KV cache scales (self_attn.k_scale / v_scale: one value, or one per KV head); null
  // when absent.
  const TensorView* k_scale = nullptr;
  const TensorView* v_scale = nullptr;
};

// Non-owning: the WeightFiles (or whatever owns the TensorViews) must outlive it.
struct ModelWeights {
  const TensorView* embed = nullptr;
  std::vector<LayerWeights> layers;
  const TensorView* final_norm = nullptr;
  const TensorView* lm_head = nullptr;  // == embed when tied
  // Views made here rather than found in the files: each expert's slice of fused expert tensors
  // (shared, so a copy of the weights points at views that live as long as it does).
  std::vector<std::shared_ptr<const TensorView>> slices;
};

// The checkpoint's KV scales: source kCheckpoint when every layer has both, kDefault (ones)
// when none has; one per layer, or one per layer and KV head when any tensor holds one per
// head (a tensor of one value then holds for each head of its layer). InvalidArgument naming
// the tensor when only some layers have them, a scale is not finite and positive, or a tensor
// holds neither one value nor `kv_heads`.
Result<KvScales> kv_scales_of(const ModelWeights& weights, std::uint32_t kv_heads);
// What a model loads with: kv_scales_of(weights) for a checkpoint, ones for dummy weights.
Result<KvScales> checkpoint_kv_scales(const ModelConfig& config, const ModelWeights& weights,
                                      LoadFormat format);

// Binds and checks every tensor: InvalidArgument naming the tensor for one that is missing,
// of a dtype other than BF16 / F16 / F32 (F8_E4M3 for a quantized checkpoint's projections,
// and only for them), or of a shape other than the config's (both shapes named); a quantized
// projection's scale likewise (missing, not F32 / BF16 / F16, or of another shape). Tensors
// the checkpoint holds beyond these (rotary inv_freq buffers) are ignored.
Result<ModelWeights> bind_weights(const ModelConfig& config, const WeightFiles& files);

}  // namespace kvvm::model
