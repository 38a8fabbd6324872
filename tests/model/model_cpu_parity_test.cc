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
// And the same with an fp8 (e4m3) cache at scale 1 (the fixtures carry no k_scale / v_scale):
// each cached element then carries 3 mantissa bits (a relative error up to 2^-4), which the
// logits see as a relative difference from `last_fp32` measured over the fixtures' 36 prompts
// at mean 6.2e-3, median 5.6e-3, max 1.45e-2; the tolerance, 3e-2, is 2.1 times that maximum,
// and the greedy comparison allows a flip where the margin is under 2 x 3e-2 x max |logit|
// (none did: 0 of 32 tokens differ on every fixture).
// And the FP8 checkpoints (qwen3-tiny-fp8: Hugging Face's 128 x 128 block scales, made by
// transformers' FineGrainedFP8Config; qwen3-tiny-fp8-channel: compressed-tensors' per-row
// scales), which this path dequantizes at load: compared with `last_fp32` and `tokens_fp32`
// only, the model with its weights dequantized (e4m3 * scale) computed in float32 on CPU, at
// the float32 tolerance; their `last` and `tokens` (FP8 or bf16 compute on CUDA) are the CUDA
// path's to meet.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "base/json_reader.h"
#include "kvvm/model/model.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "model/cpu/cpu_ops.h"
#include "support/fixture_model.h"
#include "support/reference_transformer.h"
#include "support/test_data.h"
#include "support/tiny_model.h"

namespace kvvm::model_cpu_parity_test {
namespace {

using model::Chunk;

constexpr double kFp32Tolerance = 1e-4;
constexpr double kBf16Tolerance = 1e-2;
constexpr double kFp8KvTolerance = 3e-2;

// A fixture and the cache's element type (fp32, or e4m3); `fp32_only`: compared with its
// float32 reference alone (an FP8 checkpoint's other reference computes differently).
struct ParityCase {
  std::string fixture;
  DType kv;
  bool fp32_only = false;
};

// How gtest names a case in its messages.
void PrintTo(const ParityCase& c, std::ostream* os) {
  *os << c.fixture << " (" << to_string(c.kv) << " KV" << (c.fp32_only ? ", fp32 reference" : "")
      << ")";
}

std::string parity_case_name(const ::testing::TestParamInfo<ParityCase>& info) {
  std::string name = info.param.fixture;
  std::erase(name, '-');
  return name;
}

const std::vector<std::string>& fixture_names() {
  // The mixtures: scripts/make_fixtures.py --only moe (Qwen3-MoE with a dense layer, Mixtral,
  // Qwen2-MoE with its shared expert).
  static const std::vector<std::string> names = {
      "llama-tiny",   "llama-tiny-bf16",   "qwen2-tiny",     "qwen2-tiny-bf16",
      "qwen3-tiny",   "qwen3-tiny-bf16",   "qwen3-moe-tiny", "qwen3-moe-tiny-bf16",
      "mixtral-tiny", "mixtral-tiny-bf16", "qwen2-moe-tiny", "qwen2-moe-tiny-bf16"};
  return names;
}

// FP8 weights: scripts/make_fixtures.py --only fp8 makes them from qwen3-tiny-bf16.
const std::vector<std::string>& fp8_weight_fixture_names() {
  static const std::vector<std::string> names = {"qwen3-tiny-fp8", "qwen3-tiny-fp8-channel",
                                                 "qwen3-moe-tiny-fp8"};
  return names;
}

using test::token_ids;

class ModelCpuParityTest : public ::testing::TestWithParam<ParityCase> {
 protected:
  void SetUp() override {
    auto loaded = test::load_fixture_model(GetParam().fixture);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    config_ = loaded->config;
    files_ = std::move(loaded->files);
    expected_ = std::move(loaded->expected);
    const model::ModelWeights* weights = &loaded->weights;
    tolerance_ = expected_.at("dtype") == "float32" ? kFp32Tolerance : kBf16Tolerance;
    fp8_ = GetParam().kv == DType::kFp8;
    const std::size_t longest = loaded->longest, context = loaded->context;
    model::CpuModelOptions options;
    options.limits = {.max_step_tokens = static_cast<std::uint32_t>(longest), .max_chunks = 1};
    auto made = model::make_cpu_model(config_, *weights, options);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    model_ = std::move(made).value();
    kv_ = testing::ModelKv::make(config_, Layout::kTokenMajor, GetParam().kv, context, 1);
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
      const double allowed = 2 * (fp8_ ? kFp8KvTolerance : tolerance) * scale;
      if (got != want[i]) {
        ++differing;
        EXPECT_LE(margins[i], allowed)
            << what << " step " << i << ": token " << got << " where transformers chose " << want[i]
            << " with a margin of " << margins[i];
        std::printf("[ parity   ] %s %s: step %zu differs (%d vs %d) at margin %.3g <= %.3g\n",
                    name().c_str(), what, i, got, want[i], margins[i], allowed);
      }
      // Fed the reference's token, so a near-tie does not end the comparison.
      tokens.push_back(want[i]);
      if (i + 1 < want.size()) {
        logits = run({want[i]}, static_cast<std::uint32_t>(tokens.size() - 1));
      }
    }
    finish();
    std::printf("[ parity   ] %s %s: prompt of %zu tokens, %zu of %zu greedy tokens differ\n",
                name().c_str(), what, tokens.size() - want.size(), differing, want.size());
  }

  std::string name() const { return GetParam().fixture + (fp8_ ? " (fp8 KV)" : ""); }

  model::ModelConfig config_;
  bool fp8_ = false;
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
      if (GetParam().fp32_only && std::string_view(ref.key) == "last") continue;
      if (GetParam().fp32_only) {
        ASSERT_TRUE(entry.contains(ref.key)) << ref.key;
      }
      if (!entry.contains(ref.key)) continue;
      const auto last = entry.at(ref.key).get<std::vector<double>>();
      ASSERT_EQ(last.size(), config_.vocab_size);
      const double diff = testing::max_relative_difference(logits, last);
      const double tolerance = fp8_ ? std::max(kFp8KvTolerance, ref.tolerance) : ref.tolerance;
      EXPECT_LE(diff, tolerance) << ref.key << ", prompt of " << prompt.size() << " tokens";
      std::printf("[ parity   ] %s %s: prompt of %zu tokens, logits differ by %.3g relative\n",
                  name().c_str(), ref.key, prompt.size(), diff);
    }
  }
}

TEST_P(ModelCpuParityTest, GreedyTokensMatchWhereTheMarginAllows) {
  ASSERT_FALSE(expected_.at("greedy").empty());
  for (const auto& entry : expected_.at("greedy")) {
    const std::vector<std::int32_t> prompt = token_ids(entry.at("prompt_ids"));
    if (GetParam().fp32_only) {
      ASSERT_TRUE(entry.contains("tokens_fp32"));
    }
    if (entry.contains("tokens_fp32")) {
      compare_greedy(prompt, token_ids(entry.at("tokens_fp32")),
                     entry.at("margins_fp32").get<std::vector<double>>(), kFp32Tolerance, "fp32");
    }
    if (GetParam().fp32_only) continue;
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
    const auto& fp8 = fp8_weight_fixture_names();
    EXPECT_TRUE(std::find(fixture_names().begin(), fixture_names().end(), name) !=
                    fixture_names().end() ||
                std::find(fp8.begin(), fp8.end(), name) != fp8.end())
        << name << " is not in this suite's lists";
  }
  EXPECT_EQ(seen, fixture_names().size() + fp8_weight_fixture_names().size());
}

std::vector<ParityCase> parity_cases(DType kv) {
  std::vector<ParityCase> cases;
  for (const std::string& name : fixture_names()) cases.push_back({name, kv});
  return cases;
}

std::vector<ParityCase> fp8_weight_cases() {
  std::vector<ParityCase> cases;
  for (const std::string& name : fp8_weight_fixture_names()) {
    cases.push_back({name, DType::kFp32, /*fp32_only=*/true});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelCpuParityTest,
                         ::testing::ValuesIn(parity_cases(DType::kFp32)), parity_case_name);
INSTANTIATE_TEST_SUITE_P(Fp8Kv, ModelCpuParityTest, ::testing::ValuesIn(parity_cases(DType::kFp8)),
                         parity_case_name);
INSTANTIATE_TEST_SUITE_P(Fp8Weights, ModelCpuParityTest, ::testing::ValuesIn(fp8_weight_cases()),
                         parity_case_name);

}  // namespace
}  // namespace kvvm::model_cpu_parity_test
