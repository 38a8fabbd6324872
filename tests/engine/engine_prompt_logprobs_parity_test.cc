// Prompt log-probabilities (what `echo: true, logprobs: k, max_tokens: 0` reports) against
// transformers': each fixture's prompt_logprobs.json (scripts/make_fixtures.py;
// scripts/fixtures/prompt_logprobs.py: float32 on the CPU with the checkpoint's weights) holds, for
// every prompt position but the last, the log-softmax scoring the next token and its top 5. The
// engine on the CPU model computes the same rows in one prefill, whatever its chunking.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvvm/engine/engine.h"
#include "support/engine_harness.h"
#include "support/test_data.h"

namespace kvvm::engine::prompt_logprobs_parity_test {
namespace {

// The rows the engine reports for `prompt` with `top` alternatives, the prefill cut into
// chunks of `chunk` tokens (0: the step's budget).
std::vector<model::RowLogprobs> engine_rows(testing::FixtureModel& fixture,
                                            const std::vector<std::int32_t>& prompt,
                                            std::uint32_t top, std::uint32_t chunk) {
  auto kv = testing::make_kv(fixture.config, 2);
  EngineOptions options = testing::no_cache();
  options.prefill_chunk = chunk;
  auto engine = Engine::create(*fixture.model, *kv, options);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  if (!engine.ok()) return {};
  EngineRequest request;
  request.prompt = prompt;
  request.max_tokens = 0;
  request.prompt_logprobs = true;
  request.logprobs = top;
  std::vector<model::RowLogprobs> rows;
  auto id = (*engine)->submit(request, [&rows](const RequestEvent& event) {
    if (!event.prompt_logprobs.empty()) {
      rows.assign(event.prompt_logprobs.begin(), event.prompt_logprobs.end());
    }
  });
  EXPECT_TRUE(id.ok()) << id.status().to_string();
  EXPECT_TRUE((*engine)->run_until_idle().ok());
  return rows;
}

class PromptLogprobsParity : public ::testing::TestWithParam<std::string> {};

TEST_P(PromptLogprobsParity, EqualTransformersFloat32) {
  const std::string dir = test::model_fixture_dir(GetParam());
  std::ifstream in(std::filesystem::path(dir) / "prompt_logprobs.json");
  ASSERT_TRUE(in) << dir << "/prompt_logprobs.json is missing: make it with "
                  << "scripts/make_fixtures.py --only prompt-logprobs";
  const nlohmann::json expected = nlohmann::json::parse(in);
  auto fixture = testing::load_fixture(GetParam(), testing::kSmallStepLimits);
  ASSERT_NE(fixture, nullptr);
  const std::uint32_t top = expected["top"].get<std::uint32_t>();
  std::size_t compared = 0;
  for (const nlohmann::json& entry : expected["prompts"]) {
    const auto prompt = entry["prompt_ids"].get<std::vector<std::int32_t>>();
    const nlohmann::json& want = entry["rows"];
    for (const std::uint32_t chunk : {0u, 3u}) {
      SCOPED_TRACE(entry["prompt"].get<std::string>() + ", chunk " + std::to_string(chunk));
      const std::vector<model::RowLogprobs> rows = engine_rows(*fixture, prompt, top, chunk);
      ASSERT_EQ(rows.size(), want.size());
      for (std::size_t j = 0; j < rows.size(); ++j) {
        const nlohmann::json& w = want[j];
        EXPECT_EQ(rows[j].target, w["token"].get<std::int32_t>()) << "row " << j;
        // float32 logits on both sides (OpenBLAS against torch's CPU GEMMs), softmax in double.
        EXPECT_NEAR(rows[j].logprob, w["logprob"].get<double>(), 2e-4) << "row " << j;
        ASSERT_EQ(rows[j].top, top) << "row " << j;
        const auto& ids = w["top_ids"];
        const auto& values = w["top_logprobs"];
        for (std::uint32_t k = 0; k < top; ++k) {
          EXPECT_NEAR(rows[j].top_logprobs[k], values[k].get<double>(), 2e-4)
              << "row " << j << ", alternative " << k;
          // The ids agree unless two alternatives tie within rounding.
          const bool tied =
              (k > 0 && std::abs(values[k].get<double>() - values[k - 1].get<double>()) < 1e-4) ||
              (k + 1 < top &&
               std::abs(values[k].get<double>() - values[k + 1].get<double>()) < 1e-4);
          if (!tied) {
            EXPECT_EQ(rows[j].top_ids[k], ids[k].get<std::int32_t>())
                << "row " << j << ", alternative " << k;
          }
        }
        ++compared;
      }
    }
  }
  EXPECT_GE(compared, 30u);  // every prompt row, once per chunking
  RecordProperty("rows", std::to_string(compared));
}

// "llama-tiny-bf16" -> "llama_tiny_bf16": test names take no dashes.
std::string fixture_name(const ::testing::TestParamInfo<std::string>& param) {
  std::string name = param.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PromptLogprobsParity,
                         ::testing::Values("llama-tiny", "llama-tiny-bf16", "qwen2-tiny",
                                           "qwen2-tiny-bf16", "qwen3-tiny", "qwen3-tiny-bf16"),
                         fixture_name);

}  // namespace
}  // namespace kvvm::engine::prompt_logprobs_parity_test
