// bind_weights: every tensor the forward pass reads, found and checked (presence, dtype,
// shape) against the config, with the biases, tying and errors each family needs.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kvvm/model/weights.h"
#include "support/safetensors_writer.h"
#include "support/text_match.h"

namespace kvvm::model {
namespace {

using test::TempDir;
using test::TensorSpec;
using test::TinyModel;

using test::contains;

struct WeightsLoaded {
  ModelConfig config;
  std::unique_ptr<WeightFiles> files;
};

// `model`'s config and `tensors` written to `dir`, then read back.
WeightsLoaded load(const TempDir& dir, const TinyModel& model,
                   const std::vector<TensorSpec>& tensors) {
  test::write_json_file(dir / "config.json", test::tiny_config_json(model));
  test::write_safetensors(dir / "model.safetensors", tensors);
  Result<ModelConfig> config = load_model_config(dir.path().string());
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  Result<std::unique_ptr<WeightFiles>> files = WeightFiles::open_dir(dir.path().string());
  EXPECT_TRUE(files.ok()) << files.status().to_string();
  if (!config.ok() || !files.ok()) return {};
  return {std::move(*config), std::move(*files)};
}

// The error binding `tensors` to `model`'s config.
std::string refusal(const TinyModel& model, const std::vector<TensorSpec>& tensors) {
  TempDir dir;
  WeightsLoaded loaded = load(dir, model, tensors);
  if (!loaded.files) return "";
  Result<ModelWeights> weights = bind_weights(loaded.config, *loaded.files);
  EXPECT_FALSE(weights.ok());
  if (weights.ok()) return "";
  EXPECT_EQ(weights.status().code(), StatusCode::kInvalidArgument);
  return weights.status().message();
}

std::vector<TensorSpec> without(std::vector<TensorSpec> tensors, const std::string& name) {
  std::erase_if(tensors, [&](const TensorSpec& tensor) { return tensor.name == name; });
  return tensors;
}

TensorSpec& tensor(std::vector<TensorSpec>& tensors, const std::string& name) {
  const auto found = std::find_if(tensors.begin(), tensors.end(),
                                  [&](const TensorSpec& t) { return t.name == name; });
  EXPECT_NE(found, tensors.end()) << name;
  return *found;
}

TEST(ModelWeights, LlamaBindsEveryTensorWithItsShape) {
  TempDir dir;
  TinyModel model;
  std::vector<TensorSpec> tensors = test::tiny_model_tensors(model);
  // Tensors beyond the model's (old checkpoints keep RoPE buffers) are ignored.
  tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq",
                     "F32",
                     {8},
                     test::f32_bytes(test::random_floats(8, 3))});
  WeightsLoaded loaded = load(dir, model, tensors);
  ASSERT_TRUE(loaded.files);
  Result<ModelWeights> weights = bind_weights(loaded.config, *loaded.files);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  const WeightFiles& files = *loaded.files;
  EXPECT_EQ(weights->embed, files.find("model.embed_tokens.weight"));
  EXPECT_EQ(weights->final_norm, files.find("model.norm.weight"));
  EXPECT_EQ(weights->lm_head, files.find("lm_head.weight"));
  EXPECT_NE(weights->lm_head, weights->embed);
  ASSERT_EQ(weights->layers.size(), 2u);
  const LayerWeights& layer = weights->layers[1];
  EXPECT_EQ(layer.input_norm, files.find("model.layers.1.input_layernorm.weight"));
  EXPECT_EQ(layer.q, files.find("model.layers.1.self_attn.q_proj.weight"));
  EXPECT_EQ(layer.k, files.find("model.layers.1.self_attn.k_proj.weight"));
  EXPECT_EQ(layer.v, files.find("model.layers.1.self_attn.v_proj.weight"));
  EXPECT_EQ(layer.o, files.find("model.layers.1.self_attn.o_proj.weight"));
  EXPECT_EQ(layer.post_norm, files.find("model.layers.1.post_attention_layernorm.weight"));
  EXPECT_EQ(layer.gate, files.find("model.layers.1.mlp.gate_proj.weight"));
  EXPECT_EQ(layer.up, files.find("model.layers.1.mlp.up_proj.weight"));
  EXPECT_EQ(layer.down, files.find("model.layers.1.mlp.down_proj.weight"));
  EXPECT_EQ(layer.q_bias, nullptr);
  EXPECT_EQ(layer.o_bias, nullptr);
  EXPECT_EQ(layer.k->shape, (std::vector<std::uint64_t>{32, 64}));  // 2 KV heads of 16
  EXPECT_EQ(layer.q->shape, (std::vector<std::uint64_t>{64, 64}));
  EXPECT_EQ(layer.down->shape, (std::vector<std::uint64_t>{64, 128}));
  EXPECT_NE(weights->layers[0].q, layer.q);
}

TEST(ModelWeights, LlamaAttentionBiasBindsAllFourBiases) {
  TempDir dir;
  TinyModel model;
  model.attention_bias = true;
  model.dtype = "BF16";
  WeightsLoaded loaded = load(dir, model, test::tiny_model_tensors(model));
  ASSERT_TRUE(loaded.files);
  Result<ModelWeights> weights = bind_weights(loaded.config, *loaded.files);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  const LayerWeights& layer = weights->layers[0];
  EXPECT_EQ(layer.q_bias, loaded.files->find("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_EQ(layer.k_bias, loaded.files->find("model.layers.0.self_attn.k_proj.bias"));
  EXPECT_EQ(layer.v_bias, loaded.files->find("model.layers.0.self_attn.v_proj.bias"));
  EXPECT_EQ(layer.o_bias, loaded.files->find("model.layers.0.self_attn.o_proj.bias"));
  ASSERT_NE(layer.o_bias, nullptr);
  EXPECT_EQ(layer.q->dtype, TensorDType::kBf16);

  EXPECT_TRUE(contains(refusal(model, without(test::tiny_model_tensors(model),
                                              "model.layers.1.self_attn.o_proj.bias")),
                       "model.layers.1.self_attn.o_proj.bias: missing"));
}

TEST(ModelWeights, Qwen2HasQkvBiasesAndTiesTheHead) {
  TinyModel model;
  model.architecture = "Qwen2ForCausalLM";
  model.tied = true;
  std::vector<TensorSpec> tensors = test::tiny_model_tensors(model);
  // A tied checkpoint that still stores lm_head.weight: transformers reads the embedding.
  tensors.push_back(
      {"lm_head.weight",
       "F32",
       {model.vocab, model.hidden},
       test::f32_bytes(test::random_floats(std::size_t{model.vocab} * model.hidden, 9))});
  TempDir dir;
  WeightsLoaded loaded = load(dir, model, tensors);
  ASSERT_TRUE(loaded.files);
  Result<ModelWeights> weights = bind_weights(loaded.config, *loaded.files);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  EXPECT_EQ(weights->lm_head, weights->embed);
  const LayerWeights& layer = weights->layers[1];
  EXPECT_EQ(layer.q_bias, loaded.files->find("model.layers.1.self_attn.q_proj.bias"));
  EXPECT_EQ(layer.k_bias->shape, std::vector<std::uint64_t>{32});
  EXPECT_NE(layer.v_bias, nullptr);
  EXPECT_EQ(layer.o_bias, nullptr);

  EXPECT_TRUE(contains(refusal(model, without(test::tiny_model_tensors(model),
                                              "model.layers.0.self_attn.k_proj.bias")),
                       "model.layers.0.self_attn.k_proj.bias: missing"));
}

TEST(ModelWeights, MissingTensorsAreNamed) {
  TinyModel model;
  const std::vector<TensorSpec> tensors = test::tiny_model_tensors(model);
  for (const char* name :
       {"model.embed_tokens.weight", "model.layers.1.self_attn.k_proj.weight",
        "model.layers.0.mlp.down_proj.weight", "model.layers.1.post_attention_layernorm.weight",
        "model.norm.weight", "lm_head.weight"}) {
    const std::string message = refusal(model, without(tensors, name));
    EXPECT_TRUE(contains(message, std::string(name) + ": missing from the checkpoint")) << message;
  }
}

TEST(ModelWeights, WrongShapesNameBothShapes) {
  TinyModel model;
  std::vector<TensorSpec> tensors = test::tiny_model_tensors(model);
  TensorSpec& k = tensor(tensors, "model.layers.1.self_attn.k_proj.weight");
  k.shape = {64, 64};  // as many rows as q: the config says 2 KV heads of 16
  k.bytes = test::f32_bytes(test::random_floats(64 * 64, 5));
  EXPECT_TRUE(contains(refusal(model, tensors),
                       "model.layers.1.self_attn.k_proj.weight: shape [64, 64] but the config "
                       "needs [32, 64]"));

  tensors = test::tiny_model_tensors(model);
  TensorSpec& embed = tensor(tensors, "model.embed_tokens.weight");
  embed.shape = {64, 96};  // transposed
  EXPECT_TRUE(contains(refusal(model, tensors),
                       "model.embed_tokens.weight: shape [64, 96] but the config needs [96, 64]"));

  tensors = test::tiny_model_tensors(model);
  TensorSpec& norm = tensor(tensors, "model.norm.weight");
  norm.shape = {1, 64};
  EXPECT_TRUE(contains(refusal(model, tensors),
                       "model.norm.weight: shape [1, 64] but the config needs [64]"));
}

TEST(ModelWeights, OnlyFloatDtypesAreUsable) {
  TinyModel model;
  std::vector<TensorSpec> tensors = test::tiny_model_tensors(model);
  tensor(tensors, "model.layers.0.mlp.up_proj.weight").dtype = "I32";  // same size as F32
  std::string message = refusal(model, tensors);
  EXPECT_TRUE(contains(message, "model.layers.0.mlp.up_proj.weight: dtype I32")) << message;

  tensors = test::tiny_model_tensors(model);
  TensorSpec& gate = tensor(tensors, "model.layers.0.mlp.gate_proj.weight");
  gate.dtype = "F8_E4M3";
  gate.bytes.resize(gate.bytes.size() / 4);
  message = refusal(model, tensors);
  EXPECT_TRUE(contains(message, "model.layers.0.mlp.gate_proj.weight: dtype F8_E4M3")) << message;
  EXPECT_TRUE(contains(message, "BF16, F16 or F32")) << message;

  // F16 is one the runtime computes with.
  tensors = test::tiny_model_tensors(model);
  TensorSpec& up = tensor(tensors, "model.layers.0.mlp.up_proj.weight");
  up.dtype = "F16";
  up.bytes.resize(up.bytes.size() / 2);
  TempDir dir;
  WeightsLoaded loaded = load(dir, model, tensors);
  ASSERT_TRUE(loaded.files);
  Result<ModelWeights> weights = bind_weights(loaded.config, *loaded.files);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  EXPECT_EQ(weights->layers[0].up->dtype, TensorDType::kF16);
}

TEST(ModelWeights, ShardedCheckpointBinds) {
  TinyModel model;
  const std::vector<TensorSpec> tensors = test::tiny_model_tensors(model);
  TempDir dir;
  test::write_json_file(dir / "config.json", test::tiny_config_json(model));
  // Layer 0 and the embedding in one shard, the rest in the other.
  std::vector<TensorSpec> first;
  std::vector<TensorSpec> second;
  nlohmann::json weight_map = nlohmann::json::object();
  for (const TensorSpec& spec : tensors) {
    const bool early = spec.name.starts_with("model.layers.0.") || spec.name.starts_with("model.e");
    (early ? first : second).push_back(spec);
    weight_map[spec.name] = early ? "a.safetensors" : "b.safetensors";
  }
  test::write_safetensors(dir / "a.safetensors", first);
  test::write_safetensors(dir / "b.safetensors", second);
  test::write_json_file(dir / "model.safetensors.index.json", {{"weight_map", weight_map}});
  Result<ModelConfig> config = load_model_config(dir.path().string());
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  Result<std::unique_ptr<WeightFiles>> files = WeightFiles::open_dir(dir.path().string());
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  EXPECT_EQ((*files)->names().size(), tensors.size());
  Result<ModelWeights> weights = bind_weights(*config, **files);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  EXPECT_EQ(weights->layers.size(), 2u);
}

}  // namespace
}  // namespace kvvm::model
