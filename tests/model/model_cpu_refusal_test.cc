// What the CPU model refuses: batches beyond its limits or the model's (InvalidArgument naming
// the value, with neither the outputs nor the cache written), KV views of another shape, and
// weights or configs that do not match (the tensor and both shapes named). Plus the greedy
// token's tie rule.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "support/model_rig.h"

namespace kvvm {
namespace {

using model::Chunk;
using model::ModelConfig;
using model::TensorDType;
using testing::ModelRig;
using testing::TinyModel;

constexpr float kPoison = 12345.0f;

class ModelCpuRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rig_ =
        std::make_unique<ModelRig>(testing::tiny_config(), TensorDType::kF32, Layout::kTokenMajor);
    ASSERT_TRUE(rig_->ready());
    auto slot = rig_->arena().admit(16);
    ASSERT_TRUE(slot.ok());
    slot_ = *slot;
    // A sentinel where the first token's K would go: a refused step must leave it.
    sentinel_at_ = reinterpret_cast<float*>(rig_->arena().view().address(slot_, 0, 0, 0, 0));
    for (int i = 0; i < 16; ++i) sentinel_at_[i] = kPoison + static_cast<float>(i);
  }

  // Runs the batch, expects InvalidArgument mentioning `needle`, and nothing written.
  void expect_refused(const std::vector<std::int32_t>& ids, const std::vector<Chunk>& chunks,
                      const std::string& needle, const KvView* view = nullptr) {
    const std::uint32_t vocab = rig_->model().config().vocab_size;
    std::vector<float> logits(16 * vocab, kPoison);
    std::vector<std::int32_t> argmax(16, -7);
    const Status status =
        rig_->model().forward({ids, chunks, view != nullptr ? *view : rig_->arena().view(), {}},
                              {logits.data(), argmax.data(), nullptr});
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_NE(status.message().find(needle), std::string::npos) << status.message();
    for (float value : logits) ASSERT_EQ(value, kPoison);
    for (std::int32_t value : argmax) ASSERT_EQ(value, -7);
    for (int i = 0; i < 16; ++i) ASSERT_EQ(sentinel_at_[i], kPoison + static_cast<float>(i));
  }

  std::unique_ptr<ModelRig> rig_;
  std::uint32_t slot_ = 0;
  float* sentinel_at_ = nullptr;
};

TEST_F(ModelCpuRefusalTest, TooManyChunks) {
  std::vector<Chunk> chunks(9, Chunk{slot_, 0, 1});
  expect_refused(std::vector<std::int32_t>(9, 1), chunks, "9 chunks, above max_chunks 8");
}

TEST_F(ModelCpuRefusalTest, TooManyTokens) {
  expect_refused(std::vector<std::int32_t>(161, 1), {{slot_, 0, 161}},
                 "161 tokens, above max_step_tokens 160");
}

TEST_F(ModelCpuRefusalTest, TokenOutsideTheVocabulary) {
  expect_refused({1, 2, 97}, {{slot_, 0, 3}}, "token_ids[2] = 97 is outside the vocabulary of 97");
  expect_refused({-1, 2, 3}, {{slot_, 0, 3}}, "token_ids[0] = -1");
}

TEST_F(ModelCpuRefusalTest, ChunksThatDoNotSumToTheTokens) {
  expect_refused({1, 2, 3, 4}, {{slot_, 0, 3}}, "the chunks hold 3 tokens but token_ids has 4");
  expect_refused({1, 2}, {{slot_, 0, 3}}, "the chunks hold 3 tokens but token_ids has 2");
}

TEST_F(ModelCpuRefusalTest, EmptyChunk) {
  expect_refused({1, 2}, {{slot_, 0, 2}, {slot_, 2, 0}}, "chunk 1 has 0 tokens");
}

TEST_F(ModelCpuRefusalTest, PositionBeyondMaxPositionEmbeddings) {
  expect_refused({1, 2, 3}, {{slot_, 510, 3}},
                 "reaches position 512, beyond max_position_embeddings 512");
  // Near 2^32: the end must not wrap around.
  expect_refused({1, 2}, {{slot_, 0xffffffffu, 2}}, "beyond max_position_embeddings 512");
}

TEST_F(ModelCpuRefusalTest, KvViewOfAnotherShape) {
  KvView view = rig_->arena().view();
  view.head_dim = 32;
  expect_refused({1}, {{slot_, 0, 1}}, "head_dim 32 is not the model's 16", &view);
  view = rig_->arena().view();
  view.element = DType::kUnset;
  view.element_bytes = 0;
  expect_refused({1}, {{slot_, 0, 1}}, "element type unset", &view);
  view = rig_->arena().view();
  view.element_bytes = 2;  // says 2 bytes of an fp32 element
  expect_refused({1}, {{slot_, 0, 1}}, "(2 bytes)", &view);
  view = rig_->arena().view();
  view.base = 0;
  expect_refused({1}, {{slot_, 0, 1}}, "no base address", &view);
}

TEST_F(ModelCpuRefusalTest, KvViewOfFewerLayersOrHeads) {
  for (const Geometry& geometry : {Geometry{"one layer", 1, 2, 16, DType::kFp32},
                                   Geometry{"one head", 2, 1, 16, DType::kFp32}}) {
    for (Layout layout : all_layouts()) {
      auto plan = plan_layout(geometry, layout, 4096, 256);
      ASSERT_TRUE(plan.ok()) << plan.status().to_string();
      std::vector<std::uint8_t> bytes(plan->slot_stride * 2);
      const KvView view = plan->view(reinterpret_cast<std::uintptr_t>(bytes.data()));
      SCOPED_TRACE(geometry.name + " " + std::string(to_string(layout)));
      expect_refused({1}, {{0, 0, 1}}, "its geometry is not the model's", &view);
    }
  }
}

TEST_F(ModelCpuRefusalTest, AnEmptyBatchRunsAndAValidOneAfterARefusalMatches) {
  EXPECT_TRUE(rig_->model().forward({{}, {}, KvView{}, {}}, {}).ok());
  testing::Sequence s = rig_->admit(20, 3);
  EXPECT_EQ(rig_->model()
                .forward({std::vector<std::int32_t>{1, 500},
                          std::vector<Chunk>{{s.slot, 0, 2}},
                          rig_->arena().view(),
                          {}},
                         {})
                .code(),
            StatusCode::kInvalidArgument);
  rig_->step({&s}, {20});
}

// ---- Weights and configs refused at make_cpu_model ----------------------------------------

Status make(const ModelConfig& config, const model::ModelWeights& weights) {
  return model::make_cpu_model(config, weights, {}).status();
}

TEST(ModelCpuWeights, AWrongShapeIsNamedWithBothShapes) {
  TinyModel tiny(testing::tiny_config(), TensorDType::kF32, 1);
  tiny.mutable_weights().layers[1].k =
      tiny.tensor("model.layers.1.self_attn.k_proj.weight", {64, 32}, 1, 0);
  const Status status = make(tiny.config(), tiny.weights());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("model.layers.1.self_attn.k_proj.weight has shape [64, 32], "
                                  "the config expects [32, 64]"),
            std::string::npos)
      << status.message();
}

TEST(ModelCpuWeights, AMissingTensorIsNamed) {
  TinyModel tiny(testing::tiny_config(), TensorDType::kF32, 1);
  tiny.mutable_weights().final_norm = nullptr;
  const Status status = make(tiny.config(), tiny.weights());
  EXPECT_NE(status.message().find("model.norm.weight is missing"), std::string::npos)
      << status.message();
  TinyModel untied(testing::tiny_config(), TensorDType::kF32, 1);
  untied.mutable_weights().lm_head = nullptr;
  EXPECT_NE(make(untied.config(), untied.weights()).message().find("lm_head.weight is missing"),
            std::string::npos);
}

TEST(ModelCpuWeights, ABiasTheConfigLacksIsRefused) {
  TinyModel tiny(testing::tiny_config(), TensorDType::kF32, 1);
  tiny.mutable_weights().layers[0].q_bias =
      tiny.tensor("model.layers.0.self_attn.q_proj.bias", {64}, 1, 0);
  EXPECT_NE(make(tiny.config(), tiny.weights()).message().find("q_proj.bias is given"),
            std::string::npos);
  ModelConfig with_bias = testing::tiny_config();
  with_bias.qkv_bias = true;
  TinyModel lacking(testing::tiny_config(), TensorDType::kF32, 1);
  EXPECT_NE(make(with_bias, lacking.weights()).message().find("q_proj.bias is missing"),
            std::string::npos);
}

TEST(ModelCpuWeights, AnUnreadableDtypeOrShortDataIsRefused) {
  TinyModel tiny(testing::tiny_config(), TensorDType::kF32, 1);
  model::TensorView odd = *tiny.weights().embed;
  odd.dtype = TensorDType::kI32;
  tiny.mutable_weights().embed = &odd;
  tiny.mutable_weights().lm_head = nullptr;
  ModelConfig tied = testing::tiny_config();
  tied.tie_word_embeddings = true;
  EXPECT_NE(make(tied, tiny.weights()).message().find("has dtype I32"), std::string::npos)
      << make(tied, tiny.weights()).message();
  odd.dtype = TensorDType::kF32;
  odd.bytes -= 4;
  EXPECT_NE(make(tied, tiny.weights()).message().find("its shape and dtype need"),
            std::string::npos);
}

TEST(ModelCpuWeights, ConfigsAndLimitsTheForwardCannotRunAreRefused) {
  TinyModel tiny(testing::tiny_config(), TensorDType::kF32, 1);
  ModelConfig c = testing::tiny_config();
  c.heads = 3;
  EXPECT_NE(make(c, tiny.weights()).message().find("3 attention heads are not a multiple of 2"),
            std::string::npos);
  c = testing::tiny_config();
  c.max_position_embeddings = 0;
  EXPECT_NE(make(c, tiny.weights()).message().find("max_position_embeddings is 0"),
            std::string::npos);
  model::CpuModelOptions options;
  options.limits.max_chunks = 0;
  EXPECT_NE(model::make_cpu_model(testing::tiny_config(), tiny.weights(), options)
                .status()
                .message()
                .find("max_chunks is 0"),
            std::string::npos);
}

TEST(ModelCpuOps, ArgmaxTakesTheLowestIdAmongEquals) {
  const float values[] = {1, 3, 2, 3, NAN};
  EXPECT_EQ(model::cpu::argmax(values, 5), 1);
  const float nan_first[] = {NAN, -1, -1};
  EXPECT_EQ(model::cpu::argmax(nan_first, 3), 1);
}

}  // namespace
}  // namespace kvvm
