// The expert cache alone: the split that makes it (every layer's dense part resident, slots in
// what the budget leaves), the slots' bookkeeping against a model of their contents
// (rapidcheck), the frequency policy, and a failed copy leaving every mapping as it was.
#include "model/weights/expert_cache.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kvvm/model/weight_memory.h"
#include "support/text_match.h"
#include "support/tiny_model.h"

namespace kvvm::model::detail {
namespace {

constexpr std::uint64_t kPage = 4096;

WeightSizes tiny_sizes() {
  return weight_sizes(testing::tiny_moe_config("qwen3_moe"), DType::kFp32);
}

TEST(ExpertCacheSplit, KeepsTheDensePartResidentAndCachesTheExpertsInTheRest) {
  const WeightSizes sizes = tiny_sizes();
  ASSERT_EQ(sizes.sparse_layers, 2u);
  ASSERT_EQ(sizes.experts, 8u);
  for (std::uint32_t slots : {4u, 5u, 11u, 15u}) {
    const std::uint64_t budget = expert_cache_budget_for(sizes, kPage, slots);
    auto split = plan_weight_split(sizes, kPage, budget, 0, ExpertPlacement::kCache, 4);
    ASSERT_TRUE(split.ok()) << split.status().to_string();
    EXPECT_EQ(split->expert_slots, slots);
    EXPECT_TRUE(split->expert_cache());
    EXPECT_EQ(split->streamed_layers, 0u);
    EXPECT_EQ(split->ring_slots, 0u);
    EXPECT_LE(split->device_bytes, budget);
    EXPECT_EQ(split->layer_block, (sizes.dense_layer_bytes() + kPage - 1) / kPage * kPage);
    EXPECT_GE(split->expert_region, std::uint64_t{slots} * sizes.expert_bytes);
    EXPECT_EQ(split->host_staging_bytes, sizes.expert_total());
    EXPECT_TRUE(test::contains(split->describe(),
                               "an expert cache of " + std::to_string(slots) + " slots of "))
        << split->describe();
    // A page less holds one slot fewer.
    auto tighter = plan_weight_split(sizes, kPage, budget - kPage, 0, ExpertPlacement::kCache, 4);
    if (slots > 4) {
      ASSERT_TRUE(tighter.ok()) << tighter.status().to_string();
      EXPECT_LT(tighter->expert_slots, slots);
    }
  }
}

TEST(ExpertCacheSplit, RefusesABudgetBelowOneTokensExpertsAndNamesTheLeast) {
  const WeightSizes sizes = tiny_sizes();
  const std::uint64_t least = expert_cache_budget_for(sizes, kPage, 4);
  auto split = plan_weight_split(sizes, kPage, least - kPage, 0, ExpertPlacement::kCache, 4);
  ASSERT_FALSE(split.ok());
  EXPECT_TRUE(test::contains(split.status().to_string(), "caching the experts needs at least"))
      << split.status().to_string();
  EXPECT_TRUE(test::contains(split.status().to_string(), "4 expert slots of"))
      << split.status().to_string();
}

TEST(ExpertCacheSplit, AFittingBudgetOrLayerPlacementMakesNoCache) {
  const WeightSizes sizes = tiny_sizes();
  auto all = plan_weight_split(sizes, kPage, sizes.total() * 2, 0, ExpertPlacement::kCache, 4);
  ASSERT_TRUE(all.ok());
  EXPECT_FALSE(all->expert_cache());
  const std::uint64_t budget = weight_budget_for(sizes, kPage, 0, 0) - 1;
  auto layers = plan_weight_split(sizes, kPage, budget, 0, ExpertPlacement::kWithLayers, 4);
  auto cached = plan_weight_split(sizes, kPage, budget, 0, ExpertPlacement::kCache, 4);
  ASSERT_TRUE(cached.ok()) << cached.status().to_string();
  EXPECT_TRUE(cached->expert_cache());
  // Three layers are too few to stream through a ring of two: only the cache serves it.
  EXPECT_FALSE(layers.ok());
  // A dense model ignores the placement.
  const WeightSizes dense = weight_sizes(testing::tiny_config(), DType::kFp32);
  auto plain = plan_weight_split(dense, kPage, dense.total() / 2, 0, ExpertPlacement::kCache, 4);
  EXPECT_FALSE(plain.ok() && plain->expert_cache());
}

// A cache over plain memory: slots in `device`, every expert's bytes in `staging` (expert i's
// bytes all equal to i + 1), the copy a memcpy that fails when `fail` says so.
struct CacheRig {
  CacheRig(std::uint32_t layers, std::uint32_t experts, std::uint32_t slots)
      : shape{layers, experts, slots, 64},
        staging(std::uint64_t{layers} * experts * shape.expert_bytes),
        device(std::uint64_t{slots} * shape.expert_bytes, 0) {
    for (std::uint32_t i = 0; i < layers * experts; ++i) {
      std::memset(&staging[i * shape.expert_bytes], static_cast<int>(i + 1), shape.expert_bytes);
    }
    cache.emplace(shape, reinterpret_cast<Address>(device.data()), staging.data(),
                  [this](Address to, const unsigned char* from, std::uint64_t bytes) {
                    ++copies;
                    if (fail) return Status::Internal("injected copy failure");
                    std::memcpy(reinterpret_cast<unsigned char*>(to), from, bytes);
                    return Status::Ok();
                  });
  }

  // Acquires `ids` of `layer` (one row each unless `rows`) and checks that every address holds
  // its expert's bytes.
  Status acquire(std::uint32_t layer, const std::vector<std::uint32_t>& ids,
                 std::vector<std::uint32_t> rows = {}) {
    if (rows.empty()) rows.assign(ids.size(), 1);
    std::vector<Address> at(ids.size());
    Status status = cache->acquire(layer, ids, rows, at);
    if (!status.ok()) return status;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto* bytes = reinterpret_cast<const unsigned char*>(at[i]);
      const unsigned char want = static_cast<unsigned char>(layer * shape.experts + ids[i] + 1);
      for (std::uint64_t b = 0; b < shape.expert_bytes; ++b) {
        if (bytes[b] != want) return Status::Internal("slot holds the wrong expert");
      }
    }
    return status;
  }

  ExpertCacheShape shape;
  std::vector<unsigned char> staging;
  std::vector<unsigned char> device;
  std::optional<ExpertCache> cache;
  bool fail = false;
  std::uint64_t copies = 0;
};

TEST(ExpertCache, PreloadSpreadsTheSlotsOverTheLayers) {
  CacheRig rig(2, 8, 5);
  ASSERT_TRUE(rig.cache->preload().ok());
  EXPECT_EQ(rig.copies, 5u);
  // Slot s: expert s / 2 of layer s % 2.
  EXPECT_EQ(rig.cache->slot_of(0, 0), 0u);
  EXPECT_EQ(rig.cache->slot_of(1, 0), 1u);
  EXPECT_EQ(rig.cache->slot_of(0, 2), 4u);
  EXPECT_EQ(rig.cache->slot_of(1, 2), std::nullopt);
  const ExpertCacheStats stats = rig.cache->stats();
  EXPECT_EQ(stats.slots, 5u);
  EXPECT_EQ(stats.experts, 16u);
  EXPECT_EQ(stats.bytes_copied, 0u);  // the load's fill is not a miss
}

TEST(ExpertCache, CountsHitsAndMissesAndCopiesOnlyMisses) {
  CacheRig rig(2, 8, 4);
  ASSERT_TRUE(rig.cache->preload().ok());  // layer 0: 0, 1; layer 1: 0, 1
  rig.copies = 0;
  ASSERT_TRUE(rig.acquire(0, {0, 1}).ok());
  EXPECT_EQ(rig.copies, 0u);
  ASSERT_TRUE(rig.acquire(0, {1, 5}).ok());
  EXPECT_EQ(rig.copies, 1u);
  const ExpertCacheStats stats = rig.cache->stats();
  EXPECT_EQ(stats.lookups, 4u);
  EXPECT_EQ(stats.hits, 3u);
  EXPECT_EQ(stats.misses, 1u);
  EXPECT_EQ(stats.bytes_copied, 64u);
  EXPECT_DOUBLE_EQ(stats.hit_rate(), 0.75);
  EXPECT_TRUE(test::contains(stats.describe(4), "hit rate 75.0% (3 of 4 lookups)"))
      << stats.describe(4);
}

TEST(ExpertCache, EvictsTheLeastRoutedAndNeverAnExpertWantedNow) {
  CacheRig rig(1, 8, 3);
  ASSERT_TRUE(rig.cache->preload().ok());  // 0, 1, 2
  ASSERT_TRUE(rig.acquire(0, {0, 1, 2}, {50, 3, 20}).ok());
  ASSERT_TRUE(rig.acquire(0, {7}).ok());  // evicts 1, the least routed
  EXPECT_EQ(rig.cache->slot_of(0, 1), std::nullopt);
  EXPECT_NE(rig.cache->slot_of(0, 0), std::nullopt);
  EXPECT_NE(rig.cache->slot_of(0, 2), std::nullopt);
  // Every slot wanted at once: the three misses take the three slots, none evicting another.
  ASSERT_TRUE(rig.acquire(0, {3, 4, 5}).ok());
  for (std::uint32_t e : {3u, 4u, 5u}) EXPECT_NE(rig.cache->slot_of(0, e), std::nullopt);
}

TEST(ExpertCache, BreaksEqualCountsByRecency) {
  CacheRig rig(1, 8, 2);
  ASSERT_TRUE(rig.cache->preload().ok());  // 0, 1
  ASSERT_TRUE(rig.acquire(0, {1}).ok());
  ASSERT_TRUE(rig.acquire(0, {0}).ok());  // both counted once; 1 is older
  ASSERT_TRUE(rig.acquire(0, {6}).ok());
  EXPECT_EQ(rig.cache->slot_of(0, 1), std::nullopt);
  EXPECT_NE(rig.cache->slot_of(0, 0), std::nullopt);
}

TEST(ExpertCache, ForgetsOldRoutingSoANewWorkingSetSettles) {
  CacheRig rig(1, 8, 2);
  ASSERT_TRUE(rig.cache->preload().ok());
  ASSERT_TRUE(rig.acquire(0, {0}, {100000}).ok());  // heavy once, never again
  std::uint64_t hits_before = 0;
  const std::uint64_t rounds = 25 * kDecayAcquires;
  for (std::uint64_t i = 0; i < rounds; ++i) {
    if (i + 100 == rounds) hits_before = rig.cache->stats().hits;
    ASSERT_TRUE(rig.acquire(0, {static_cast<std::uint32_t>(1 + i % 2)}).ok());
  }
  // Without the halving expert 0 would hold its slot and 1 and 2 would miss forever.
  EXPECT_EQ(rig.cache->stats().hits - hits_before, 100u);
  EXPECT_EQ(rig.cache->slot_of(0, 0), std::nullopt);
}

TEST(ExpertCache, AFailedCopyLeavesEveryMappingAsItWasAndNamesTheExpert) {
  CacheRig rig(2, 8, 4);
  ASSERT_TRUE(rig.cache->preload().ok());
  std::vector<std::optional<std::uint32_t>> before;
  for (std::uint32_t l = 0; l < 2; ++l) {
    for (std::uint32_t e = 0; e < 8; ++e) before.push_back(rig.cache->slot_of(l, e));
  }
  rig.fail = true;
  const Status failed = rig.acquire(1, {0, 6});
  ASSERT_FALSE(failed.ok());
  EXPECT_TRUE(test::contains(failed.to_string(), "expert 6 of sparse layer 1"))
      << failed.to_string();
  EXPECT_TRUE(test::contains(failed.to_string(), "injected copy failure")) << failed.to_string();
  std::vector<std::optional<std::uint32_t>> after;
  for (std::uint32_t l = 0; l < 2; ++l) {
    for (std::uint32_t e = 0; e < 8; ++e) after.push_back(rig.cache->slot_of(l, e));
  }
  EXPECT_EQ(before, after);
  EXPECT_EQ(rig.cache->stats().misses, 0u);
  // Every slot still holds its expert, and the next try succeeds.
  rig.fail = false;
  ASSERT_TRUE(rig.acquire(0, {0, 1}).ok());
  ASSERT_TRUE(rig.acquire(1, {0, 1}).ok());
  ASSERT_TRUE(rig.acquire(1, {0, 6}).ok());
}

// Any sequence of acquisitions: every address returned holds the expert asked for, each
// expert sits in at most one slot, and hits + misses = lookups.
RC_GTEST_PROP(ExpertCacheProperty, EveryAddressHoldsItsExpert, ()) {
  const auto layers = *rc::gen::inRange<std::uint32_t>(1, 4);
  const auto experts = *rc::gen::inRange<std::uint32_t>(1, 10);
  const auto slots = *rc::gen::inRange<std::uint32_t>(1, layers * experts + 1);
  CacheRig rig(layers, experts, slots);
  RC_ASSERT(rig.cache->preload().ok());
  const auto steps = *rc::gen::inRange(1, 60);
  for (int s = 0; s < steps; ++s) {
    const auto layer = *rc::gen::inRange<std::uint32_t>(0, layers);
    const auto want = *rc::gen::inRange<std::uint32_t>(1, std::min(slots, experts) + 1);
    std::set<std::uint32_t> ids;
    while (ids.size() < want) ids.insert(*rc::gen::inRange<std::uint32_t>(0, experts));
    std::vector<std::uint32_t> rows;
    for (std::size_t i = 0; i < ids.size(); ++i) rows.push_back(*rc::gen::inRange(1, 9));
    const Status status =
        rig.acquire(layer, std::vector<std::uint32_t>(ids.rbegin(), ids.rend()), rows);
    RC_ASSERT(status.ok());
  }
  std::set<std::uint32_t> used;
  for (std::uint32_t l = 0; l < layers; ++l) {
    for (std::uint32_t e = 0; e < experts; ++e) {
      if (auto slot = rig.cache->slot_of(l, e)) RC_ASSERT(used.insert(*slot).second);
    }
  }
  RC_ASSERT(used.size() == slots);
  const ExpertCacheStats stats = rig.cache->stats();
  RC_ASSERT(stats.hits + stats.misses == stats.lookups);
  RC_ASSERT(stats.bytes_copied == stats.misses * rig.shape.expert_bytes);
}

}  // namespace
}  // namespace kvvm::model::detail
