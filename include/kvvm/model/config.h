// ModelConfig: what the model runtime needs of a Hugging Face checkpoint's config.json (and
// generation_config.json), for the decoder-only families it runs: LlamaForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM and MistralForCausalLM without a sliding window, and the
// mixtures of experts Qwen3MoeForCausalLM, MixtralForCausalLM and Qwen2MoeForCausalLM.
//
// Why refuse rather than guess: a field this runtime does not implement (a sliding window, an
// MLP bias, an unknown RoPE scaling) changes the model's outputs silently if ignored, so the
// parser names the field and its value and stops.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/dtype.h"
#include "kvvm/base/status.h"
#include "kvvm/kv/geometry.h"

namespace kvvm::model {

enum class RopeScaling : std::uint8_t {
  kNone,    // inv_freq[i] = theta^(-2i / head_dim)
  kLinear,  // positions divided by `factor`
  kLlama3,  // Llama 3.1's frequency-dependent scaling (factor, low/high_freq_factor, original)
};

// How a checkpoint stores its seven projections per layer (q, k, v, o, gate, up, down); the
// embedding, lm_head and the norms are never quantized.
enum class WeightQuant : std::uint8_t {
  kNone,
  // Hugging Face's "fp8" (quant_method "fp8", weight_block_size [128, 128], activation_scheme
  // "dynamic"): e4m3 weights, one float scale per 128 x 128 block in `weight_scale_inv`
  // [ceil(out / 128)][ceil(in / 128)]; activations quantized per token and group of 128.
  kFp8Block,
  // compressed-tensors FP8-dynamic (format "float-quantized", weights strategy "channel",
  // input_activations strategy "token", dynamic): e4m3 weights, one scale per output channel in
  // `weight_scale` [out][1]; activations quantized per token.
  kFp8Channel,
};
// "none", "fp8-block128", "fp8-channel".
std::string_view to_string(WeightQuant quant);
inline constexpr std::uint32_t kFp8WeightBlock = 128;

struct RopeConfig {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;                // llama3
  double high_freq_factor = 4.0;               // llama3
  std::uint32_t original_max_position = 8192;  // llama3
};

// How a checkpoint names its experts (model/weights.h lists the tensors).
enum class ExpertNaming : std::uint8_t {
  kQwen,     // mlp.gate, mlp.experts.{e}.{gate,up,down}_proj (Qwen3-MoE, Qwen2-MoE)
  kMixtral,  // block_sparse_moe.gate, block_sparse_moe.experts.{e}.{w1,w3,w2} (gate, up, down)
};

// A mixture of experts' feed-forward, as transformers runs it: the router's logits
// (a [experts][hidden] linear), softmax in float32 over all experts, the top_k largest (the lower
// id first among equals), renormalised over the chosen when `renormalize`, each chosen expert's
// SiLU MLP of `expert_intermediate` weighted by its probability and summed; with a shared
// expert (Qwen2-MoE), sigmoid(shared_expert_gate(x)) * shared_expert(x) added. Layers that are
// not sparse run the dense MLP of intermediate_size.
struct MoeConfig {
  std::uint32_t experts = 0;              // num_experts (num_local_experts); 0: a dense model
  std::uint32_t top_k = 0;                // num_experts_per_tok
  std::uint32_t expert_intermediate = 0;  // moe_intermediate_size (Mixtral: intermediate_size)
  bool renormalize = false;               // norm_topk_prob (Mixtral: always)
  std::uint32_t shared_intermediate = 0;  // shared_expert_intermediate_size; 0: none
  ExpertNaming naming = ExpertNaming::kQwen;
  std::vector<bool> sparse;  // per layer: experts (true) or the dense MLP

  bool enabled() const { return experts > 0; }
  bool sparse_layer(std::uint32_t layer) const {
    return enabled() && layer < sparse.size() && sparse[layer];
  }
  std::uint32_t sparse_layers() const;
};

struct ModelConfig {
  // Where the config came from, for messages and the KV geometry's name: a built-in model's
  // name or the config.json path (load_kv_config, builtin_model_config); empty otherwise.
  std::string name;
  // "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
  // "Qwen3MoeForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM"
  std::string architecture;
  std::uint32_t hidden_size = 0;
  std::uint32_t intermediate_size = 0;  // the dense MLP's (a mixture's dense layers')
  std::uint32_t layers = 0;             // num_hidden_layers
  std::uint32_t heads = 0;              // num_attention_heads
  std::uint32_t kv_heads = 0;           // num_key_value_heads (heads when absent)
  std::uint32_t head_dim = 0;           // head_dim, else hidden_size / heads (Qwen3: 128)
  std::uint32_t vocab_size = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2: always; Llama / Qwen3 / Mistral: attention_bias
  bool o_bias = false;    // Llama / Qwen3 / Mistral: attention_bias
  // Qwen3: each head of q and of k is RMS-normalised (self_attn.q_norm / k_norm, [head_dim],
  // eps rms_norm_eps) after its projection and before RoPE.
  bool qk_norm = false;
  std::uint32_t max_position_embeddings = 0;
  DType dtype = DType::kBf16;  // torch_dtype / dtype of the checkpoint (its unquantized tensors)
  WeightQuant weight_quant = WeightQuant::kNone;  // config.json's quantization_config
  MoeConfig moe;                                  // experts 0 for a dense model
  std::vector<std::int32_t> bos_token_ids;
  std::vector<std::int32_t> eos_token_ids;  // generation_config.json's list, else config's

  // The KV cache's geometry: layers, kv_heads, head_dim in `kv_dtype`, named by the
  // architecture (kv_geometry() in kvvm/model/kv_config.h names it by `name`).
  Geometry kv_geometry(DType kv_dtype) const;
};

// Parses config.json text. `origin` (a path) prefixes every error. InvalidArgument naming
// the field and value for anything missing, malformed, out of bounds or unsupported.
Result<ModelConfig> parse_model_config(std::string_view config_json, std::string_view origin);

// Reads DIR/config.json and, when present, DIR/generation_config.json (bos / eos ids).
// NotFound naming the path when config.json is absent.
Result<ModelConfig> load_model_config(const std::string& dir);

// The config.json at `path` alone (no generation_config.json beside it), read under the same
// limits; NotFound naming the path when it is absent.
Result<ModelConfig> load_config_file(const std::string& path);

}  // namespace kvvm::model
