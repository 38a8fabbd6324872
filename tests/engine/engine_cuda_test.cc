// The engine on the CUDA model (skipped without a GPU): transformers' greedy tokens for the
// bf16 fixture wherever its margin calls them, alone and in a staggered batch, and the same
// tokens with decode graphs on as off (the graphs replayed, on the engine's padding slot).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/vmm/cuda_driver.h"
#include "support/engine_harness.h"

namespace kvvm::engine {
namespace {

using testing::Collector;
using testing::greedy_request;

constexpr std::uint32_t kTokens = 24;
// The reference computed in bf16 as the CUDA model does, with other kernels: only steps with
// a clear winner are comparable (the CPU fixture test uses the same bound).
constexpr double kMinMargin = 0.25;

struct CudaRun {
  std::vector<std::vector<std::int32_t>> tokens;
  EngineStats stats;
};

CudaRun run_cuda(model::Model& model, const model::ModelConfig& config, bool graphs,
                 const std::vector<EngineRequest>& requests, int gap,
                 DType kv_dtype = DType::kUnset) {
  CudaRun run;
  KvSpaceOptions kv_options;
  kv_options.backend = model::Backend::kCuda;
  kv_options.kv_dtype = kv_dtype;
  kv_options.max_slots = 5;  // 4 sequences and the graphs' padding slot
  kv_options.max_context = 128;
  kv_options.budget_bytes = std::uint64_t{256} << 20;
  auto kv = KvSpace::create(config, kv_options);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  if (!kv.ok()) return run;
  Collector collector;
  std::vector<RequestId> ids;
  {
    EngineOptions options;
    options.graphs = graphs;
    auto engine = Engine::create(model, **kv, options);
    EXPECT_TRUE(engine.ok()) << engine.status().to_string();
    if (!engine.ok()) return run;
    // Graphs keep one slot for their padding rows.
    EXPECT_EQ((*engine)->options().max_running, graphs ? 4u : 5u);
    for (const EngineRequest& request : requests) {
      ids.push_back(*(*engine)->submit(request, collector.callback()));
      for (int s = 0; s < gap; ++s) EXPECT_TRUE((*engine)->step().ok());
    }
    EXPECT_TRUE((*engine)->run_until_idle().ok());
    run.stats = (*engine)->stats();
  }
  testing::expect_clean(**kv);
  for (const RequestId id : ids) {
    EXPECT_EQ(collector.get(id).end, RequestEnd::kLength) << collector.get(id).error.to_string();
    run.tokens.push_back(collector.get(id).tokens);
  }
  return run;
}

// The bf16 fixture on the CUDA model, and a greedy request for each of its reference prompts.
class EngineCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    loaded_ = testing::load_fixture("llama-tiny-bf16");
    ASSERT_NE(loaded_, nullptr);
    auto weights = model::bind_weights(loaded_->config, *loaded_->files);
    ASSERT_TRUE(weights.ok()) << weights.status().to_string();
    auto made = model::make_cuda_model(loaded_->config, *weights, model::CudaModelOptions{});
    if (!made.ok()) GTEST_SKIP() << made.status().to_string();
    model_ = std::move(made).value();
    for (const nlohmann::json& entry : loaded_->expected["greedy"]) {
      requests_.push_back(
          greedy_request(entry["prompt_ids"].get<std::vector<std::int32_t>>(), kTokens));
    }
    ASSERT_GE(requests_.size(), 3u);
  }

  std::unique_ptr<testing::FixtureModel> loaded_;
  std::unique_ptr<model::Model> model_;
  std::vector<EngineRequest> requests_;
};

TEST_F(EngineCuda, GreedyTokensMatchTheReferenceWithAndWithoutGraphs) {
  model::Model& cuda = *model_;
  const auto& loaded = loaded_;
  const std::vector<EngineRequest>& requests = requests_;

  const CudaRun eager = run_cuda(cuda, loaded->config, false, requests, 2);
  ASSERT_EQ(eager.tokens.size(), requests.size());
  EXPECT_EQ(eager.stats.graphs.replays, 0u);
  const CudaRun graphed = run_cuda(cuda, loaded->config, true, requests, 2);
  // Capture on must give the tokens capture off gives.
  EXPECT_EQ(graphed.tokens, eager.tokens);
  EXPECT_GT(graphed.stats.graphs.graphs, 0u) << "no decode graph was captured";
  EXPECT_GT(graphed.stats.graphs.replays, 0u) << "no decode step replayed a graph";
  EXPECT_GT(graphed.stats.decode_only_steps, 0u);

  for (std::size_t r = 0; r < requests.size(); ++r) {
    const CudaRun alone = run_cuda(cuda, loaded->config, true, {requests[r]}, 0);
    ASSERT_EQ(alone.tokens.size(), 1u);
    const nlohmann::json& entry = loaded->expected["greedy"][r];
    const auto want = entry["tokens"].get<std::vector<std::int32_t>>();
    const auto margins = entry["margins"].get<std::vector<double>>();
    std::size_t compared = 0;
    for (std::size_t i = 0; i < kTokens && margins[i] > kMinMargin; ++i, ++compared) {
      EXPECT_EQ(alone.tokens[0][i], want[i]) << "prompt " << r << " alone, step " << i;
      EXPECT_EQ(graphed.tokens[r][i], want[i]) << "prompt " << r << " batched, step " << i;
    }
    EXPECT_GT(compared, 0u);
  }
}

// An fp8 cache: graphs on give the tokens graphs off give (every kernel reads e4m3 the same
// way in both), and the batched tokens are transformers' wherever its margin is clear of the
// fp8 error.
TEST_F(EngineCuda, OnAnFp8CacheGraphsKeepTheTokens) {
  model::Model& cuda = *model_;
  const auto& loaded = loaded_;
  const std::vector<EngineRequest>& requests = requests_;
  const CudaRun eager = run_cuda(cuda, loaded->config, false, requests, 2, DType::kFp8);
  ASSERT_EQ(eager.tokens.size(), requests.size());
  const CudaRun graphed = run_cuda(cuda, loaded->config, true, requests, 2, DType::kFp8);
  EXPECT_EQ(graphed.tokens, eager.tokens);
  EXPECT_GT(graphed.stats.graphs.replays, 0u) << "no decode step replayed a graph";
  constexpr double kFp8MinMargin = 1.0;  // transformers' bf16 margins against fp8 K / V
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const nlohmann::json& entry = loaded->expected["greedy"][r];
    const auto want = entry["tokens"].get<std::vector<std::int32_t>>();
    const auto margins = entry["margins"].get<std::vector<double>>();
    for (std::size_t i = 0; i < kTokens && margins[i] > kFp8MinMargin; ++i) {
      EXPECT_EQ(graphed.tokens[r][i], want[i]) << "prompt " << r << " batched, step " << i;
    }
  }
}

}  // namespace
}  // namespace kvvm::engine
