// KV events from the prefix cache (docs/ARCHITECTURE.md "KV events"): a router that keeps the
// blocks the events report agrees with kvvm's hits. Over the prefix cache itself, the set of
// blocks the events leave equals the set the cache would hit, after every admission, publish,
// end and eviction; through a real engine, every request's cached tokens equal what the router
// predicted before it was sent.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/kv/prefix/prefix_cache.h"
#include "support/engine_harness.h"
#include "support/kv_events_index.h"

namespace kvvm::engine {
namespace {

using kvvm::testing::KvEventsIndex;
using testing::llama;

std::vector<TokenId> as_ids(const std::vector<std::int32_t>& ids) {
  return {ids.begin(), ids.end()};
}

// Prompts sharing a per-tenant system prompt, some of them a second, longer common part, the
// rest random: enough distinct tokens to fill a small budget and make the cache evict.
std::vector<std::int32_t> shared_prompt(std::mt19937_64& rng, std::uint64_t salt) {
  std::vector<std::int32_t> prompt = testing::rig_prompt(24, 100 + salt);
  if (rng() % 2 == 0) {
    const std::vector<std::int32_t> branch = testing::rig_prompt(20, 200 + salt * 10 + rng() % 3);
    prompt.insert(prompt.end(), branch.begin(), branch.end());
  }
  const std::vector<std::int32_t> tail = testing::rig_prompt(8 + rng() % 40, rng());
  prompt.insert(prompt.end(), tail.begin(), tail.end());
  return prompt;
}

struct Written {
  std::uint64_t salt = 0;
  std::vector<TokenId> ids;
};

// The blocks a router holds, checked block by block against what the cache would hit.
void expect_index_equals_cache(const KvEventsIndex& index, const PrefixCache& cache,
                               const std::vector<Written>& written, std::size_t* held) {
  const std::uint64_t b = cache.event_block_tokens();
  std::set<std::uint64_t> seen;
  for (const Written& w : written) {
    std::uint64_t hash = block_hash_root(w.salt);
    for (std::uint64_t end = b; end <= w.ids.size(); end += b) {
      hash = block_hash(hash, std::span<const TokenId>(w.ids).subspan(end - b, b));
      std::vector<TokenId> probe(w.ids.begin(), w.ids.begin() + static_cast<std::ptrdiff_t>(end));
      probe.push_back(0);  // a token to compute: the hit may then cover the whole block
      const bool hits = cache.lookup(probe, w.salt) >= end;
      const bool router = index.predicted_hit(probe, w.salt) >= end;
      ASSERT_EQ(router, hits) << "block ending at token " << end << " of a " << w.ids.size()
                              << "-token sequence of salt " << w.salt;
      if (hits) seen.insert(hash);
    }
  }
  // Every block the router holds is one of those probed: nothing stale is left in the index.
  EXPECT_EQ(index.size(), seen.size());
  *held = seen.size();
}

TEST(KvEvents, TheRoutersBlocksAreExactlyThoseTheCacheWouldHit) {
  // A budget of a few sequences: the cache evicts as new prompts come.
  std::unique_ptr<KvSpace> kv = testing::make_kv(llama().config, 6, 128, 0);
  ASSERT_NE(kv, nullptr);
  // Room for about 80 windows, far less than the prompts below publish.
  const std::uint64_t window_bytes = kv->arena().plan().fragments * kv->arena().plan().granule;
  kv = testing::make_kv(llama().config, 6, 128, 80 * window_bytes);
  ASSERT_NE(kv, nullptr);
  const LayoutPlan& plan = kv->arena().plan();
  KvEventsIndex index({1, 2});
  PrefixCacheOptions options;
  options.model_identity = "kv-events-test";
  options.observer = &index;
  auto made = PrefixCache::create(kv->arena(), kv->governor(), options);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  std::unique_ptr<PrefixCache> cache = std::move(made).value();
  EXPECT_EQ(index.cleared_count(), 1u);  // a new cache says so
  const std::uint64_t unit = hit_unit_tokens(plan.granule, plan.contiguous_bytes_per_token);
  EXPECT_EQ(cache->event_block_tokens() % unit, 0u);
  EXPECT_GE(cache->event_block_tokens(), 16u);

  std::mt19937_64 rng(7);
  std::vector<Written> written;
  std::size_t held = 0, most_held = 0;
  std::uint64_t hits = 0;
  for (int i = 0; i < 150; ++i) {
    const std::uint64_t salt = 1 + rng() % 2;
    const std::vector<TokenId> prompt = as_ids(shared_prompt(rng, salt));
    Result<CacheAdmission> admitted = cache->admit(prompt, salt);
    if (!admitted.ok()) continue;  // no room even after eviction: nothing changed
    hits += admitted->cached_tokens;
    ASSERT_TRUE(cache->written(admitted->slot, prompt.size()).ok());
    written.push_back({salt, prompt});
    ASSERT_NO_FATAL_FAILURE(expect_index_equals_cache(index, *cache, written, &held));
    ASSERT_TRUE(cache->finish(admitted->slot).ok());
    ASSERT_NO_FATAL_FAILURE(expect_index_equals_cache(index, *cache, written, &held));
    most_held = std::max(most_held, held);
  }
  // The test can fail only if blocks came and went and hits happened.
  EXPECT_GT(most_held, 4u);
  EXPECT_GT(index.removed_blocks(), 10u) << "the budget never made the cache evict";
  EXPECT_GT(hits, 0u);
  cache.reset();
  EXPECT_EQ(index.cleared_count(), 2u);  // a cache that goes says so
  EXPECT_EQ(index.size(), 0u);
}

TEST(KvEvents, ABlockSizeThatHitsCannotEndOnIsRefused) {
  std::unique_ptr<KvSpace> kv = testing::make_kv(llama().config, 2, 128, 0);
  ASSERT_NE(kv, nullptr);
  const LayoutPlan& plan = kv->arena().plan();
  const std::uint64_t unit = hit_unit_tokens(plan.granule, plan.contiguous_bytes_per_token);
  KvEventsIndex index({0});
  PrefixCacheOptions options;
  options.observer = &index;
  options.event_block_tokens = unit + 1;
  if (unit == 1) options.event_block_tokens = 0;  // every size is a multiple of 1
  auto made = PrefixCache::create(kv->arena(), kv->governor(), options);
  if (unit == 1) {
    EXPECT_TRUE(made.ok());
  } else {
    ASSERT_FALSE(made.ok());
    EXPECT_NE(made.status().to_string().find("multiple of " + std::to_string(unit)),
              std::string::npos)
        << made.status().to_string();
  }
}

TEST(KvEvents, AnEnginesHitsAreWhatTheRouterPredicted) {
  KvEventsIndex index({1, 2});
  KvSpaceOptions kv_options;
  kv_options.max_slots = 4;
  kv_options.max_context = 128;
  kv_options.host_granule = 0;
  kv_options.cache_observer = &index;
  std::unique_ptr<KvSpace> probe = testing::make_kv(llama().config, kv_options);
  ASSERT_NE(probe, nullptr);
  const LayoutPlan& plan = probe->arena().plan();
  kv_options.budget_bytes = 100 * plan.fragments * plan.granule;
  // Blocks of the hit unit: the router's match is then exact (a larger block may leave kvvm
  // up to a block less one unit more than a router predicts, never less).
  kv_options.event_block_tokens = hit_unit_tokens(plan.granule, plan.contiguous_bytes_per_token);
  probe.reset();
  auto rig = testing::EngineRig::make(llama(), kv_options, EngineOptions{});
  ASSERT_NE(rig, nullptr);

  std::mt19937_64 rng(11);
  std::uint64_t hits = 0;
  for (int i = 0; i < 60; ++i) {
    const std::uint64_t salt = 1 + rng() % 2;
    EngineRequest request = testing::greedy_request(shared_prompt(rng, salt), 1 + rng() % 4);
    request.tenant = salt;
    const std::uint64_t predicted = index.predicted_hit(as_ids(request.prompt), salt);
    const std::size_t n = rig->submit(request);
    ASSERT_TRUE(rig->run().ok());
    const testing::Outcome& outcome = rig->outcome(n);
    ASSERT_TRUE(outcome.completed());
    ASSERT_EQ(outcome.stats.cached_tokens, predicted) << "request " << i;
    hits += predicted;
  }
  EXPECT_GT(hits, 0u);
  EXPECT_GT(index.removed_blocks(), 0u) << "the budget never made the cache evict";
  rig->end_engine();
  EXPECT_EQ(index.size(), 0u);  // the engine's cache went, and said so
}

}  // namespace
}  // namespace kvvm::engine
