// A small random model held in memory, for the model layer's tests: a hand-written
// ModelConfig, weights drawn from a seed and stored in the chosen dtype, TensorViews pointing
// at them and a ModelWeights bound directly (no safetensors file). Plus a KV arena on the host
// driver shaped for the config.
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvvm/kernels/attention.h"
#include "kvvm/model/model.h"
#include "kvvm/vmm/host_driver.h"
#include "support/attention_support.h"

namespace kvvm::testing {

// GQA (4 query heads over 2 KV heads), two layers, head_dim 16: small enough for a float64
// reference to recompute every position from scratch.
inline model::ModelConfig tiny_config() {
  model::ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 97;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 512;
  c.dtype = DType::kFp32;
  return c;
}

// Qwen2-like for the CUDA kernels: head dim 64 (what the attention kernels take), q / k / v
// biases, tied embeddings, theta 1e6, bf16; `max_positions` long.
inline model::ModelConfig tiny_cuda_config(std::uint32_t max_positions) {
  model::ModelConfig c = tiny_config();
  c.architecture = "Qwen2ForCausalLM";
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 300;
  c.qkv_bias = true;
  c.tie_word_embeddings = true;
  c.rope.theta = 1000000.0;
  c.max_position_embeddings = max_positions;
  c.dtype = DType::kBf16;
  return c;
}

// tiny_config() as a mixture of experts of `family` ("qwen3_moe": 8 experts, top 4,
// renormalised, layer 1 dense among three; "mixtral": 4 experts, top 2; "qwen2_moe": 8 experts,
// top 2, not renormalised, a shared expert and q/k/v biases).
inline model::ModelConfig tiny_moe_config(const std::string& family) {
  model::ModelConfig c = tiny_config();
  model::MoeConfig& moe = c.moe;
  if (family == "qwen3_moe") {
    c.architecture = "Qwen3MoeForCausalLM";
    c.layers = 3;
    c.qk_norm = true;
    moe.experts = 8, moe.top_k = 4, moe.expert_intermediate = 32, moe.renormalize = true;
    moe.sparse = {true, false, true};
  } else if (family == "mixtral") {
    c.architecture = "MixtralForCausalLM";
    moe.experts = 4, moe.top_k = 2, moe.expert_intermediate = 48, moe.renormalize = true;
    moe.naming = model::ExpertNaming::kMixtral;
    moe.sparse = {true, true};
  } else {
    c.architecture = "Qwen2MoeForCausalLM";
    c.qkv_bias = true;
    moe.experts = 8, moe.top_k = 2, moe.expert_intermediate = 32, moe.renormalize = false;
    moe.shared_intermediate = 80;
    moe.sparse = {true, true};
  }
  return c;
}

// tiny_moe_config(family) shaped for the CUDA kernels: head dim 64, hidden 192, experts of 64
// (a shared expert of 96), `max_positions` long, bf16.
inline model::ModelConfig tiny_cuda_moe_config(const std::string& family,
                                               std::uint32_t max_positions) {
  model::ModelConfig c = tiny_moe_config(family);
  c.hidden_size = 192;
  c.intermediate_size = 256;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 263;
  c.rope.theta = 1000000.0;
  c.max_position_embeddings = max_positions;
  c.dtype = DType::kBf16;
  c.moe.expert_intermediate = 64;
  if (c.moe.shared_intermediate > 0) c.moe.shared_intermediate = 96;
  return c;
}

class TinyModel {
 public:
  TinyModel(const model::ModelConfig& config, model::TensorDType dtype, std::uint64_t seed)
      : config_(config), dtype_(dtype), random_(seed) {
    const std::uint64_t hidden = config.hidden_size, inter = config.intermediate_size;
    const std::uint64_t q_rows = std::uint64_t{config.heads} * config.head_dim;
    const std::uint64_t kv_rows = std::uint64_t{config.kv_heads} * config.head_dim;
    weights_.embed = tensor("model.embed_tokens.weight", {config.vocab_size, hidden}, 1.0, 0);
    for (std::uint32_t i = 0; i < config.layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      model::LayerWeights w;
      w.input_norm = tensor(p + "input_layernorm.weight", {hidden}, 0.2, 1.0);
      w.q = linear(p + "self_attn.q_proj.weight", q_rows, hidden);
      w.k = linear(p + "self_attn.k_proj.weight", kv_rows, hidden);
      w.v = linear(p + "self_attn.v_proj.weight", kv_rows, hidden);
      if (config.qkv_bias) {
        w.q_bias = tensor(p + "self_attn.q_proj.bias", {q_rows}, 0.5, 0);
        w.k_bias = tensor(p + "self_attn.k_proj.bias", {kv_rows}, 0.5, 0);
        w.v_bias = tensor(p + "self_attn.v_proj.bias", {kv_rows}, 0.5, 0);
      }
      w.o = linear(p + "self_attn.o_proj.weight", hidden, q_rows);
      if (config.o_bias) w.o_bias = tensor(p + "self_attn.o_proj.bias", {hidden}, 0.5, 0);
      if (config.qk_norm) {
        // Far from ones, so a head norm that skipped its weight would show.
        w.q_norm = tensor(p + "self_attn.q_norm.weight", {config.head_dim}, 0.5, 1.0);
        w.k_norm = tensor(p + "self_attn.k_norm.weight", {config.head_dim}, 0.5, 1.0);
      }
      w.post_norm = tensor(p + "post_attention_layernorm.weight", {hidden}, 0.2, 1.0);
      if (config.moe.sparse_layer(i)) {
        add_experts(p, w);
      } else {
        w.gate = linear(p + "mlp.gate_proj.weight", inter, hidden);
        w.up = linear(p + "mlp.up_proj.weight", inter, hidden);
        w.down = linear(p + "mlp.down_proj.weight", hidden, inter);
      }
      weights_.layers.push_back(w);
    }
    weights_.final_norm = tensor("model.norm.weight", {hidden}, 0.2, 1.0);
    weights_.lm_head = config.tie_word_embeddings
                           ? weights_.embed
                           : tensor("lm_head.weight", {config.vocab_size, hidden}, 0.5, 0);
  }
  TinyModel(const TinyModel&) = delete;
  TinyModel& operator=(const TinyModel&) = delete;

  const model::ModelConfig& config() const { return config_; }
  const model::ModelWeights& weights() const { return weights_; }
  model::ModelWeights& mutable_weights() { return weights_; }
  // A further tensor (a wrong shape, a stray bias) that lives as long as the model.
  const model::TensorView* tensor(const std::string& name, std::vector<std::uint64_t> shape,
                                  double spread, double center) {
    model::TensorView& view = views_.emplace_back();
    view.name = name;
    view.dtype = dtype_;
    view.shape = std::move(shape);
    const DType element = dtype_ == model::TensorDType::kBf16  ? DType::kBf16
                          : dtype_ == model::TensorDType::kF16 ? DType::kFp16
                                                               : DType::kFp32;
    const std::uint32_t bytes = element_bytes(element);
    std::vector<std::uint8_t>& data = storage_.emplace_back(view.elements() * bytes);
    std::uniform_real_distribution<double> draw(-spread, spread);
    for (std::uint64_t i = 0; i < view.elements(); ++i) {
      float_to_element(element, static_cast<float>(center + draw(random_)), &data[i * bytes]);
    }
    view.data = reinterpret_cast<const std::byte*>(data.data());
    view.bytes = data.size();
    return &view;
  }

 private:
  // A sparse layer's router (drawn wide, so the top k are far from ties), experts and shared
  // expert, named as Qwen's checkpoints name them.
  void add_experts(const std::string& p, model::LayerWeights& w) {
    const model::MoeConfig& moe = config_.moe;
    const std::uint64_t hidden = config_.hidden_size, inter = moe.expert_intermediate;
    // Logits of spread ~7: the top k far apart from the rest, so a bf16 backend's rounding
    // cannot flip a choice that carries weight (an expert at the boundary has p ~ e^-7).
    w.router = tensor(p + "mlp.gate.weight", {moe.experts, hidden}, 12.0 / std::sqrt(hidden), 0);
    for (std::uint32_t e = 0; e < moe.experts; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      model::ExpertWeights& expert = w.experts.emplace_back();
      expert.gate = linear(x + "gate_proj.weight", inter, hidden);
      expert.up = linear(x + "up_proj.weight", inter, hidden);
      expert.down = linear(x + "down_proj.weight", hidden, inter);
    }
    if (moe.shared_intermediate > 0) {
      const std::uint64_t shared = moe.shared_intermediate;
      w.shared.gate = linear(p + "mlp.shared_expert.gate_proj.weight", shared, hidden);
      w.shared.up = linear(p + "mlp.shared_expert.up_proj.weight", shared, hidden);
      w.shared.down = linear(p + "mlp.shared_expert.down_proj.weight", hidden, shared);
      w.shared_gate = linear(p + "mlp.shared_expert_gate.weight", 1, hidden);
    }
  }

  // Scaled so activations stay of order one through the layers (peaked but finite logits).
  const model::TensorView* linear(const std::string& name, std::uint64_t rows, std::uint64_t cols) {
    return tensor(name, {rows, cols}, 1.5 / std::sqrt(static_cast<double>(cols)), 0);
  }

  model::ModelConfig config_;
  model::TensorDType dtype_;
  std::mt19937_64 random_;
  std::deque<std::vector<std::uint8_t>> storage_;  // deques: stable addresses
  std::deque<model::TensorView> views_;
  model::ModelWeights weights_;
};

// The host driver (page-sized granule: many windows per sequence) and an arena of `slots`
// slots of `max_context` tokens for the config's KV geometry in `element`.
struct ModelKv {
  std::unique_ptr<Driver> driver;
  std::unique_ptr<KvArena> kv;

  static std::unique_ptr<ModelKv> make(const model::ModelConfig& config, Layout layout,
                                       DType element, std::uint64_t max_context,
                                       std::uint32_t slots) {
    auto made = std::make_unique<ModelKv>();
    auto driver = make_host_driver();
    EXPECT_TRUE(driver.ok()) << driver.status().to_string();
    if (!driver.ok()) return nullptr;
    made->driver = std::move(driver).value();
    made->kv =
        KvArena::make(*made->driver, config.kv_geometry(element), layout, max_context, slots);
    if (!made->kv) return nullptr;
    return made;
  }
  Arena& arena() { return *kv->arena; }
};

}  // namespace kvvm::testing
