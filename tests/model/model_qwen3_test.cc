// Qwen3 dense (Qwen3ForCausalLM) without the transformers-made fixtures: its config.json read
// (head_dim apart from hidden / heads, no biases unless attention_bias, q/k norms, tied or not),
// the q_norm / k_norm tensors bound, checked and placed, and the CPU forward pass against the
// float64 reference, which normalises every q and k head before RoPE as transformers does.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kvvm/model/config.h"
#include "kvvm/model/kv_config.h"
#include "kvvm/model/weight_memory.h"
#include "kvvm/model/weights.h"
#include "model/weights/weight_layout.h"
#include "support/model_config_json.h"
#include "support/model_rig.h"
#include "support/safetensors_writer.h"
#include "support/test_data.h"

namespace kvvm::model_qwen3_test {
namespace {

using model::ModelConfig;
using model::TensorDType;
using test::contains;

std::string file_text(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The Qwen3 form of the config tests' small Llama: 8 heads of 64 over hidden 256.
nlohmann::json qwen3_json() {
  nlohmann::json json = test::model_config::llama();
  json["architectures"] = {"Qwen3ForCausalLM"};
  json["model_type"] = "qwen3";
  json["head_dim"] = 64;
  json["rms_norm_eps"] = 1e-6;
  return json;
}

TEST(Qwen3Config, TheHalfBillionModelHasThePublishedNumbers) {
  const auto path = test::data_dir() / "config_qwen3-0.6b.json";
  Result<ModelConfig> config = model::parse_model_config(file_text(path), path.string());
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(config->hidden_size, 1024u);
  EXPECT_EQ(config->intermediate_size, 3072u);
  EXPECT_EQ(config->layers, 28u);
  EXPECT_EQ(config->heads, 16u);
  EXPECT_EQ(config->kv_heads, 8u);
  EXPECT_EQ(config->head_dim, 128u) << "explicit, not hidden_size / heads = 64";
  EXPECT_EQ(config->vocab_size, 151936u);
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(config->rope.theta, 1e6);
  EXPECT_EQ(config->rope.scaling, model::RopeScaling::kNone);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_TRUE(config->qk_norm);
  EXPECT_FALSE(config->qkv_bias);
  EXPECT_FALSE(config->o_bias);
  EXPECT_EQ(config->max_position_embeddings, 40960u);
  EXPECT_EQ(config->dtype, DType::kBf16);
  EXPECT_EQ(config->bos_token_ids, std::vector<std::int32_t>{151643});
  EXPECT_EQ(config->eos_token_ids, std::vector<std::int32_t>{151645});
  const Geometry geometry = config->kv_geometry(DType::kFp16);
  EXPECT_EQ(geometry.layers, 28u);
  EXPECT_EQ(geometry.kv_heads, 8u);
  EXPECT_EQ(geometry.head_dim, 128u);
  // kvvm plan reads the same shape from the file, and the built-in model agrees.
  Result<ModelConfig> shape = model::load_kv_config(path.string());
  ASSERT_TRUE(shape.ok()) << shape.status().to_string();
  EXPECT_EQ(shape->head_dim, 128u);
  Result<ModelConfig> builtin = model::builtin_model_config("qwen3-0.6b");
  ASSERT_TRUE(builtin.ok()) << builtin.status().to_string();
  EXPECT_EQ(model::weight_sizes(*builtin, DType::kBf16).total(),
            model::weight_sizes(*config, DType::kBf16).total());
  EXPECT_TRUE(builtin->qk_norm);
  EXPECT_FALSE(builtin->qkv_bias);
  EXPECT_EQ(builtin->max_position_embeddings, 40960u);
}

TEST(Qwen3Config, TransformersV5FormUntiedWithAttentionBias) {
  nlohmann::json json = qwen3_json();
  json.erase("torch_dtype");
  json.erase("rope_theta");
  json["dtype"] = "bfloat16";
  json["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  json["layer_types"] = {"full_attention", "full_attention", "full_attention", "full_attention"};
  json["sliding_window"] = nullptr;
  json["use_sliding_window"] = false;
  json["tie_word_embeddings"] = false;
  Result<ModelConfig> config = test::model_config::parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->head_dim, 64u);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_FALSE(config->qkv_bias) << "attention_bias defaults to false";
  EXPECT_TRUE(config->qk_norm);
  EXPECT_DOUBLE_EQ(config->rope.theta, 1e6);

  // Qwen3's attention_bias puts a bias on all four projections, as Llama's does.
  json["attention_bias"] = true;
  config = test::model_config::parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_TRUE(config->qkv_bias);
  EXPECT_TRUE(config->o_bias);
  EXPECT_TRUE(config->qk_norm);
}

TEST(Qwen3Config, WithoutHeadDimTheHeadsAre128AsTransformersBuildsThem) {
  nlohmann::json json = qwen3_json();
  json.erase("head_dim");  // hidden_size / heads would be 32
  Result<ModelConfig> config = test::model_config::parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->head_dim, 128u);
  json["head_dim"] = nullptr;
  EXPECT_EQ(test::model_config::parse(json)->head_dim, 128u);
}

TEST(Qwen3Config, ModelTypeAloneNamesTheFamilyAndOthersLackTheNorms) {
  nlohmann::json json = qwen3_json();
  json.erase("architectures");
  Result<ModelConfig> config = test::model_config::parse(json);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(config->qk_norm);

  json["architectures"] = {"Qwen3ForCausalLM"};
  json["model_type"] = "qwen2";
  EXPECT_TRUE(contains(test::model_config::refusal(json), "'model_type' is \"qwen2\""));

  for (const char* family : {"llama", "qwen2", "mistral"}) {
    nlohmann::json other = qwen3_json();
    other.erase("architectures");
    other["model_type"] = family;
    Result<ModelConfig> parsed = test::model_config::parse(other);
    ASSERT_TRUE(parsed.ok()) << family << ": " << parsed.status().to_string();
    EXPECT_FALSE(parsed->qk_norm) << family;
  }
}

TEST(Qwen3Config, SlidingWindowAttentionIsRefusedByName) {
  nlohmann::json json = qwen3_json();
  json["sliding_window"] = 1024;
  json["use_sliding_window"] = false;  // written, not used
  EXPECT_TRUE(test::model_config::parse(json).ok());
  json["use_sliding_window"] = true;
  EXPECT_TRUE(contains(test::model_config::refusal(json), "'use_sliding_window' is true"));
  json["use_sliding_window"] = false;
  json["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "full_attention"};
  EXPECT_TRUE(
      contains(test::model_config::refusal(json), "'layer_types[1]' is \"sliding_attention\""));
}

// ---- weights ---------------------------------------------------------------------------------

// A checkpoint of 4 heads of 32 over hidden 64 (q is 128 wide), untied unless asked.
test::TinyModel qwen3_checkpoint() {
  test::TinyModel model;
  model.architecture = "Qwen3ForCausalLM";
  model.head_dim = 32;
  return model;
}

struct Bound {
  ModelConfig config;
  std::unique_ptr<model::WeightFiles> files;
  Result<model::ModelWeights> weights = Status::Internal("not bound");
};

// `model`'s config and `tensors` written to a fresh directory, read back and bound.
Bound bind_checkpoint(const test::TinyModel& model, const std::vector<test::TensorSpec>& tensors) {
  test::TempDir dir;
  test::write_json_file(dir / "config.json", test::tiny_config_json(model));
  test::write_safetensors(dir / "model.safetensors", tensors);
  Bound out;
  Result<ModelConfig> config = model::load_model_config(dir.path().string());
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  Result<std::unique_ptr<model::WeightFiles>> files =
      model::WeightFiles::open_dir(dir.path().string());
  EXPECT_TRUE(files.ok()) << files.status().to_string();
  if (!config.ok() || !files.ok()) return out;
  out.config = *config;
  out.files = std::move(files).value();
  out.weights = model::bind_weights(out.config, *out.files);
  return out;
}

TEST(Qwen3Weights, TheHeadNormsAreBoundWithTheirShape) {
  const test::TinyModel model = qwen3_checkpoint();
  Bound bound = bind_checkpoint(model, test::tiny_model_tensors(model));
  ASSERT_TRUE(bound.weights.ok()) << bound.weights.status().to_string();
  EXPECT_TRUE(bound.config.qk_norm);
  EXPECT_EQ(bound.config.head_dim, 32u);
  for (std::uint32_t i = 0; i < 2; ++i) {
    const model::LayerWeights& layer = bound.weights->layers[i];
    const std::string attn = "model.layers." + std::to_string(i) + ".self_attn.";
    EXPECT_EQ(layer.q_norm, bound.files->find(attn + "q_norm.weight"));
    EXPECT_EQ(layer.k_norm, bound.files->find(attn + "k_norm.weight"));
    ASSERT_NE(layer.q_norm, nullptr);
    EXPECT_EQ(layer.q_norm->shape, std::vector<std::uint64_t>{32});
    EXPECT_EQ(layer.q->shape, (std::vector<std::uint64_t>{128, 64}));
    EXPECT_EQ(layer.o->shape, (std::vector<std::uint64_t>{64, 128}));
    EXPECT_EQ(layer.q_bias, nullptr);
    EXPECT_EQ(layer.o_bias, nullptr);
  }
  EXPECT_NE(bound.weights->lm_head, bound.weights->embed);
}

TEST(Qwen3Weights, AMissingOrMisshapedHeadNormIsNamed) {
  const test::TinyModel model = qwen3_checkpoint();
  std::vector<test::TensorSpec> tensors = test::tiny_model_tensors(model);
  std::vector<test::TensorSpec> missing = tensors;
  std::erase_if(missing, [](const test::TensorSpec& t) {
    return t.name == "model.layers.1.self_attn.q_norm.weight";
  });
  Bound bound = bind_checkpoint(model, missing);
  ASSERT_FALSE(bound.weights.ok());
  EXPECT_TRUE(contains(bound.weights.status().message(),
                       "model.layers.1.self_attn.q_norm.weight: missing from the checkpoint"))
      << bound.weights.status().message();

  for (test::TensorSpec& t : tensors) {
    if (t.name == "model.layers.0.self_attn.k_norm.weight") {
      t.shape = {64};  // hidden_size, not head_dim
      t.bytes = test::f32_bytes(test::random_floats(64, 4));
    }
  }
  bound = bind_checkpoint(model, tensors);
  ASSERT_FALSE(bound.weights.ok());
  EXPECT_TRUE(contains(bound.weights.status().message(),
                       "model.layers.0.self_attn.k_norm.weight: shape [64] but the config "
                       "needs [32]"))
      << bound.weights.status().message();
}

TEST(Qwen3Weights, TiedCheckpointReadsTheEmbeddingAsTheHead) {
  test::TinyModel model = qwen3_checkpoint();
  model.tied = true;
  model.dtype = "BF16";
  Bound bound = bind_checkpoint(model, test::tiny_model_tensors(model));
  ASSERT_TRUE(bound.weights.ok()) << bound.weights.status().to_string();
  EXPECT_TRUE(bound.config.tie_word_embeddings);
  EXPECT_EQ(bound.weights->lm_head, bound.weights->embed);
  EXPECT_EQ(bound.weights->layers[0].k_norm->dtype, TensorDType::kBf16);
}

ModelConfig qwen3_config() {
  ModelConfig c = testing::tiny_config();  // hidden 64, 4 heads over 2 KV heads
  c.architecture = "Qwen3ForCausalLM";
  c.qk_norm = true;
  c.head_dim = 32;  // q is 128 wide over hidden 64
  c.rms_norm_eps = 1e-6;
  c.rope.theta = 1000000.0;
  return c;
}

TEST(Qwen3Weights, TheLayoutPlacesTheNormsBesideTheOtherSmallTensors) {
  const ModelConfig c = qwen3_config();
  ModelConfig plain = c;
  plain.qk_norm = false;
  for (const DType element : {DType::kBf16, DType::kFp32}) {
    const model::detail::WeightLayout layout = model::detail::weight_layout(c, element);
    const std::uint64_t size = element_bytes(element);
    for (const model::detail::LayerBaseOffsets& layer : layout.layers) {
      ASSERT_NE(layer.q_norm, model::detail::kNoTensor);
      ASSERT_NE(layer.k_norm, model::detail::kNoTensor);
      EXPECT_GE(layer.k_norm, layer.q_norm + c.head_dim * size);
      EXPECT_LE(layer.k_norm + c.head_dim * size, layout.sizes.base_bytes);
      EXPECT_EQ(layer.q_norm % model::kWeightAlignment, 0u);
    }
    // q, k and v stay one run: the fused projection reads them as one matrix.
    const std::uint64_t q_dim = 128, kv_dim = 64, hidden = 64;
    EXPECT_EQ(layout.block.k, layout.block.q + q_dim * hidden * size);
    EXPECT_EQ(layout.block.v, layout.block.k + kv_dim * hidden * size);
    // Counted in the weights' bytes: two aligned [head_dim] tensors per layer, in the base
    // region, none in a layer block (streamed layers need not carry them).
    const model::WeightSizes with = model::weight_sizes(c, element);
    const model::WeightSizes without = model::weight_sizes(plain, element);
    const std::uint64_t norm_bytes = (c.head_dim * size + model::kWeightAlignment - 1) /
                                     model::kWeightAlignment * model::kWeightAlignment;
    EXPECT_EQ(with.base_bytes, without.base_bytes + c.layers * 2 * norm_bytes);
    EXPECT_EQ(with.layer_bytes, without.layer_bytes);
    EXPECT_EQ(model::detail::weight_layout(plain, element).layers[0].q_norm,
              model::detail::kNoTensor);
  }
}

Status make(const ModelConfig& config, const model::ModelWeights& weights) {
  model::CpuModelOptions options;
  options.limits = {.max_step_tokens = 8, .max_chunks = 1};
  options.threads = 1;
  auto made = model::make_cpu_model(config, weights, options);
  return made.ok() ? Status::Ok() : made.status();
}

TEST(Qwen3Weights, TheCpuModelRefusesANormTheConfigLacksAndOneItMisses) {
  testing::TinyModel qwen3(qwen3_config(), TensorDType::kF32, 1);
  EXPECT_TRUE(make(qwen3.config(), qwen3.weights()).ok());
  ModelConfig plain = qwen3_config();
  plain.qk_norm = false;
  const Status stray = make(plain, qwen3.weights());
  EXPECT_TRUE(contains(stray.message(), "model.layers.0.self_attn.q_norm.weight is given"))
      << stray.to_string();
  qwen3.mutable_weights().layers[1].k_norm = nullptr;
  const Status missing = make(qwen3.config(), qwen3.weights());
  EXPECT_TRUE(contains(missing.message(), "model.layers.1.self_attn.k_norm.weight is missing"))
      << missing.to_string();
}

TEST(Qwen3Weights, TheDummyFormatDrawsNormsOfOne) {
  const ModelConfig c = qwen3_config();
  model::CpuModelOptions options;
  options.limits = {.max_step_tokens = 8, .max_chunks = 1};
  options.threads = 1;
  options.weights.format = model::LoadFormat::kDummy;
  auto made = model::make_cpu_model(c, model::ModelWeights{}, options);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  EXPECT_EQ((*made)->weight_stats().split.sizes.base_bytes,
            model::weight_sizes(c, DType::kFp32).base_bytes);
}

// ---- the CPU forward pass ---------------------------------------------------------------------

// Prefill, a second chunk and decode tokens of two sequences packed in each step.
void run_two_sequences(testing::ModelRig& rig) {
  testing::Sequence a = rig.admit(120, 31), b = rig.admit(40, 32);
  rig.step({&a}, {90});
  rig.step({&b, &a}, {30, 20});
  for (int i = 0; i < 5; ++i) rig.step({&a, &b}, {1, 1});
}

TEST(Qwen3Cpu, HeadNormsBeforeRopeMatchTheReference) {
  testing::ModelRig rig(qwen3_config(), TensorDType::kF32, Layout::kTokenMajor);
  ASSERT_TRUE(rig.ready());
  run_two_sequences(rig);
}

TEST(Qwen3Cpu, TiedHeadAndOneKvHeadOnEveryLayout) {
  ModelConfig c = qwen3_config();
  c.tie_word_embeddings = true;
  c.kv_heads = 1;
  for (Layout layout : all_layouts()) {
    SCOPED_TRACE(std::string(to_string(layout)));
    testing::ModelRig rig(c, TensorDType::kF32, layout);
    ASSERT_TRUE(rig.ready());
    run_two_sequences(rig);
  }
}

TEST(Qwen3Cpu, AttentionBiasAndBf16WeightsMatchTheReference) {
  ModelConfig c = qwen3_config();
  c.qkv_bias = true;
  c.o_bias = true;
  testing::ModelRig rig(c, TensorDType::kBf16, Layout::kHeadMajor);
  ASSERT_TRUE(rig.ready());
  run_two_sequences(rig);
}

// The norms change the outputs: the same weights without them give other logits, so the
// agreement above is not one the norms could be missing from.
TEST(Qwen3Cpu, TheNormsAreNotANoOp) {
  const ModelConfig c = qwen3_config();
  testing::TinyModel tiny(c, TensorDType::kF32, 7);
  ModelConfig plain = c;
  plain.qk_norm = false;
  model::ModelWeights weights = tiny.weights();
  for (model::LayerWeights& layer : weights.layers) layer.q_norm = layer.k_norm = nullptr;
  const std::vector<std::int32_t> tokens = testing::random_tokens(12, c.vocab_size, 3);
  const auto with = testing::ReferenceTransformer(c, tiny.weights()).logits(tokens);
  const auto without = testing::ReferenceTransformer(plain, weights).logits(tokens);
  const std::vector<float> last(with.back().begin(), with.back().end());
  EXPECT_GT(testing::max_relative_difference(last, without.back()), 1e-2);
}

}  // namespace
}  // namespace kvvm::model_qwen3_test
