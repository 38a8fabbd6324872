// The CPU model with its experts cached: the same logits bit for bit as with every expert
// resident, however few the slots (a step wanting more experts than slots runs in waves); the
// counts the cache reports; a failed expert copy failing the step by name with nothing lost;
// every driver call of the load failed in turn leaving nothing behind.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvvm/model/model.h"
#include "kvvm/model/weight_memory.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/host_driver.h"
#include "support/text_match.h"
#include "support/tiny_model.h"

namespace kvvm::model {
namespace {

constexpr std::uint64_t kPage = 4096;  // the host driver's granule

using testing::ModelKv;
using testing::TinyModel;

struct Steps {
  std::vector<float> logits;
  Status failed = Status::Ok();  // the first failed step's status
  std::size_t failed_at = 0;
};

// Two sequences prefilled together (14 and 9 tokens), then 6 greedy decode steps of both. Step
// `retry_after_failure` is run again when it fails (the step's KV rows are rewritten).
Steps run_steps(Model& model, bool retry_after_failure = false) {
  const ModelConfig& c = model.config();
  auto kv = ModelKv::make(c, Layout::kTokenMajor, DType::kFp32, 64, 2);
  EXPECT_NE(kv, nullptr);
  Steps out;
  if (kv == nullptr) return out;
  std::vector<std::uint32_t> slots;
  for (int i = 0; i < 2; ++i) {
    auto slot = kv->arena().admit(32);
    EXPECT_TRUE(slot.ok()) << slot.status().to_string();
    slots.push_back(slot.ok() ? *slot : 0);
  }
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 23; ++i) ids.push_back((i * 41 + 7) % static_cast<int>(c.vocab_size));
  std::vector<Chunk> chunks = {{slots[0], 0, 14}, {slots[1], 0, 9}};
  std::vector<std::uint32_t> lengths = {14, 9};
  for (std::size_t step = 0; step < 7; ++step) {
    std::vector<float> logits(chunks.size() * c.vocab_size);
    std::vector<std::int32_t> argmax(chunks.size());
    Status status =
        model.forward({ids, chunks, kv->arena().view(), {}}, {logits.data(), argmax.data()});
    if (!status.ok() && out.failed.ok()) {
      out.failed = status;
      out.failed_at = step;
      if (!retry_after_failure) return out;
      status = model.forward({ids, chunks, kv->arena().view(), {}}, {logits.data(), argmax.data()});
    }
    EXPECT_TRUE(status.ok()) << status.to_string();
    if (!status.ok()) return out;
    out.logits.insert(out.logits.end(), logits.begin(), logits.end());
    ids = argmax;
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      chunks[i] = {slots[i], lengths[i], 1};
      ++lengths[i];
    }
  }
  return out;
}

std::unique_ptr<Model> cpu_model(const TinyModel& tiny, const WeightOptions& weights) {
  CpuModelOptions options;
  options.threads = 1;
  options.weights = weights;
  auto made = make_cpu_model(tiny.config(), tiny.weights(), options);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? std::move(made).value() : nullptr;
}

// Weights whose experts are cached in `slots` slots (on a lent driver and governor if given).
WeightOptions cached_in(const ModelConfig& config, std::uint32_t slots, Driver* driver = nullptr,
                        Governor* governor = nullptr) {
  WeightOptions options;
  options.driver = driver;
  options.governor = governor;
  options.budget_bytes = expert_cache_budget_for(weight_sizes(config, DType::kFp32), kPage, slots);
  return options;
}

class MoeExpertCacheCpu : public ::testing::TestWithParam<const char*> {};

TEST_P(MoeExpertCacheCpu, AnyNumberOfSlotsGivesTheResidentLogitsBitForBit) {
  const ModelConfig config = testing::tiny_moe_config(GetParam());
  TinyModel tiny(config, TensorDType::kF32, 21);
  auto resident = cpu_model(tiny, {});
  ASSERT_NE(resident, nullptr);
  const Steps want = run_steps(*resident);
  ASSERT_FALSE(want.logits.empty());
  EXPECT_EQ(resident->weight_stats().experts.slots, 0u);
  const std::uint32_t all = config.moe.sparse_layers() * config.moe.experts;
  for (std::uint32_t slots : {config.moe.top_k, config.moe.top_k + 1, all / 2, all - 1}) {
    SCOPED_TRACE(std::to_string(slots) + " slots");
    auto cached = cpu_model(tiny, cached_in(config, slots));
    ASSERT_NE(cached, nullptr);
    const WeightStats before = cached->weight_stats();
    ASSERT_EQ(before.experts.slots, slots);
    EXPECT_EQ(before.split.streamed_layers, 0u);
    EXPECT_EQ(before.physical_bytes, before.split.device_bytes);
    const Steps got = run_steps(*cached);
    EXPECT_EQ(got.logits, want.logits);
    const ExpertCacheStats stats = cached->weight_stats().experts;
    EXPECT_EQ(stats.hits + stats.misses, stats.lookups);
    EXPECT_EQ(stats.bytes_copied, stats.misses * before.split.sizes.expert_bytes);
    // 23 prompt tokens of top_k experts each want every expert of a layer: a cache with fewer
    // slots than experts misses.
    EXPECT_GT(stats.misses, 0u);
    if (slots >= all / 2) {
      EXPECT_GT(stats.hits, 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, MoeExpertCacheCpu,
                         ::testing::Values("qwen3_moe", "mixtral", "qwen2_moe"));

// A copy failed mid-step: the step fails naming the expert, the cache keeps every mapping, and
// the same step run again gives the resident model's logits.
TEST(MoeExpertCacheFaults, AFailedCopyFailsTheStepByNameAndLosesNothing) {
  const ModelConfig config = testing::tiny_moe_config("qwen3_moe");
  TinyModel tiny(config, TensorDType::kF32, 22);
  auto resident = cpu_model(tiny, {});
  ASSERT_NE(resident, nullptr);
  const Steps want = run_steps(*resident);
  auto host = make_host_driver();
  ASSERT_TRUE(host.ok());
  const std::uint32_t slots = config.moe.top_k + 2;
  for (std::uint64_t nth : {1u, 2u, 5u, 9u}) {
    SCOPED_TRACE("copy " + std::to_string(nth) + " after the load");
    FaultDriver faults(**host);
    Governor governor;
    auto cached = cpu_model(tiny, cached_in(config, slots, &faults, &governor));
    ASSERT_NE(cached, nullptr);
    faults.fail_nth(DriverOp::kCopy, nth);
    const Steps got = run_steps(*cached, /*retry_after_failure=*/true);
    ASSERT_EQ(faults.injected(), 1u);
    ASSERT_FALSE(got.failed.ok());
    EXPECT_TRUE(test::contains(got.failed.to_string(), "expert cache: copying expert "))
        << got.failed.to_string();
    EXPECT_TRUE(test::contains(got.failed.to_string(), "injected")) << got.failed.to_string();
    EXPECT_EQ(got.logits, want.logits);
  }
}

// Every driver call of a cached load failed in turn: a clear error, and every handle, mapping,
// reservation and governed byte back.
TEST(MoeExpertCacheFaults, EveryFailedLoadCallLeavesNothingBehind) {
  const ModelConfig config = testing::tiny_moe_config("mixtral");
  TinyModel tiny(config, TensorDType::kF32, 23);
  auto host = make_host_driver();
  ASSERT_TRUE(host.ok());
  std::uint64_t failed = 0;
  for (std::uint64_t k = 1;; ++k) {
    ASSERT_LT(k, 10000u) << "the load never succeeded";
    FaultDriver faults(**host);
    Governor governor;
    faults.fail_nth_call(k);
    CpuModelOptions options;
    options.threads = 1;
    options.weights = cached_in(config, 3, &faults, &governor);
    {
      auto made = make_cpu_model(config, tiny.weights(), options);
      if (faults.injected() == 0) {
        ASSERT_TRUE(made.ok()) << made.status().to_string();
        EXPECT_EQ((*made)->weight_stats().experts.slots, 3u);
        break;
      }
      ++failed;
      ASSERT_FALSE(made.ok()) << "call " << k;
      EXPECT_TRUE(test::contains(made.status().to_string(), "weights"))
          << made.status().to_string();
    }
    const HostDriverTables tables = host_driver_tables(**host);
    EXPECT_EQ(tables.handles, 0u) << "call " << k;
    EXPECT_EQ(tables.mappings, 0u) << "call " << k;
    EXPECT_EQ(tables.reservations, 0u) << "call " << k;
    for (TierId t = 0; t < governor.tier_count(); ++t) {
      EXPECT_EQ(governor.stats(t).used, 0u) << "call " << k;
    }
  }
  // The preload's copies are among the calls failed.
  EXPECT_GT(failed, 3u);
}

}  // namespace
}  // namespace kvvm::model
