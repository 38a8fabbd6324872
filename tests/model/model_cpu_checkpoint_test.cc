// The CPU model on a checkpoint read from disk: a tiny random model written as a Hugging Face
// directory (config.json in transformers v5's form, model.safetensors in F32 or BF16), loaded
// through load_model_config, WeightFiles::open_dir and bind_weights, and run against the
// float64 reference of the same weights. Proves the loader and the forward agree on names,
// layouts and RoPE settings without the transformers-made fixtures.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kvvm/model/safetensors.h"
#include "support/model_rig.h"

namespace kvvm {
namespace {

namespace fs = std::filesystem;
using model::ModelConfig;
using model::TensorDType;
using model::TensorView;

// Writes every tensor of `weights` (deduplicated: a tied lm_head is the embedding) as one
// safetensors file.
void write_safetensors(const model::ModelWeights& weights, const fs::path& path) {
  std::vector<const TensorView*> tensors = {weights.embed, weights.final_norm};
  if (weights.lm_head != weights.embed) tensors.push_back(weights.lm_head);
  for (const model::LayerWeights& l : weights.layers) {
    for (const TensorView* t : {l.input_norm, l.q, l.k, l.v, l.q_bias, l.k_bias, l.v_bias, l.o,
                                l.o_bias, l.q_norm, l.k_norm, l.post_norm, l.gate, l.up, l.down}) {
      if (t != nullptr) tensors.push_back(t);
    }
  }
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  std::uint64_t offset = 0;
  for (const TensorView* t : tensors) {
    header +=
        ",\"" + t->name + "\":{\"dtype\":\"" + std::string(to_string(t->dtype)) + "\",\"shape\":[";
    for (std::size_t i = 0; i < t->shape.size(); ++i) {
      header += (i > 0 ? "," : "") + std::to_string(t->shape[i]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + t->bytes) + "]}";
    offset += t->bytes;
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  std::ofstream out(path, std::ios::binary);
  const std::uint64_t length = header.size();  // little-endian on every host CI runs
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << header;
  for (const TensorView* t : tensors) {
    out.write(reinterpret_cast<const char*>(t->data), static_cast<std::streamsize>(t->bytes));
  }
}

std::string config_json(const ModelConfig& c, const char* dtype) {
  const bool qwen = c.architecture == "Qwen2ForCausalLM";
  const bool qwen3 = c.architecture == "Qwen3ForCausalLM";
  std::string rope =
      "{\"rope_type\":\"default\",\"rope_theta\":" + std::to_string(c.rope.theta) + "}";
  if (c.rope.scaling == model::RopeScaling::kLlama3) {
    rope = "{\"rope_type\":\"llama3\",\"rope_theta\":" + std::to_string(c.rope.theta) +
           ",\"factor\":" + std::to_string(c.rope.factor) +
           ",\"low_freq_factor\":" + std::to_string(c.rope.low_freq_factor) +
           ",\"high_freq_factor\":" + std::to_string(c.rope.high_freq_factor) +
           ",\"original_max_position_embeddings\":" + std::to_string(c.rope.original_max_position) +
           "}";
  }
  return std::string("{\"architectures\":[\"") + c.architecture + "\"],\"model_type\":\"" +
         (qwen ? "qwen2" : (qwen3 ? "qwen3" : "llama")) +
         "\",\"hidden_size\":" + std::to_string(c.hidden_size) +
         ",\"intermediate_size\":" + std::to_string(c.intermediate_size) +
         ",\"num_hidden_layers\":" + std::to_string(c.layers) +
         ",\"num_attention_heads\":" + std::to_string(c.heads) +
         ",\"num_key_value_heads\":" + std::to_string(c.kv_heads) +
         ",\"head_dim\":" + std::to_string(c.head_dim) +
         ",\"vocab_size\":" + std::to_string(c.vocab_size) +
         ",\"max_position_embeddings\":" + std::to_string(c.max_position_embeddings) +
         ",\"rms_norm_eps\":1e-05,\"hidden_act\":\"silu\",\"tie_word_embeddings\":" +
         (c.tie_word_embeddings ? "true" : "false") + (qwen ? "" : ",\"attention_bias\":false") +
         ",\"dtype\":\"" + dtype + "\",\"rope_parameters\":" + rope + "}";
}

class ModelCpuCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvvm_model_cpu_checkpoint_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `tiny` to disk, loads it back and runs a prompt and a few decode steps.
  void round_trip(const ModelConfig& config, TensorDType dtype, const char* dtype_name) {
    testing::TinyModel tiny(config, dtype, 21);
    write_safetensors(tiny.weights(), dir_ / "model.safetensors");
    std::ofstream(dir_ / "config.json") << config_json(config, dtype_name);

    auto loaded = model::load_model_config(dir_.string());
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    EXPECT_EQ(loaded->rope.scaling, config.rope.scaling);
    EXPECT_EQ(loaded->qkv_bias, config.qkv_bias);
    EXPECT_EQ(loaded->qk_norm, config.qk_norm);
    EXPECT_EQ(loaded->head_dim, config.head_dim);
    auto files = model::WeightFiles::open_dir(dir_.string());
    ASSERT_TRUE(files.ok()) << files.status().to_string();
    auto weights = model::bind_weights(*loaded, **files);
    ASSERT_TRUE(weights.ok()) << weights.status().to_string();

    testing::ReferenceTransformer reference(config, tiny.weights());
    const std::vector<std::int32_t> tokens = testing::random_tokens(40, config.vocab_size, 5);
    const auto expected = reference.logits(tokens);
    model::CpuModelOptions options;
    options.limits = {.max_step_tokens = 64, .max_chunks = 2};
    auto made = model::make_cpu_model(*loaded, *weights, options);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    auto kv = testing::ModelKv::make(*loaded, Layout::kTokenMajor, DType::kFp32, 64, 1);
    ASSERT_TRUE(kv);
    auto slot = kv->arena().admit(tokens.size());
    ASSERT_TRUE(slot.ok());
    std::vector<float> logits(config.vocab_size);
    std::uint32_t written = 0;
    for (std::uint32_t count : {32u, 1u, 1u, 6u}) {
      const model::Chunk chunk{*slot, written, count};
      const std::span<const std::int32_t> ids(tokens.data() + written, count);
      ASSERT_TRUE(
          (*made)
              ->forward({ids, std::span<const model::Chunk>(&chunk, 1), kv->arena().view(), {}},
                        {logits.data(), nullptr, nullptr})
              .ok());
      written += count;
      EXPECT_LE(testing::max_relative_difference(logits, expected[written - 1]),
                testing::kTolerance)
          << "position " << written - 1;
    }
  }

  fs::path dir_;
};

TEST_F(ModelCpuCheckpointTest, LlamaWithLlama3RopeInF32) {
  ModelConfig c = testing::tiny_config();
  c.rope.scaling = model::RopeScaling::kLlama3;
  c.rope.factor = 8;
  c.rope.low_freq_factor = 1;
  c.rope.high_freq_factor = 4;
  c.rope.original_max_position = 32;
  round_trip(c, TensorDType::kF32, "float32");
}

TEST_F(ModelCpuCheckpointTest, Qwen2WithBiasesAndTiedHeadInBf16) {
  ModelConfig c = testing::tiny_config();
  c.architecture = "Qwen2ForCausalLM";
  c.qkv_bias = true;
  c.tie_word_embeddings = true;
  c.rope.theta = 1000000;
  round_trip(c, TensorDType::kBf16, "bfloat16");
}

TEST_F(ModelCpuCheckpointTest, Qwen3WithHeadNormsAndWideHeadsInBf16) {
  ModelConfig c = testing::tiny_config();
  c.architecture = "Qwen3ForCausalLM";
  c.qk_norm = true;
  c.head_dim = 32;  // q is 128 wide over hidden 64
  c.rope.theta = 1000000;
  round_trip(c, TensorDType::kBf16, "bfloat16");
}

}  // namespace
}  // namespace kvvm
