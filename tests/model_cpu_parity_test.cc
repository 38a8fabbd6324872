// The parity oracle on the CPU path (docs/ARCHITECTURE.md, "Proof: the parity oracle"): every
// checkpoint of tests/data/models (made by scripts/make_fixtures.py with Hugging Face transformers)
// loaded through the config parser, the safetensors reader and the weight binder, run by the CPU
// model with a float32 cache, and compared with what transformers computed:
//   - last-position logits of each "logits" prompt, max |ours - theirs| / max |theirs|:
//     within 1e-4 of `last_fp32` (the checkpoint's weights computed in float32 on CPU, what
//     this path computes, for bf16 checkpoints too); and of `last` (computed in the
//     checkpoint's dtype) within 1e-4 for float32 checkpoints, 1e-2 for bfloat16 ones, whose
//     reference ran in bfloat16 on the GPU, rounding every activation to 8 bits (measured:
//     at most 4.5e-3; float32 checkpoints and `last_fp32` at most 7e-7);
//   - greedy continuations (32 tokens, the prompt prefilled in one chunk, then one decode
//     step per token, fed the reference's token so every step is compared): equal wherever
//     the reference's top-2 margin exceeds what the tolerance allows of the logits
//     (2 x tolerance x max |logit|); a differing step under that margin is reported, not failed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "base/json_reader.h"
#include "kvvm/model/model.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "model/cpu_ops.h"
#include "support/fixture_model.h"
#include "support/reference_transformer.h"
#include "support/test_data.h"
#include "support/tiny_model.h"

namespace kvvm {
namespace {

using model::Chunk;

constexpr double kFp32Tolerance = 1e-4;
constexpr double kBf16Tolerance = 1e-2;

const std::vector<std::string>& fixture_names() {
  static const std::vector<std::string> names = {"llama-tiny", "llama-tiny-bf16", "qwen2-tiny",
                                                 "qwen2-tiny-bf16"};
  return names;
}

using test::token_ids;

class ModelCpuParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto loaded = test::load_fixture_model(GetParam());
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    config_ = loaded->config;
    files_ = std::move(loaded->files);
    expected_ = std::move(loaded->expected);
    const model::ModelWeights* weights = &loaded->weights;
    tolerance_ = expected_.at("dtype") == "float32" ? kFp32Tolerance : kBf16Tolerance;
    const std::size_t longest = loaded->longest, context = loaded->context;
    model::CpuModelOptions options;
    options.limits = {.max_step_tokens = static_cast<std::uint32_t>(longest), .max_chunks = 1};
    auto made = model::make_cpu_model(config_, *weights, options);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    model_ = std::move(made).value();
    kv_ = testing::ModelKv::make(config_, Layout::kTokenMajor, DType::kFp32, context, 1);
    ASSERT_TRUE(kv_ != nullptr);
  }

  // Prefills `prompt` into a fresh sequence able to grow to `tokens`; the logits of its last
  // position.
  std::vector<float> prefill(const std::vector<std::int32_t>& prompt, std::size_t tokens) {
    auto slot = kv_->arena().admit(tokens);
    EXPECT_TRUE(slot.ok()) << slot.status().to_string();
    slot_ = slot.ok() ? *slot : 0;
    return run(prompt, 0);
  }
  std::vector<float> run(const std::vector<std::int32_t>& ids, std::uint32_t start) {
    std::vector<float> logits(config_.vocab_size, NAN);
    const Chunk chunk{slot_, start, static_cast<std::uint32_t>(ids.size())};
    const Status status =
        model_->forward({ids, std::span<const Chunk>(&chunk, 1), kv_->arena().view(), {}},
                        {logits.data(), nullptr, nullptr});
    EXPECT_TRUE(status.ok()) << status.to_string();
    return logits;
  }
  void finish() { EXPECT_TRUE(kv_->arena().release(slot_).ok()); }

  void compare_greedy(std::vector<std::int32_t> tokens, const std::vector<std::int32_t>& want,
                      const std::vector<double>& margins, double tolerance, const char* what) {
    ASSERT_EQ(margins.size(), want.size());
    std::vector<float> logits = prefill(tokens, tokens.size() + want.size());
    std::size_t differing = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const std::int32_t got = model::cpu::argmax(logits.data(), logits.size());
      float scale = 0;
      for (float value : logits) scale = std::max(scale, std::fabs(value));
      const double allowed = 2 * tolerance * scale;
      if (got != want[i]) {
        ++differing;
        EXPECT_LE(margins[i], allowed)
            << what << " step " << i << ": token " << got << " where transformers chose " << want[i]
            << " with a margin of " << margins[i];
        std::printf("[ parity   ] %s %s: step %zu differs (%d vs %d) at margin %.3g <= %.3g\n",
                    GetParam().c_str(), what, i, got, want[i], margins[i], allowed);
      }
      // Fed the reference's token, so a near-tie does not end the comparison.
      tokens.push_back(want[i]);
      if (i + 1 < want.size()) {
        logits = run({want[i]}, static_cast<std::uint32_t>(tokens.size() - 1));
      }
    }
    finish();
    std::printf("[ parity   ] %s %s: prompt of %zu tokens, %zu of %zu greedy tokens differ\n",
                GetParam().c_str(), what, tokens.size() - want.size(), differing, want.size());
  }

  model::ModelConfig config_;
  std::unique_ptr<model::WeightFiles> files_;
  nlohmann::json expected_;
  double tolerance_ = 0;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<testing::ModelKv> kv_;
  std::uint32_t slot_ = 0;
};

TEST_P(ModelCpuParityTest, LastPositionLogitsMatchTransformers) {
  ASSERT_FALSE(expected_.at("logits").empty());
  for (const auto& entry : expected_.at("logits")) {
    const std::vector<std::int32_t> prompt = token_ids(entry.at("prompt_ids"));
    const std::vector<float> logits = prefill(prompt, prompt.size());
    finish();
    struct Reference {
      const char* key;
      double tolerance;
    };
    for (const Reference& ref :
         {Reference{"last_fp32", kFp32Tolerance}, Reference{"last", tolerance_}}) {
      if (!entry.contains(ref.key)) continue;
      const auto last = entry.at(ref.key).get<std::vector<double>>();
      ASSERT_EQ(last.size(), config_.vocab_size);
      const double diff = testing::max_relative_difference(logits, last);
      EXPECT_LE(diff, ref.tolerance) << ref.key << ", prompt of " << prompt.size() << " tokens";
      std::printf("[ parity   ] %s %s: prompt of %zu tokens, logits differ by %.3g relative\n",
                  GetParam().c_str(), ref.key, prompt.size(), diff);
    }
  }
}

TEST_P(ModelCpuParityTest, GreedyTokensMatchWhereTheMarginAllows) {
  ASSERT_FALSE(expected_.at("greedy").empty());
  for (const auto& entry : expected_.at("greedy")) {
    const std::vector<std::int32_t> prompt = token_ids(entry.at("prompt_ids"));
    if (entry.contains("tokens_fp32")) {
      compare_greedy(prompt, token_ids(entry.at("tokens_fp32")),
                     entry.at("margins_fp32").get<std::vector<double>>(), kFp32Tolerance, "fp32");
    }
    compare_greedy(prompt, token_ids(entry.at("tokens")),
                   entry.at("margins").get<std::vector<double>>(), tolerance_,
                   expected_.at("dtype").get<std::string>().c_str());
  }
}

// Every checkpoint under tests/data/models is one this suite runs.
TEST(ModelCpuParityFixtures, EveryFixtureIsCovered) {
  const std::filesystem::path models = test::data_dir() / "models";
  ASSERT_TRUE(std::filesystem::exists(models)) << models << " (scripts/make_fixtures.py)";
  std::size_t seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(models)) {
    if (!entry.is_directory()) continue;
    ++seen;
    const std::string name = entry.path().filename().string();
    EXPECT_NE(std::find(fixture_names().begin(), fixture_names().end(), name),
              fixture_names().end())
        << name << " is not in this suite's list";
  }
  EXPECT_EQ(seen, fixture_names().size());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelCpuParityTest, ::testing::ValuesIn(fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           std::erase(name, '-');
                           return name;
                         });

}  // namespace
}  // namespace kvvm
