// The CUDA model with its experts cached: each family's tiny mixture (experts of 1,024 so a
// 2 MiB granule holds few) gives, with the fewest slots a CUDA cache takes (a layer's experts)
// and a few more, the resident model's logits bit for bit over a prefill and 24 decode steps;
// the cache misses and says so; the decode steps after the prefill replay captured graphs, the
// residency decided on the device inside them.
// Skipped without a GPU; compiled only with the CUDA kernels.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#if defined(KVVM_HAS_CUDA_KERNELS)
#include "kvvm/model/model.h"
#include "kvvm/model/weight_memory.h"
#include "kvvm/vmm/cuda_driver.h"
#include "support/attention_support.h"
#include "support/cuda_device.h"
#include "support/text_match.h"
#include "support/tiny_model.h"
#endif

#if defined(KVVM_HAS_CUDA_KERNELS)
namespace kvvm::model::expert_cache_cuda_test {
namespace {

constexpr std::uint32_t kContext = 128;
constexpr std::uint64_t kGranule = std::uint64_t{2} << 20;

ModelConfig cached_config(const std::string& family) {
  ModelConfig c = testing::tiny_cuda_moe_config(family, kContext);
  c.moe.expert_intermediate = 1024;  // 1.1 MiB an expert: a handful of slots per granule
  return c;
}

struct StepsRun {
  std::vector<float> logits;
  Status graphs = Status::Ok();  // what capturing decode graphs said
};

// Two sequences prefilled (9 and 14 tokens), then 24 greedy decode steps of both; decode graphs
// asked for after the prefill.
StepsRun run_steps(Model& model, Driver& driver) {
  const ModelConfig& c = model.config();
  StepsRun run;
  auto kv =
      testing::KvArena::make(driver, c.kv_geometry(DType::kBf16), Layout::kTokenMajor, kContext, 3);
  EXPECT_NE(kv, nullptr);
  if (kv == nullptr) return run;
  auto pad = kv->arena->admit(1);
  EXPECT_TRUE(pad.ok());
  std::vector<std::uint32_t> slots;
  for (int s = 0; s < 2; ++s) {
    auto slot = kv->arena->admit(kContext);
    EXPECT_TRUE(slot.ok());
    slots.push_back(slot.ok() ? *slot : 0);
  }
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 23; ++i) ids.push_back((i * 29 + 3) % static_cast<int>(c.vocab_size));
  std::vector<Chunk> chunks = {{slots[0], 0, 9}, {slots[1], 0, 14}};
  std::vector<std::uint32_t> lengths = {9, 14};
  for (std::uint32_t step = 0; step <= 24; ++step) {
    if (step == 1) {
      DecodeGraphOptions options;
      options.batch_sizes = {2};
      options.kv = kv->arena->view();
      options.pad_slot = pad.ok() ? *pad : 0;
      options.max_length = kContext;
      run.graphs = model.capture_decode_graphs(options);
    }
    std::vector<float> logits(chunks.size() * c.vocab_size);
    std::vector<std::int32_t> argmax(chunks.size());
    const Status status =
        model.forward({ids, chunks, kv->arena->view(), {}}, {logits.data(), argmax.data()});
    EXPECT_TRUE(status.ok()) << status.to_string();
    if (!status.ok()) return run;
    run.logits.insert(run.logits.end(), logits.begin(), logits.end());
    ids = argmax;
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      chunks[i] = {slots[i], lengths[i], 1};
      ++lengths[i];
    }
  }
  model.release_decode_graphs();
  return run;
}

std::unique_ptr<Model> cuda_model(const testing::TinyModel& tiny, std::uint64_t budget) {
  CudaModelOptions options;
  options.limits = {.max_step_tokens = 64, .max_chunks = 2};
  options.weights.budget_bytes = budget;
  auto made = make_cuda_model(tiny.config(), tiny.weights(), options);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? std::move(made).value() : nullptr;
}

class MoeExpertCacheCuda : public ::testing::TestWithParam<const char*> {};

TEST_P(MoeExpertCacheCuda, CachedExpertsGiveTheResidentLogitsBitForBit) {
  if (!testing::have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  auto driver = make_cuda_driver();
  ASSERT_TRUE(driver.ok()) << driver.status().to_string();
  const ModelConfig config = cached_config(GetParam());
  testing::TinyModel tiny(config, TensorDType::kBf16, 31);
  auto resident = cuda_model(tiny, 0);
  ASSERT_NE(resident, nullptr);
  const StepsRun want = run_steps(*resident, **driver);
  ASSERT_TRUE(want.graphs.ok()) << want.graphs.to_string();
  const WeightSizes sizes = weight_sizes(config, DType::kBf16);
  const std::uint32_t all = sizes.sparse_layers * sizes.experts;
  // A layer's experts (the least a CUDA cache takes), and one more: Mixtral's two layers of four
  // then still miss (8 slots, rounded to the granule, would hold every expert).
  for (std::uint32_t slots : {config.moe.experts, config.moe.experts + 1}) {
    SCOPED_TRACE(std::to_string(slots) + " slots wanted");
    auto cached = cuda_model(tiny, expert_cache_budget_for(sizes, kGranule, slots));
    ASSERT_NE(cached, nullptr);
    const WeightStats before = cached->weight_stats();
    ASSERT_TRUE(before.split.expert_cache());
    ASSERT_GE(before.experts.slots, slots);
    ASSERT_LT(before.experts.slots, all) << "every expert fits: nothing would miss";
    const StepsRun got = run_steps(*cached, **driver);
    EXPECT_EQ(got.logits, want.logits);
    EXPECT_TRUE(got.graphs.ok()) << got.graphs.to_string();
    const ExpertCacheStats stats = cached->weight_stats().experts;
    EXPECT_GT(stats.misses, 0u);
    EXPECT_EQ(stats.hits + stats.misses, stats.lookups);
    EXPECT_EQ(stats.bytes_copied, stats.misses * sizes.expert_bytes);
    EXPECT_GT(stats.copy_seconds, 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, MoeExpertCacheCuda,
                         ::testing::Values("qwen3_moe", "mixtral", "qwen2_moe"));

TEST(MoeExpertCacheCuda, ABudgetBelowOneLayersExpertsIsRefusedNamingTheLeast) {
  if (!testing::have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const ModelConfig config = cached_config("qwen3_moe");
  testing::TinyModel tiny(config, TensorDType::kBf16, 32);
  const WeightSizes sizes = weight_sizes(config, DType::kBf16);
  CudaModelOptions options;
  options.limits = {.max_step_tokens = 64, .max_chunks = 2};
  options.weights.budget_bytes = expert_cache_budget_for(sizes, kGranule, 4);
  auto made = make_cuda_model(config, tiny.weights(), options);
  ASSERT_FALSE(made.ok());
  EXPECT_TRUE(test::contains(made.status().to_string(), "every expert of a layer"))
      << made.status().to_string();
}

}  // namespace
}  // namespace kvvm::model::expert_cache_cuda_test
#endif
