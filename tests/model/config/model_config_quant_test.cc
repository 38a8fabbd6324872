// ModelConfig's quantization_config: Hugging Face's block FP8 ("fp8") and compressed-tensors'
// FP8-dynamic parsed into WeightQuant, and every other scheme, and every field that would make
// the checkpoint compute differently from what this runtime implements, refused by name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "kvvm/model/config.h"
#include "support/model_config_json.h"

namespace kvvm::model {
namespace {

using namespace test::model_config;  // llama(), parse(), refusal(), contains()

// What transformers 5's FineGrainedFP8Config writes.
nlohmann::json hf_fp8() {
  return {{"quant_method", "fp8"},
          {"activation_scheme", "dynamic"},
          {"weight_block_size", {128, 128}},
          {"dequantize", false},
          {"scale_fmt", "float"},
          {"modules_to_not_convert", {"lm_head"}}};
}

// What llm-compressor's FP8_DYNAMIC scheme writes.
nlohmann::json fp8_dynamic() {
  const nlohmann::json weights = {{"num_bits", 8},
                                  {"type", "float"},
                                  {"strategy", "channel"},
                                  {"symmetric", true},
                                  {"dynamic", false},
                                  {"group_size", nullptr},
                                  {"block_structure", nullptr},
                                  {"actorder", nullptr},
                                  {"observer", "minmax"}};
  const nlohmann::json inputs = {{"num_bits", 8},      {"type", "float"}, {"strategy", "token"},
                                 {"symmetric", true},  {"dynamic", true}, {"group_size", nullptr},
                                 {"observer", nullptr}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"quantization_status", "compressed"},
          {"global_compression_ratio", nullptr},
          {"kv_cache_scheme", nullptr},
          {"sparsity_config", nlohmann::json::object()},
          {"transform_config", nullptr},
          {"version", "0.12.2"},
          {"ignore", {"lm_head"}},
          {"config_groups",
           {{"group_0",
             {{"weights", weights},
              {"input_activations", inputs},
              {"output_activations", nullptr},
              {"targets", {"Linear"}},
              {"format", "float-quantized"}}}}}};
}

nlohmann::json with(nlohmann::json quantization) {
  nlohmann::json json = llama();  // 4 layers
  json["quantization_config"] = std::move(quantization);
  return json;
}

// Refused, the message naming `field` (as it appears in the message) and `value`.
void expect_refused(const nlohmann::json& quantization, const std::string& field,
                    const std::string& value) {
  const std::string message = refusal(with(quantization));
  EXPECT_TRUE(contains(message, "'quantization_config." + field + "'")) << message;
  EXPECT_TRUE(contains(message, value)) << message;
}

TEST(ModelConfigQuant, NamesOfTheFormats) {
  EXPECT_EQ(to_string(WeightQuant::kNone), "none");
  EXPECT_EQ(to_string(WeightQuant::kFp8Block), "fp8-block128");
  EXPECT_EQ(to_string(WeightQuant::kFp8Channel), "fp8-channel");
}

TEST(ModelConfigQuant, NoQuantizationConfigIsUnquantized) {
  Result<ModelConfig> config = parse(llama());
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->weight_quant, WeightQuant::kNone);
  nlohmann::json json = llama();
  json["quantization_config"] = nullptr;
  config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->weight_quant, WeightQuant::kNone);
}

TEST(ModelConfigQuant, HuggingFaceBlockFp8) {
  Result<ModelConfig> config = parse(with(hf_fp8()));
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->weight_quant, WeightQuant::kFp8Block);
  EXPECT_EQ(config->dtype, DType::kBf16);  // the unquantized tensors'

  // transformers' defaults stand for absent fields; the scheme's name in any case.
  config = parse(with({{"quant_method", "fp8"}}));
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->weight_quant, WeightQuant::kFp8Block);
  nlohmann::json q = hf_fp8();
  q["activation_scheme"] = "Dynamic";
  q["modules_to_not_convert"] = {"lm_head", "model.embed_tokens", "model.norm",
                                 "model.layers.4.mlp.down_proj"};  // no layer 4
  q.erase("scale_fmt");
  config = parse(with(q));
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->weight_quant, WeightQuant::kFp8Block);
  // Expressions naming no projection: of layers the model does not have, of other modules; a
  // star over a long pattern stays cheap (no backtracking).
  q["modules_to_not_convert"] = {
      "model.layers.1[0-9].self_attn", "model\\.layers\\.\\d+\\.mlp\\.gate$", "^lm_head$",
      ".*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*x", "[^m]odel.layers.0.mlp"};
  config = parse(with(q));
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->weight_quant, WeightQuant::kFp8Block);

  // A multimodal wrapper's text_config may hold it.
  nlohmann::json wrapped = {{"architectures", {"LlamaForCausalLM"}},
                            {"text_config", llama()},
                            {"quantization_config", hf_fp8()}};
  config = parse(wrapped);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->weight_quant, WeightQuant::kFp8Block);
}

TEST(ModelConfigQuant, CompressedTensorsFp8Dynamic) {
  Result<ModelConfig> config = parse(with(fp8_dynamic()));
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->weight_quant, WeightQuant::kFp8Channel);

  nlohmann::json q = fp8_dynamic();
  // Exact names and start-anchored expressions that reach no projection; a parent module's
  // exact name leaves its children quantized.
  q["ignore"] = {"lm_head", "re:.*embed_tokens$", "model.layers.0.self_attn"};
  q.erase("format");
  q.erase("sparsity_config");
  q["config_groups"]["group_0"]["weights"].erase("dynamic");
  config = parse(with(q));
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->weight_quant, WeightQuant::kFp8Channel);
}

TEST(ModelConfigQuant, OtherMethodsAreRefused) {
  expect_refused({{"quant_method", "gptq"}, {"bits", 4}}, "quant_method", "\"gptq\"");
  expect_refused({{"quant_method", "fbgemm_fp8"}}, "quant_method", "\"fbgemm_fp8\"");
  expect_refused({{"activation_scheme", "dynamic"}}, "quant_method", "is missing");
  const std::string message = refusal(with("fp8"));
  EXPECT_TRUE(contains(message, "'quantization_config'")) << message;
}

TEST(ModelConfigQuant, BlockFp8FieldsAreChecked) {
  nlohmann::json q = hf_fp8();
  q["weight_block_size"] = {64, 64};
  expect_refused(q, "weight_block_size", "[64,64]");
  q["weight_block_size"] = {128, 64};
  expect_refused(q, "weight_block_size", "[128,64]");
  q["weight_block_size"] = nullptr;  // one scale per matrix
  expect_refused(q, "weight_block_size", "null");

  q = hf_fp8();
  q["activation_scheme"] = "static";
  expect_refused(q, "activation_scheme", "\"static\"");
  q["activation_scheme"] = "per-tensor";
  expect_refused(q, "activation_scheme", "\"per-tensor\"");

  q = hf_fp8();
  q["scale_fmt"] = "ue8m0";
  expect_refused(q, "scale_fmt", "\"ue8m0\"");
}

TEST(ModelConfigQuant, ListsLeavingAProjectionUnquantizedAreRefused) {
  nlohmann::json q = hf_fp8();
  q["modules_to_not_convert"] = {"lm_head", "model.layers.3.mlp.down_proj"};
  expect_refused(q, "modules_to_not_convert[1]", "model.layers.3.mlp.down_proj unquantized");
  // transformers' rules: the name ending with the entry, or the entry matching at its start.
  q["modules_to_not_convert"] = {"o_proj"};
  expect_refused(q, "modules_to_not_convert[0]", "model.layers.0.self_attn.o_proj unquantized");
  q["modules_to_not_convert"] = {"model.layers.2"};
  expect_refused(q, "modules_to_not_convert[0]", "model.layers.2.self_attn.q_proj unquantized");
  q["modules_to_not_convert"] = {".*mlp"};
  expect_refused(q, "modules_to_not_convert[0]", "model.layers.0.mlp.gate_proj unquantized");
  q["modules_to_not_convert"] = {"model\\.layers\\.[0-9]+\\.mlp\\.down_proj$"};
  expect_refused(q, "modules_to_not_convert[0]", "model.layers.0.mlp.down_proj unquantized");
  q["modules_to_not_convert"] = {"model.layers.[^0].self_attn.v_pr?oj"};
  expect_refused(q, "modules_to_not_convert[0]", "model.layers.1.self_attn.v_proj unquantized");
  q["modules_to_not_convert"] = {"\\w+\\.\\w+\\.3\\.mlp.up"};
  expect_refused(q, "modules_to_not_convert[0]", "model.layers.3.mlp.up_proj unquantized");
  // Patterns this runtime matches without backtracking; others are refused, not guessed at.
  q["modules_to_not_convert"] = {"(unclosed"};
  expect_refused(q, "modules_to_not_convert[0]", "its '('");
  q["modules_to_not_convert"] = {".*mlp\\.(gate|up)_proj"};
  expect_refused(q, "modules_to_not_convert[0]", "regular expression this runtime reads");
  q["modules_to_not_convert"] = {"[0-9"};
  expect_refused(q, "modules_to_not_convert[0]", "not closed");
  q["modules_to_not_convert"] = nlohmann::json::array();
  for (int i = 0; i < 5000; ++i) q["modules_to_not_convert"].push_back("lm_head");
  expect_refused(q, "modules_to_not_convert", "at most 4096");
  q["modules_to_not_convert"] = {std::string(300, 'a')};
  expect_refused(q, "modules_to_not_convert[0]", "at most 256 characters");
  q["modules_to_not_convert"] = "lm_head";
  expect_refused(q, "modules_to_not_convert", "a list of at most");
  q = hf_fp8();
  q["ignored_layers"] = {"model.layers.1.self_attn.k_proj"};  // an alias transformers reads
  expect_refused(q, "ignored_layers[0]", "model.layers.1.self_attn.k_proj unquantized");

  // compressed-tensors' rules: exact names, "re:" expressions, class names.
  q = fp8_dynamic();
  q["ignore"] = {"lm_head", "model.layers.1.mlp.up_proj"};
  expect_refused(q, "ignore[1]", "model.layers.1.mlp.up_proj unquantized");
  q["ignore"] = {"re:.*self_attn.*"};
  expect_refused(q, "ignore[0]", "model.layers.0.self_attn.q_proj unquantized");
  q["ignore"] = {"Linear"};
  expect_refused(q, "ignore[0]", "every Linear module unquantized");
}

TEST(ModelConfigQuant, ChannelFp8FieldsAreChecked) {
  const auto edited = [](const char* side, const char* field, const nlohmann::json& value) {
    nlohmann::json q = fp8_dynamic();
    q["config_groups"]["group_0"][side][field] = value;
    return q;
  };
  expect_refused(edited("weights", "strategy", "tensor"), "config_groups.group_0.weights.strategy",
                 "\"tensor\"");
  expect_refused(edited("weights", "strategy", "block"), "config_groups.group_0.weights.strategy",
                 "\"block\"");
  expect_refused(edited("weights", "num_bits", 4), "config_groups.group_0.weights.num_bits", "4");
  expect_refused(edited("weights", "type", "int"), "config_groups.group_0.weights.type", "\"int\"");
  expect_refused(edited("weights", "symmetric", false), "config_groups.group_0.weights.symmetric",
                 "false");
  expect_refused(edited("weights", "group_size", 128), "config_groups.group_0.weights.group_size",
                 "128");
  expect_refused(edited("input_activations", "strategy", "tensor"),
                 "config_groups.group_0.input_activations.strategy", "\"tensor\"");
  expect_refused(edited("input_activations", "num_bits", 16),
                 "config_groups.group_0.input_activations.num_bits", "16");
  // Static input scales: the checkpoint's input_scale tensors would be ignored.
  const nlohmann::json static_inputs = edited("input_activations", "dynamic", false);
  expect_refused(static_inputs, "config_groups.group_0.input_activations.dynamic", "false");
  EXPECT_TRUE(contains(refusal(with(static_inputs)), "static input scales"));

  nlohmann::json q = fp8_dynamic();
  q["config_groups"]["group_0"]["input_activations"] = nullptr;  // weight-only
  expect_refused(q, "config_groups.group_0.input_activations", "is missing");
  q = fp8_dynamic();
  q["config_groups"]["group_0"]["output_activations"] = q["config_groups"]["group_0"]["weights"];
  expect_refused(q, "config_groups.group_0.output_activations", "' is {");
  q = fp8_dynamic();
  q["format"] = "pack-quantized";
  expect_refused(q, "format", "\"pack-quantized\"");
  q = fp8_dynamic();
  q["quantization_status"] = "frozen";
  expect_refused(q, "quantization_status", "\"frozen\"");
  q = fp8_dynamic();
  q["config_groups"] = nlohmann::json::object();
  expect_refused(q, "config_groups", "{}");
  q.erase("config_groups");
  expect_refused(q, "config_groups", "is missing");
  q = fp8_dynamic();
  q["sparsity_config"] = {{"format", "sparse-24-bitmask"}};
  expect_refused(q, "sparsity_config.format", "\"sparse-24-bitmask\"");
  q = fp8_dynamic();
  q["transform_config"] = {{"config_groups", nlohmann::json::object()}};
  expect_refused(q, "transform_config", "null");
}

}  // namespace
}  // namespace kvvm::model
