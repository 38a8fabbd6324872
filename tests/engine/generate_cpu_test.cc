// generate() with the real CPU model: greedy tokens against a float64 reference that
// recomputes every position, and the same tokens whatever the KV layout and the host granule
// (a page-sized granule puts a sequence across many windows).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "kvvm/engine/generate.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "support/reference_transformer.h"
#include "support/test_data.h"
#include "support/tiny_model.h"

namespace kvvm::engine {
namespace {

using kvvm::testing::ReferenceTransformer;
using kvvm::testing::TinyModel;

constexpr std::uint32_t kGenerated = 24;

std::vector<std::int32_t> prompt_of(std::size_t n, std::uint32_t vocab, std::uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<std::int32_t> draw(0, static_cast<std::int32_t>(vocab) - 1);
  std::vector<std::int32_t> ids(n);
  for (auto& id : ids) id = draw(random);
  return ids;
}

struct Run {
  std::vector<std::int32_t> tokens;
  std::uint64_t committed_windows = 0;
};

Result<GenerateResult> run_generate(const TinyModel& tiny, Layout layout,
                                    std::uint64_t host_granule,
                                    const std::vector<std::int32_t>& prompt,
                                    std::uint32_t prefill_chunk) {
  model::CpuModelOptions options;
  options.limits = {.max_step_tokens = 32, .max_chunks = 4};
  options.threads = 2;
  auto model = model::make_cpu_model(tiny.config(), tiny.weights(), options);
  if (!model.ok()) return model.status();
  KvSpaceOptions kv_options;
  kv_options.layout = layout;
  kv_options.host_granule = host_granule;
  kv_options.max_slots = 1;
  kv_options.max_context = 128;
  auto kv = KvSpace::create(tiny.config(), kv_options);
  if (!kv.ok()) return kv.status();
  GenerateRequest request;
  request.prompt = prompt;
  request.max_tokens = kGenerated;
  request.prefill_chunk = prefill_chunk;
  auto result = generate(**model, **kv, request);
  EXPECT_EQ((*kv)->arena().stats().active_slots, 0u);
  return result;
}

// The reference's greedy continuation, with each step's top-1 minus top-2 margin.
void reference_greedy(const ReferenceTransformer& reference, std::vector<std::int32_t> tokens,
                      std::uint32_t steps, std::vector<std::int32_t>* out,
                      std::vector<double>* margins) {
  for (std::uint32_t i = 0; i < steps; ++i) {
    const std::vector<double> last = reference.logits(tokens).back();
    std::vector<double> sorted = last;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    const auto best =
        static_cast<std::int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    out->push_back(best);
    margins->push_back(sorted[0] - sorted[1]);
    tokens.push_back(best);
  }
}

TEST(GenerateCpu, GreedyTokensMatchTheFloat64Reference) {
  TinyModel tiny(kvvm::testing::tiny_config(), model::TensorDType::kF32, 11);
  const ReferenceTransformer reference(tiny.config(), tiny.weights());
  const std::vector<std::int32_t> prompt = prompt_of(19, tiny.config().vocab_size, 5);
  auto result = run_generate(tiny, Layout::kTokenMajor, 0, prompt, 7);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  std::vector<std::int32_t> expected;
  std::vector<double> margins;
  reference_greedy(reference, prompt, kGenerated, &expected, &margins);
  ASSERT_EQ(result->tokens.size(), expected.size());
  // Equal up to the first step where the reference's own choice is too close to call in
  // float32; past a legitimate divergence the continuations are different texts.
  std::size_t compared = 0;
  for (std::size_t i = 0; i < expected.size() && margins[i] > 1e-3; ++i, ++compared) {
    EXPECT_EQ(result->tokens[i], expected[i]) << "step " << i << ", margin " << margins[i];
  }
  EXPECT_GE(compared, kGenerated / 2) << "the reference's margins are too small to test";
}

TEST(GenerateCpu, SameTokensOnEveryLayoutAndGranule) {
  TinyModel tiny(kvvm::testing::tiny_config(), model::TensorDType::kF32, 3);
  const std::vector<std::int32_t> prompt = prompt_of(37, tiny.config().vocab_size, 9);
  auto baseline = run_generate(tiny, Layout::kTokenMajor, std::uint64_t{2} << 20, prompt, 0);
  ASSERT_TRUE(baseline.ok()) << baseline.status().to_string();
  ASSERT_EQ(baseline->tokens.size(), kGenerated);
  for (const Layout layout : all_layouts()) {
    // 0: the page size; the tiny model's 512-byte token-major token fills a page in 8 tokens.
    for (const std::uint64_t granule : {std::uint64_t{0}, std::uint64_t{2} << 20}) {
      for (const std::uint32_t chunk : {0u, 5u}) {
        auto result = run_generate(tiny, layout, granule, prompt, chunk);
        ASSERT_TRUE(result.ok()) << result.status().to_string();
        EXPECT_EQ(result->tokens, baseline->tokens)
            << to_string(layout) << ", granule " << granule << ", chunk " << chunk;
      }
    }
  }
}

// The mixtures of experts (support/tiny_model.h) likewise: their greedy tokens against the
// float64 reference, and the same on every layout and prefill chunking.
class GenerateCpuMoe : public ::testing::TestWithParam<const char*> {};

TEST_P(GenerateCpuMoe, GreedyTokensMatchTheFloat64ReferenceOnEveryLayout) {
  TinyModel tiny(kvvm::testing::tiny_moe_config(GetParam()), model::TensorDType::kF32, 17);
  const ReferenceTransformer reference(tiny.config(), tiny.weights());
  const std::vector<std::int32_t> prompt = prompt_of(23, tiny.config().vocab_size, 6);
  std::vector<std::int32_t> expected;
  std::vector<double> margins;
  reference_greedy(reference, prompt, kGenerated, &expected, &margins);
  auto baseline = run_generate(tiny, Layout::kTokenMajor, 0, prompt, 7);
  ASSERT_TRUE(baseline.ok()) << baseline.status().to_string();
  std::size_t compared = 0;
  for (std::size_t i = 0; i < expected.size() && margins[i] > 1e-3; ++i, ++compared) {
    EXPECT_EQ(baseline->tokens[i], expected[i]) << "step " << i << ", margin " << margins[i];
  }
  EXPECT_GE(compared, kGenerated / 2) << "the reference's margins are too small to test";
  for (const Layout layout : all_layouts()) {
    for (const std::uint32_t chunk : {0u, 5u}) {
      auto result = run_generate(tiny, layout, std::uint64_t{2} << 20, prompt, chunk);
      ASSERT_TRUE(result.ok()) << result.status().to_string();
      EXPECT_EQ(result->tokens, baseline->tokens) << to_string(layout) << ", chunk " << chunk;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GenerateCpuMoe,
                         ::testing::Values("qwen3_moe", "mixtral", "qwen2_moe"));

// The committed fixtures: transformers' greedy continuation of each "greedy" entry, token for
// token wherever its top-2 margin is wide enough for float32 to call, on every layout and
// with the page-sized granule (many windows) as with a 2 MiB one.
class GenerateCpuFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(GenerateCpuFixture, GreedyTokensEqualTransformersOnEveryLayout) {
  const std::string dir = test::model_fixture_dir(GetParam());
  ASSERT_TRUE(std::filesystem::exists(std::filesystem::path(dir) / "expected.json"))
      << "no fixture at " << dir;
  std::ifstream in(std::filesystem::path(dir) / "expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  auto config = model::load_model_config(dir);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  auto files = model::WeightFiles::open_dir(dir);
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  auto weights = model::bind_weights(*config, **files);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  model::CpuModelOptions options;
  options.threads = 2;
  auto model = model::make_cpu_model(*config, *weights, options);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  ASSERT_FALSE(expected["greedy"].empty());
  // The reference of a bf16 fixture computed in bf16, this model in float32: only steps with a
  // clear winner are comparable.
  const double min_margin = expected["dtype"] == "bfloat16" ? 0.25 : 1e-3;

  for (const Layout layout : all_layouts()) {
    for (const std::uint64_t granule : {std::uint64_t{0}, std::uint64_t{2} << 20}) {
      KvSpaceOptions kv_options;
      kv_options.layout = layout;
      kv_options.host_granule = granule;
      kv_options.max_slots = 1;
      kv_options.max_context = 256;
      auto kv = KvSpace::create(*config, kv_options);
      ASSERT_TRUE(kv.ok()) << kv.status().to_string();
      for (const nlohmann::json& entry : expected["greedy"]) {
        GenerateRequest request;
        request.prompt = entry["prompt_ids"].get<std::vector<std::int32_t>>();
        const auto want = entry["tokens"].get<std::vector<std::int32_t>>();
        const auto margins = entry["margins"].get<std::vector<double>>();
        request.max_tokens = static_cast<std::uint32_t>(want.size());
        request.prefill_chunk = 5;  // several chunks, and windows crossed mid-chunk
        auto result = generate(**model, **kv, request);  // no stop ids, as the reference
        ASSERT_TRUE(result.ok()) << result.status().to_string();
        ASSERT_EQ(result->tokens.size(), want.size());
        std::size_t compared = 0;
        for (std::size_t i = 0; i < want.size() && margins[i] > min_margin; ++i, ++compared) {
          ASSERT_EQ(result->tokens[i], want[i])
              << GetParam() << ", " << to_string(layout) << ", granule " << granule << ", step "
              << i << ", margin " << margins[i];
        }
        EXPECT_GT(compared, 0u) << "the first step's margin is too small to compare";
      }
      EXPECT_EQ((*kv)->arena().stats().active_slots, 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GenerateCpuFixture,
                         ::testing::Values("llama-tiny", "qwen2-tiny", "llama-tiny-bf16",
                                           "qwen2-tiny-bf16", "qwen3-tiny", "qwen3-tiny-bf16",
                                           "qwen3-moe-tiny", "mixtral-tiny", "qwen2-moe-tiny"),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace kvvm::engine
