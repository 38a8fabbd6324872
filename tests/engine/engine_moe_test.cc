// The engine on the mixtures of experts (support/tiny_model.h, the CPU model): the engine's
// identities hold with a router in every layer, since a token's experts depend on its own row
// alone: the same greedy tokens alone, in one batch, staggered beside prefills, with the prefix
// cache on, and after preemption under a budget too small for every sequence.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/engine/generate.h"
#include "support/engine_harness.h"
#include "support/tiny_model.h"

namespace kvvm::engine {
namespace {

using testing::Collector;
using testing::greedy_request;

std::vector<std::int32_t> prompt_of(std::size_t n, std::uint32_t vocab, std::uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<std::int32_t> draw(0, static_cast<std::int32_t>(vocab) - 1);
  std::vector<std::int32_t> ids(n);
  for (auto& id : ids) id = draw(random);
  return ids;
}

struct MoeRun {
  std::vector<std::vector<std::int32_t>> tokens;
  EngineStats stats;
};

MoeRun run_engine(model::Model& model, KvSpace& kv, const EngineOptions& options,
                  const std::vector<EngineRequest>& requests, int gap) {
  MoeRun run;
  Collector collector;
  std::vector<RequestId> ids;
  {
    auto engine = Engine::create(model, kv, options);
    EXPECT_TRUE(engine.ok()) << engine.status().to_string();
    if (!engine.ok()) return run;
    for (const EngineRequest& request : requests) {
      auto id = (*engine)->submit(request, collector.callback());
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      if (!id.ok()) return run;
      ids.push_back(*id);
      for (int s = 0; s < gap; ++s) EXPECT_TRUE((*engine)->step().ok());
    }
    EXPECT_TRUE((*engine)->run_until_idle().ok());
    run.stats = (*engine)->stats();
  }
  testing::expect_clean(kv);
  for (const RequestId id : ids) {
    EXPECT_EQ(collector.get(id).end, RequestEnd::kLength) << collector.get(id).error.to_string();
    run.tokens.push_back(collector.get(id).tokens);
  }
  return run;
}

class EngineMoe : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    tiny_ = std::make_unique<kvvm::testing::TinyModel>(kvvm::testing::tiny_moe_config(GetParam()),
                                                       model::TensorDType::kF32, 29);
    model::CpuModelOptions options;
    options.limits = testing::kSmallStepLimits;
    options.threads = 2;
    auto made = model::make_cpu_model(tiny_->config(), tiny_->weights(), options);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    model_ = std::move(made).value();
    const std::uint32_t vocab = tiny_->config().vocab_size;
    // A shared head, so the prefix cache has something to find.
    const std::vector<std::int32_t> shared = prompt_of(30, vocab, 1);
    for (std::uint64_t i = 0; i < 4; ++i) {
      std::vector<std::int32_t> prompt = shared;
      const std::vector<std::int32_t> tail = prompt_of(5 + 7 * i, vocab, 10 + i);
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      requests_.push_back(greedy_request(prompt, 20));
    }
  }

  std::unique_ptr<kvvm::testing::TinyModel> tiny_;
  std::unique_ptr<model::Model> model_;
  std::vector<EngineRequest> requests_;
};

TEST_P(EngineMoe, AloneBatchedStaggeredCachedAndPreemptedGiveTheSameTokens) {
  const model::ModelConfig& config = tiny_->config();
  auto kv = testing::make_kv(config, 5);
  ASSERT_NE(kv, nullptr);
  std::vector<std::vector<std::int32_t>> alone;
  for (const EngineRequest& request : requests_) {
    const MoeRun one = run_engine(*model_, *kv, testing::no_cache(), {request}, 0);
    ASSERT_EQ(one.tokens.size(), 1u);
    alone.push_back(one.tokens[0]);
    GenerateRequest single;
    single.prompt = request.prompt;
    single.max_tokens = 20;
    auto generated = generate(*model_, *kv, single);
    ASSERT_TRUE(generated.ok()) << generated.status().to_string();
    EXPECT_EQ(generated->tokens, alone.back());
  }
  const MoeRun batch = run_engine(*model_, *kv, testing::no_cache(), requests_, 0);
  EXPECT_EQ(batch.tokens, alone);
  EXPECT_EQ(batch.stats.peak_running, requests_.size());
  const MoeRun staggered = run_engine(*model_, *kv, testing::no_cache(), requests_, 3);
  EXPECT_EQ(staggered.tokens, alone);
  EngineOptions cached;
  cached.prefix_cache = true;
  const MoeRun with_cache = run_engine(*model_, *kv, cached, requests_, 3);
  EXPECT_EQ(with_cache.tokens, alone);
  EXPECT_GT(with_cache.stats.prefix.hits, 0u);

  // A budget of about two and a half sequences: the newest are preempted and recomputed.
  const std::uint64_t per_token =
      std::uint64_t{2} * config.layers * config.kv_heads * config.head_dim * sizeof(float);
  auto tight = testing::make_kv(config, 5, 128, 150 * per_token);
  ASSERT_NE(tight, nullptr);
  const MoeRun preempted = run_engine(*model_, *tight, testing::no_cache(), requests_, 0);
  EXPECT_EQ(preempted.tokens, alone);
  EXPECT_GT(preempted.stats.preemptions, 0u) << "the budget did not force a preemption";
}

INSTANTIATE_TEST_SUITE_P(Families, EngineMoe,
                         ::testing::Values("qwen3_moe", "mixtral", "qwen2_moe"));

}  // namespace
}  // namespace kvvm::engine
