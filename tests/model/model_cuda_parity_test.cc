// The parity oracle on the CUDA path (docs/ARCHITECTURE.md, "Proof: the parity oracle"): every bf16
// checkpoint of tests/data/models (made by scripts/make_fixtures.py with Hugging Face transformers)
// loaded through the config parser, the safetensors reader and the weight binder, run by the CUDA
// model in bf16 with a bf16 cache in a CUDA-driver arena, and compared with what transformers
// computed in bf16:
//   - last-position logits of each "logits" prompt: max |ours - theirs| / max |theirs| within
//     2e-2 (both round every activation to bf16, in the same places; the sums' order differs);
//   - greedy continuations (the prompt prefilled in one chunk, then one decode step per token,
//     fed the reference's token so every step is compared): equal wherever the reference's
//     top-2 margin exceeds what the tolerance allows of the logits (2 x tolerance x
//     max |logit|); a differing step under that margin is reported with its margin, not failed.
// And the same with an fp8 (e4m3) cache at scale 1 (the fixtures carry no scales): measured on
// the H200 over 36 prompt runs (2 fixtures x 3 layouts), the logits differ from transformers'
// bf16 by mean 7.0e-3, max 1.51e-2 relative, and no greedy token differs; the tolerance is 3e-2.
// Skipped without a GPU, and until the fixtures are committed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "base/json_reader.h"
#include "kvvm/kv/layout.h"
#include "kvvm/model/model.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "kvvm/vmm/cuda_driver.h"
#include "support/attention_support.h"
#include "support/fixture_model.h"
#include "support/reference_transformer.h"
#include "support/test_data.h"

namespace kvvm::model_cuda_parity_test {
namespace {

using model::Chunk;

constexpr double kTolerance = 2e-2;
constexpr double kFp8KvTolerance = 3e-2;
// FP8 weights: transformers' own FP8 model (qwen3-tiny-fp8, its activations quantized per
// group of 128 by its kernel) or the dequantized weights in bf16 (qwen3-tiny-fp8-channel),
// against kvvm's FP8 GEMV (prefill rows above 16: activations quantized, cuBLASLt's FP8 GEMM).
constexpr double kFp8WeightTolerance = 5e-2;

bool fp8_weights(const std::string& fixture) { return fixture.find("-fp8") != std::string::npos; }

// The mixtures' bf16 fixtures with the CUDA attention's head dims: mixtral-tiny and
// qwen2-moe-tiny have heads of 32, which only the CPU backend takes (their parity runs there).
const std::vector<std::string>& bf16_fixtures() {
  static const std::vector<std::string> names = {"llama-tiny-bf16", "qwen2-tiny-bf16",
                                                 "qwen3-tiny-bf16", "qwen3-moe-tiny-bf16"};
  return names;
}

using test::token_ids;

std::int32_t argmax_of(const std::vector<float>& logits) {
  return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Every fixture on every layout: the model reaches K / V only through the KvView's strides.
class ModelCudaParityTest
    : public ::testing::TestWithParam<std::tuple<std::string, Layout, DType>> {
 protected:
  const std::string& fixture() const { return std::get<0>(GetParam()); }
  DType kv_dtype() const { return std::get<2>(GetParam()); }
  double tolerance() const {
    if (fp8_weights(fixture())) return kFp8WeightTolerance;
    return kv_dtype() == DType::kFp8 ? kFp8KvTolerance : kTolerance;
  }
  std::string name() const { return fixture() + (kv_dtype() == DType::kFp8 ? " (fp8 KV)" : ""); }

  void SetUp() override {
    auto driver = make_cuda_driver();
    if (!driver.ok()) GTEST_SKIP() << "no CUDA device: " << driver.status().to_string();
    driver_ = std::move(driver).value();
    auto loaded = test::load_fixture_model(fixture());
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    config_ = loaded->config;
    files_ = std::move(loaded->files);
    expected_ = std::move(loaded->expected);
    const model::ModelWeights* weights = &loaded->weights;
    ASSERT_EQ(expected_.at("dtype"), "bfloat16");
    const std::size_t longest = loaded->longest, context = loaded->context;
    model::CudaModelOptions options;
    options.limits = {.max_step_tokens = static_cast<std::uint32_t>(longest), .max_chunks = 1};
    options.compute = DType::kBf16;
    auto made = model::make_cuda_model(config_, *weights, options);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    model_ = std::move(made).value();
    kv_ = testing::KvArena::make(*driver_, config_.kv_geometry(kv_dtype()), std::get<1>(GetParam()),
                                 context, 1);
    ASSERT_TRUE(kv_ != nullptr);
  }

  // Prefills `prompt` into a fresh sequence able to grow to `tokens`; the logits of its last
  // position.
  std::vector<float> prefill(const std::vector<std::int32_t>& prompt, std::size_t tokens) {
    auto slot = kv_->arena->admit(tokens);
    EXPECT_TRUE(slot.ok()) << slot.status().to_string();
    slot_ = slot.ok() ? *slot : 0;
    return run(prompt, 0);
  }
  std::vector<float> run(const std::vector<std::int32_t>& ids, std::uint32_t start) {
    std::vector<float> logits(config_.vocab_size, NAN);
    const Chunk chunk{slot_, start, static_cast<std::uint32_t>(ids.size())};
    const Status status =
        model_->forward({ids, std::span<const Chunk>(&chunk, 1), kv_->arena->view(), {}},
                        {logits.data(), nullptr, nullptr});
    EXPECT_TRUE(status.ok()) << status.to_string();
    return logits;
  }
  void finish() { EXPECT_TRUE(kv_->arena->release(slot_).ok()); }

  std::unique_ptr<Driver> driver_;
  model::ModelConfig config_;
  std::unique_ptr<model::WeightFiles> files_;
  nlohmann::json expected_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<testing::KvArena> kv_;
  std::uint32_t slot_ = 0;
};

TEST_P(ModelCudaParityTest, LastPositionLogitsMatchTransformers) {
  ASSERT_FALSE(expected_.at("logits").empty());
  for (const auto& entry : expected_.at("logits")) {
    const std::vector<std::int32_t> prompt = token_ids(entry.at("prompt_ids"));
    const std::vector<float> logits = prefill(prompt, prompt.size());
    finish();
    const auto last = entry.at("last").get<std::vector<double>>();
    ASSERT_EQ(last.size(), config_.vocab_size);
    const double diff = testing::max_relative_difference(logits, last);
    EXPECT_LE(diff, tolerance()) << "prompt of " << prompt.size() << " tokens";
    std::printf("[ parity   ] cuda %s: prompt of %zu tokens, logits differ by %.3g relative\n",
                name().c_str(), prompt.size(), diff);
  }
}

TEST_P(ModelCudaParityTest, GreedyTokensMatchWhereTheMarginAllows) {
  ASSERT_FALSE(expected_.at("greedy").empty());
  for (const auto& entry : expected_.at("greedy")) {
    std::vector<std::int32_t> tokens = token_ids(entry.at("prompt_ids"));
    const std::vector<std::int32_t> want = token_ids(entry.at("tokens"));
    const auto margins = entry.at("margins").get<std::vector<double>>();
    ASSERT_EQ(margins.size(), want.size());
    const std::size_t prompt = tokens.size();
    std::vector<float> logits = prefill(tokens, tokens.size() + want.size());
    std::size_t differing = 0;
    double smallest_margin = INFINITY;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const std::int32_t got = argmax_of(logits);
      float scale = 0;
      for (float value : logits) scale = std::max(scale, std::fabs(value));
      const double allowed = 2 * tolerance() * scale;
      smallest_margin = std::min(smallest_margin, margins[i]);
      if (got != want[i]) {
        ++differing;
        EXPECT_LE(margins[i], allowed)
            << "step " << i << ": token " << got << " where transformers chose " << want[i]
            << " with a margin of " << margins[i] << " (our logits: " << logits[got] << " vs "
            << logits[want[i]] << ")";
        std::printf("[ parity   ] cuda %s: step %zu differs (%d vs %d) at margin %.3g <= %.3g\n",
                    name().c_str(), i, got, want[i], margins[i], allowed);
      }
      tokens.push_back(want[i]);  // the reference's token: a near-tie does not end the run
      if (i + 1 < want.size()) {
        logits = run({want[i]}, static_cast<std::uint32_t>(tokens.size() - 1));
      }
    }
    finish();
    std::printf(
        "[ parity   ] cuda %s: prompt of %zu tokens, %zu of %zu greedy tokens differ, "
        "smallest reference margin %.3g\n",
        name().c_str(), prompt, differing, want.size(), smallest_margin);
  }
}

std::string fixture_name(
    const ::testing::TestParamInfo<std::tuple<std::string, Layout, DType>>& param) {
  std::string name = std::get<0>(param.param) + "_" +
                     std::string(to_string(std::get<1>(param.param))) +
                     (std::get<2>(param.param) == DType::kFp8 ? "_fp8kv" : "");
  std::erase(name, '-');
  return name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelCudaParityTest,
                         ::testing::Combine(::testing::ValuesIn(bf16_fixtures()),
                                            ::testing::ValuesIn(all_layouts()),
                                            ::testing::Values(DType::kBf16, DType::kFp8)),
                         fixture_name);
// FP8 weights (scripts/make_fixtures.py --only fp8), bf16 KV. Not qwen3-moe-tiny-fp8: its
// routers' top-k margins are as small as 2e-5, below what bf16 activations keep, so the device
// picks other experts at some positions (logits 0.15 apart); the CPU path runs it in float32.
INSTANTIATE_TEST_SUITE_P(
    Fp8Weights, ModelCudaParityTest,
    ::testing::Combine(::testing::Values(std::string("qwen3-tiny-fp8"),
                                         std::string("qwen3-tiny-fp8-channel")),
                       ::testing::ValuesIn(all_layouts()), ::testing::Values(DType::kBf16)),
    fixture_name);

}  // namespace
}  // namespace kvvm::model_cuda_parity_test
