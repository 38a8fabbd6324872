// The step checks both backends share (src/model/step_checks.h): run through each model's
// forward (the CUDA one where a device is present), a refusal names the value, the field and
// the limit with the backend's prefix, and writes nothing.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kvvm/model/model.h"
#include "support/tiny_model.h"

namespace kvvm::model {
namespace {

class ModelStepChecksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tiny_ = std::make_unique<testing::TinyModel>(testing::tiny_config(), TensorDType::kF32, 5);
    auto cpu = make_cpu_model(tiny_->config(), tiny_->weights(), {{128, 4}, 1, {}});
    ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
    models_.push_back({std::move(cpu).value(), "forward: "});
    ModelConfig config = tiny_->config();
    config.head_dim = 64;  // what the CUDA kernels take; the checks run before any weight
    config.heads = 1;
    config.kv_heads = 1;
    const testing::TinyModel wide(config, TensorDType::kBf16, 5);
    auto cuda = make_cuda_model(config, wide.weights(), {{128, 4}, nullptr, DType::kUnset, {}});
    if (cuda.ok()) models_.push_back({std::move(cuda).value(), "CUDA model: "});
  }

  void expect_refused(const StepBatch& batch, const StepOutput& out, const std::string& needle) {
    for (auto& [model, prefix] : models_) {
      const Status status = model->forward(batch, out);
      EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
      EXPECT_NE(status.message().find(prefix + needle), std::string::npos) << status.message();
    }
  }

  std::unique_ptr<testing::TinyModel> tiny_;
  std::vector<std::pair<std::unique_ptr<Model>, std::string>> models_;
};

TEST_F(ModelStepChecksTest, SampledTokensNeedOneSamplingEntryPerChunk) {
  const std::vector<std::int32_t> ids = {1, 2};
  const std::vector<Chunk> chunks = {{0, 0, 1}, {1, 0, 1}};
  const std::vector<ChunkSampling> one(1);
  std::int32_t sampled[2] = {-7, -7};
  expect_refused({ids, chunks, KvView{}, one}, {nullptr, nullptr, sampled},
                 "sampled tokens asked for but the batch has 1 sampling entries for 2 chunks");
  expect_refused({ids, chunks, KvView{}, {}}, {nullptr, nullptr, sampled},
                 "sampled tokens asked for but the batch has 0 sampling entries for 2 chunks");
  EXPECT_EQ(sampled[0], -7);
  EXPECT_EQ(sampled[1], -7);
}

TEST_F(ModelStepChecksTest, SamplingParametersAreChecked) {
  const std::vector<std::int32_t> ids = {1, 2};
  const std::vector<Chunk> chunks = {{0, 0, 1}, {1, 0, 1}};
  std::vector<ChunkSampling> sampling(2);
  std::int32_t sampled[2] = {};
  sampling[1].params.temperature = -1;
  expect_refused({ids, chunks, KvView{}, sampling}, {nullptr, nullptr, sampled},
                 "sampling[1]: temperature -1");
  sampling[1].params.temperature = 1;
  sampling[0].params.top_p = 0;
  expect_refused({ids, chunks, KvView{}, sampling}, {nullptr, nullptr, sampled},
                 "sampling[0]: top_p 0");
}

TEST_F(ModelStepChecksTest, BatchBeyondTheLimitsOrTheVocabulary) {
  expect_refused(
      {std::vector<std::int32_t>(5, 1), std::vector<Chunk>(5, Chunk{0, 0, 1}), KvView{}, {}}, {},
      "5 chunks, above max_chunks 4");
  expect_refused({std::vector<std::int32_t>{1, 97}, std::vector<Chunk>{{0, 0, 2}}, KvView{}, {}},
                 {}, "token_ids[1] = 97 is outside the vocabulary of 97");
  expect_refused({std::vector<std::int32_t>{1}, std::vector<Chunk>{{0, 511, 2}}, KvView{}, {}}, {},
                 "chunk 0 reaches position 512, beyond max_position_embeddings 512");
}

}  // namespace
}  // namespace kvvm::model
