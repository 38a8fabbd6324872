// ModelConfig: a Hugging Face config.json read field by field: the published Qwen2.5-0.5B
// numbers, defaults, generation_config.json's ids, and every unsupported or malformed field
// refused with the file, the field and the value named (RoPE: model_config_rope_test.cc).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "kvvm/model/config.h"
#include "support/model_config_json.h"
#include "support/safetensors_writer.h"
#include "support/test_data.h"

namespace kvvm::model {
namespace {

using test::TempDir;
using namespace test::model_config;  // llama(), parse(), refusal(), contains()

std::string read_file(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

TEST(ModelConfig, Qwen25HalfBillionHasThePublishedNumbers) {
  const auto path = test::data_dir() / "config_qwen2.5-0.5b.json";
  Result<ModelConfig> config = parse_model_config(read_file(path), path.string());
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(config->hidden_size, 896u);
  EXPECT_EQ(config->intermediate_size, 4864u);
  EXPECT_EQ(config->layers, 24u);
  EXPECT_EQ(config->heads, 14u);
  EXPECT_EQ(config->kv_heads, 2u);
  EXPECT_EQ(config->head_dim, 64u);
  EXPECT_EQ(config->vocab_size, 151936u);
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(config->rope.theta, 1e6);
  EXPECT_EQ(config->rope.scaling, RopeScaling::kNone);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_TRUE(config->qkv_bias);  // Qwen2: q/k/v biases without any attention_bias field
  EXPECT_FALSE(config->o_bias);
  EXPECT_EQ(config->max_position_embeddings, 32768u);
  EXPECT_EQ(config->dtype, DType::kBf16);
  EXPECT_EQ(config->bos_token_ids, std::vector<std::int32_t>{151643});
  EXPECT_EQ(config->eos_token_ids, std::vector<std::int32_t>{151643});
  const Geometry geometry = config->kv_geometry(DType::kFp16);
  EXPECT_EQ(geometry.layers, 24u);
  EXPECT_EQ(geometry.kv_heads, 2u);
  EXPECT_EQ(geometry.head_dim, 64u);
}

TEST(ModelConfig, DefaultsWhenOptionalFieldsAreAbsentOrNull) {
  nlohmann::json json = llama();
  json.erase("num_key_value_heads");
  json["head_dim"] = nullptr;
  json.erase("rms_norm_eps");
  json.erase("rope_theta");
  Result<ModelConfig> config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->kv_heads, 8u);   // every head its own K and V
  EXPECT_EQ(config->head_dim, 32u);  // 256 / 8
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(config->rope.theta, 10000.0);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_FALSE(config->qkv_bias);
  EXPECT_FALSE(config->o_bias);
}

TEST(ModelConfig, ExplicitHeadDimWins) {
  nlohmann::json json = llama();
  json["head_dim"] = 64;  // not 256 / 8
  Result<ModelConfig> config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->head_dim, 64u);
}

TEST(ModelConfig, AttentionBiasMeansAllFourOnLlamaAndQkvAlwaysOnQwen2) {
  nlohmann::json json = llama();
  json["attention_bias"] = true;
  Result<ModelConfig> config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_TRUE(config->qkv_bias);
  EXPECT_TRUE(config->o_bias);

  json["architectures"] = {"Qwen2ForCausalLM"};
  json["model_type"] = "qwen2";
  json["attention_bias"] = false;
  config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_TRUE(config->qkv_bias);
  EXPECT_FALSE(config->o_bias);

  json["attention_bias"] = "yes";
  EXPECT_TRUE(contains(refusal(json), "'attention_bias' is \"yes\""));
}

TEST(ModelConfig, ArchitectureMustBeOneOfTheFamilies) {
  nlohmann::json json = llama();
  json["architectures"] = {"GemmaForCausalLM"};
  const std::string message = refusal(json);
  EXPECT_TRUE(contains(message, "\"GemmaForCausalLM\"")) << message;
  EXPECT_TRUE(contains(message, "architectures[0]")) << message;

  json["architectures"] = {"MistralForCausalLM"};
  json["model_type"] = "llama";  // inconsistent with the class
  EXPECT_TRUE(contains(refusal(json), "'model_type' is \"llama\""));

  json["architectures"] = "LlamaForCausalLM";  // not a list
  EXPECT_TRUE(contains(refusal(json), "'architectures'"));

  // Without architectures the model type names the family.
  json.erase("architectures");
  json["model_type"] = "mistral";
  Result<ModelConfig> config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->architecture, "MistralForCausalLM");
  json["model_type"] = "qwen3";
  config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->architecture, "Qwen3ForCausalLM");
  json["model_type"] = "gemma";
  EXPECT_TRUE(contains(refusal(json), "\"gemma\""));
}

TEST(ModelConfig, LanguageFieldsUnderTextConfigAreRead) {
  nlohmann::json inner = llama();
  inner.erase("architectures");
  const nlohmann::json json = {{"architectures", {"LlamaForCausalLM"}},
                               {"vision_config", {{"num_hidden_layers", 27}}},
                               {"text_config", inner}};
  Result<ModelConfig> config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->layers, 4u);
  EXPECT_EQ(config->hidden_size, 256u);
  EXPECT_EQ(config->eos_token_ids, std::vector<std::int32_t>{2});

  // The committed multimodal example is not one of the families: refused by its model type.
  const auto path = test::data_dir() / "config_text_config.json";
  Result<ModelConfig> example = parse_model_config(read_file(path), path.string());
  ASSERT_FALSE(example.ok());
  EXPECT_TRUE(contains(example.status().message(), "\"example_vl\"")) << example.status().message();
}

TEST(ModelConfig, HeadCountsAreChecked) {
  nlohmann::json json = llama();
  json["num_attention_heads"] = 0;
  std::string message = refusal(json);
  EXPECT_TRUE(contains(message, "'num_attention_heads' is 0")) << message;
  EXPECT_TRUE(contains(message, "[1, 4096]")) << message;

  json = llama();
  json["num_attention_heads"] = -8;
  EXPECT_TRUE(contains(refusal(json), "'num_attention_heads' is -8"));

  json = llama();
  json["num_key_value_heads"] = 3;  // 8 query heads in groups of 3?
  message = refusal(json);
  EXPECT_TRUE(contains(message,
                       "'num_attention_heads' 8 is not a multiple of "
                       "'num_key_value_heads' 3"))
      << message;

  json = llama();
  json["head_dim"] = 33;  // RoPE rotates pairs
  message = refusal(json);
  EXPECT_TRUE(contains(message, "33")) << message;
  EXPECT_TRUE(contains(message, "even")) << message;

  json = llama();
  json["head_dim"] = 8192;
  EXPECT_TRUE(contains(refusal(json), "'head_dim' is 8192"));

  json = llama();
  json["hidden_size"] = 250;  // no head_dim and 250 / 8 is not whole
  EXPECT_TRUE(contains(refusal(json), "'hidden_size' 250 is not a multiple"));

  json = llama();
  json["num_attention_heads"] = 5000;
  EXPECT_TRUE(contains(refusal(json), "'num_attention_heads' is 5000"));
}

TEST(ModelConfig, SizesAreBoundedAndTyped) {
  struct Case {
    const char* field;
    nlohmann::json value;
    const char* expected;
  };
  for (const Case& bad : {
           Case{"hidden_size", 0, "'hidden_size' is 0"},
           Case{"hidden_size", (1u << 20) + 1, "'hidden_size' is 1048577"},
           Case{"hidden_size", "896", "'hidden_size' is \"896\""},
           Case{"hidden_size", 256.5, "'hidden_size' is 256.5"},
           Case{"num_hidden_layers", 1025, "'num_hidden_layers' is 1025"},
           Case{"num_hidden_layers", 18446744073709551615ull, "'num_hidden_layers' is 1844"},
           Case{"vocab_size", (1u << 22) + 1, "'vocab_size' is 4194305"},
           Case{"intermediate_size", (1u << 22) + 1, "'intermediate_size' is 4194305"},
           Case{"intermediate_size", nlohmann::json::array(), "'intermediate_size' is []"},
           Case{"max_position_embeddings", 0, "'max_position_embeddings' is 0"},
           Case{"rms_norm_eps", 0, "'rms_norm_eps' is 0"},
           Case{"rms_norm_eps", "1e-6", "'rms_norm_eps' is \"1e-6\""},
           Case{"tie_word_embeddings", 1, "'tie_word_embeddings' is 1"},
           Case{"torch_dtype", "float8", "'torch_dtype' is \"float8\""},
           Case{"torch_dtype", "int8", "'torch_dtype' is \"int8\""},
           Case{"torch_dtype", 16, "'torch_dtype' is 16"},
       }) {
    nlohmann::json json = llama();
    json[bad.field] = bad.value;
    const std::string message = refusal(json);
    EXPECT_TRUE(contains(message, bad.expected)) << bad.field << ": " << message;
  }
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "vocab_size", "max_position_embeddings"}) {
    nlohmann::json json = llama();
    json.erase(field);
    const std::string message = refusal(json);
    EXPECT_TRUE(contains(message, std::string("'") + field + "' is missing")) << message;
  }
}

TEST(ModelConfig, DtypeFromTorchDtypeOrDtype) {
  nlohmann::json json = llama();
  json.erase("torch_dtype");
  json["dtype"] = "float16";  // transformers v5 spelling of the field
  Result<ModelConfig> config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->dtype, DType::kFp16);
  json["dtype"] = "float32";
  config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->dtype, DType::kFp32);
}

TEST(ModelConfig, FeaturesThatChangeOutputsAreRefused) {
  nlohmann::json json = llama();
  json["mlp_bias"] = true;
  EXPECT_TRUE(contains(refusal(json), "'mlp_bias' is true"));
  json["mlp_bias"] = false;
  EXPECT_TRUE(parse(json).ok());

  json["hidden_act"] = "gelu";
  EXPECT_TRUE(contains(refusal(json), "'hidden_act' is \"gelu\""));
}

TEST(ModelConfig, SlidingWindowIsRefusedUnlessItCoversTheContext) {
  nlohmann::json json = llama();
  json["architectures"] = {"MistralForCausalLM"};
  json["model_type"] = "mistral";
  json["sliding_window"] = 1024;  // max_position_embeddings 4096
  const std::string message = refusal(json);
  EXPECT_TRUE(contains(message, "'sliding_window' is 1024")) << message;
  EXPECT_TRUE(contains(message, "4096")) << message;
  json["sliding_window"] = nullptr;
  EXPECT_TRUE(parse(json).ok());
  json["sliding_window"] = 4096;  // as long as the context: never drops a token
  EXPECT_TRUE(parse(json).ok());

  json = llama();
  json["architectures"] = {"Qwen2ForCausalLM"};
  json["model_type"] = "qwen2";
  json["sliding_window"] = 1024;
  json["use_sliding_window"] = false;  // Qwen2 writes a window it does not use
  EXPECT_TRUE(parse(json).ok());
  json["use_sliding_window"] = true;
  EXPECT_TRUE(contains(refusal(json), "'use_sliding_window' is true"));

  // transformers v5 names each layer's attention kind.
  json["use_sliding_window"] = false;
  json["layer_types"] = {"full_attention", "full_attention", "full_attention", "full_attention"};
  EXPECT_TRUE(parse(json).ok());
  json["layer_types"][2] = "sliding_attention";
  EXPECT_TRUE(contains(refusal(json), "'layer_types[2]' is \"sliding_attention\""));
}

TEST(ModelConfig, TokenIdsAreAnIdOrAList) {
  nlohmann::json json = llama();
  json["eos_token_id"] = {2, 7, 9};
  Result<ModelConfig> config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->eos_token_ids, (std::vector<std::int32_t>{2, 7, 9}));
  EXPECT_EQ(config->bos_token_ids, std::vector<std::int32_t>{1});

  json["eos_token_id"] = nullptr;
  json.erase("bos_token_id");
  config = parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_TRUE(config->eos_token_ids.empty());
  EXPECT_TRUE(config->bos_token_ids.empty());

  json["eos_token_id"] = 1000;  // vocab_size 1000
  EXPECT_TRUE(contains(refusal(json), "'eos_token_id' is 1000"));
  json["eos_token_id"] = {2, "3"};
  EXPECT_TRUE(contains(refusal(json), "'eos_token_id' is [2,\"3\"]"));
  json["eos_token_id"] = -1;
  EXPECT_TRUE(contains(refusal(json), "'eos_token_id' is -1"));
}

TEST(ModelConfig, BadJsonNamesTheOrigin) {
  Result<ModelConfig> config = parse_model_config("{\"hidden_size\": 8,", kOrigin);
  ASSERT_FALSE(config.ok());
  EXPECT_TRUE(contains(config.status().message(), kOrigin)) << config.status().message();
  EXPECT_TRUE(contains(config.status().message(), "not valid JSON")) << config.status().message();
  EXPECT_TRUE(contains(refusal(nlohmann::json::array({1, 2})), "not a JSON object"));
}

TEST(ModelConfig, LoadReadsGenerationConfigIdsOverConfigIds) {
  TempDir dir;
  test::write_json_file(dir / "config.json", llama());
  Result<ModelConfig> config = load_model_config(dir.path().string());
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->eos_token_ids, std::vector<std::int32_t>{2});

  test::write_json_file(dir / "generation_config.json",
                        {{"bos_token_id", 5}, {"eos_token_id", {2, 8}}, {"temperature", 0.6}});
  config = load_model_config(dir.path().string());
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->bos_token_ids, std::vector<std::int32_t>{5});
  EXPECT_EQ(config->eos_token_ids, (std::vector<std::int32_t>{2, 8}));

  // Only the ids it gives override.
  test::write_json_file(dir / "generation_config.json", {{"eos_token_id", 9}});
  config = load_model_config(dir.path().string());
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->bos_token_ids, std::vector<std::int32_t>{1});
  EXPECT_EQ(config->eos_token_ids, std::vector<std::int32_t>{9});

  test::write_json_file(dir / "generation_config.json", {{"eos_token_id", "end"}});
  config = load_model_config(dir.path().string());
  ASSERT_FALSE(config.ok());
  EXPECT_TRUE(contains(config.status().message(), "generation_config.json"))
      << config.status().message();
  EXPECT_TRUE(contains(config.status().message(), "'eos_token_id' is \"end\""))
      << config.status().message();
}

TEST(ModelConfig, LoadNamesTheMissingConfig) {
  TempDir dir;
  Result<ModelConfig> config = load_model_config(dir.path().string());
  ASSERT_FALSE(config.ok());
  EXPECT_TRUE(contains(config.status().message(), (dir / "config.json").string()))
      << config.status().message();

  test::write_text_file(dir / "config.json", "{\"architectures\": [");
  config = load_model_config(dir.path().string());
  ASSERT_FALSE(config.ok());
  EXPECT_TRUE(contains(config.status().message(), (dir / "config.json").string()))
      << config.status().message();
}

}  // namespace
}  // namespace kvvm::model
