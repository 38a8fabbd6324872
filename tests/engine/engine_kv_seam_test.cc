// The engine through its one KV seam (KvManager): with the prefix cache on and off the same
// requests get the same tokens; only the cached-token counts and the cache's statistics tell
// the runs apart. A space sized by its sequences adds the padding slot and runs that many.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine_options.h"
#include "support/engine_harness.h"

namespace kvvm::engine {
namespace {

using testing::EngineRig;
using testing::rig_prompt;

constexpr std::uint32_t kSeamSystemTokens = 24;  // three whole windows

EngineRequest request_of(std::uint64_t question, bool seeded) {
  EngineRequest request;
  request.prompt = rig_prompt(kSeamSystemTokens, 5);
  const std::vector<std::int32_t> tail = rig_prompt(4, 60 + question);
  request.prompt.insert(request.prompt.end(), tail.begin(), tail.end());
  request.max_tokens = 10;
  request.use_model_eos = false;
  if (seeded) {
    request.sampling.temperature = 0.8f;
    request.sampling.top_k = 20;
    request.sampling.seed = 77 + question;
  }
  return request;
}

struct SeamRun {
  std::vector<std::vector<std::int32_t>> tokens;
  std::vector<std::uint32_t> cached;
  EngineStats stats;
};

// Two requests one after the other (the second may find the first's windows), then three at
// once.
SeamRun run_with(bool prefix_cache) {
  SeamRun run;
  EngineOptions options;
  options.prefix_cache = prefix_cache;
  auto rig = EngineRig::make(testing::llama(), testing::small_space_options(), options);
  EXPECT_NE(rig, nullptr);
  if (rig == nullptr) return run;
  for (std::uint64_t q = 0; q < 2; ++q) {
    rig->submit(request_of(q, q == 1));
    const Status ran = rig->run();
    EXPECT_TRUE(ran.ok()) << ran.to_string();
  }
  for (std::uint64_t q = 2; q < 5; ++q) rig->submit(request_of(q, q % 2 == 1));
  const Status ran = rig->run();
  EXPECT_TRUE(ran.ok()) << ran.to_string();
  for (const testing::Outcome& o : rig->outcomes()) {
    EXPECT_TRUE(o.completed()) << to_string(o.end) << ": " << o.error.to_string();
    run.tokens.push_back(o.tokens);
    run.cached.push_back(o.stats.cached_tokens);
  }
  run.stats = rig->engine().stats();
  EXPECT_EQ(run.stats.arena.active_slots, 0u);
  rig->expect_ledger_returns(prefix_cache ? "caching on" : "caching off");
  return run;
}

TEST(EngineKvSeam, CachingOnAndOffGiveTheSameTokens) {
  const SeamRun on = run_with(true);
  const SeamRun off = run_with(false);
  ASSERT_EQ(on.tokens.size(), 5u);
  ASSERT_EQ(off.tokens.size(), 5u);
  for (std::size_t i = 0; i < on.tokens.size(); ++i) {
    EXPECT_EQ(on.tokens[i].size(), 10u) << "request " << i;
    EXPECT_EQ(on.tokens[i], off.tokens[i]) << "request " << i;
    EXPECT_EQ(off.cached[i], 0u) << "request " << i << ": cached with the cache off";
  }
  // The second request found the first's system prompt: whole windows of it.
  EXPECT_GE(on.cached[1], 16u);
  EXPECT_EQ(on.cached[1] % 8, 0u);
  EXPECT_EQ(on.stats.cached_tokens,
            on.cached[0] + on.cached[1] + on.cached[2] + on.cached[3] + on.cached[4]);
  EXPECT_GT(on.stats.prefix.hits, 0u);
  EXPECT_GT(on.stats.prefix.published_windows, 0u);

  EXPECT_EQ(off.stats.cached_tokens, 0u);
  EXPECT_EQ(off.stats.prefix.queries, 0u);
  EXPECT_EQ(off.stats.prefix.entries, 0u);
  EXPECT_EQ(off.stats.prefix.published_windows, 0u);
  // The rest of the accounting is the same either way.
  EXPECT_EQ(on.stats.finished, off.stats.finished);
  EXPECT_EQ(on.stats.prompt_tokens, off.stats.prompt_tokens);
  EXPECT_EQ(on.stats.generated_tokens, off.stats.generated_tokens);
  EXPECT_EQ(on.stats.preemptions, 0u);
  EXPECT_EQ(off.stats.preemptions, 0u);
}

// The prefix cache's identity folds in the KV element type and, for fp8, every scale's bits:
// K / V written under one scheme is never served to another.
TEST(EngineKvSeam, CacheKeysSeparateElementTypesAndScales) {
  model::Model& model = *testing::llama().model;
  const model::KvScales original = model.kv_scales();
  EngineOptions options;
  options.model_identity = "llama";
  KvSpaceOptions fp32 = testing::small_space_options();
  KvSpaceOptions fp8 = fp32;
  fp8.kv_dtype = DType::kFp8;
  auto a = testing::make_kv(model.config(), fp32);
  auto b = testing::make_kv(model.config(), fp8);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::string fp32_identity = cache_identity(model, *a, options);
  const std::string fp8_identity = cache_identity(model, *b, options);
  EXPECT_NE(fp32_identity, fp8_identity);
  EXPECT_EQ(cache_identity(model, *b, options), fp8_identity);
  model::KvScales scaled = original;
  scaled.v.back() = std::nextafter(scaled.v.back(), 2.0f);  // one bit of one layer's scale
  ASSERT_TRUE(model.set_kv_scales(scaled).ok());
  EXPECT_NE(cache_identity(model, *b, options), fp8_identity);
  EXPECT_EQ(cache_identity(model, *a, options), fp32_identity);  // a 16/32-bit cache: no scales
  ASSERT_TRUE(model.set_kv_scales(original).ok());
  EXPECT_EQ(cache_identity(model, *b, options), fp8_identity);
}

TEST(EngineKvSeam, SpaceSizedBySequencesAddsThePaddingSlotAndRunsThatMany) {
  KvSpaceOptions kv_options = testing::small_space_options();
  kv_options.sequences = 3;
  auto rig = EngineRig::make(testing::llama(), kv_options, EngineOptions{});
  ASSERT_NE(rig, nullptr);
  EXPECT_EQ(rig->kv().options().max_slots, 3 + kPadSlots);
  EXPECT_EQ(rig->engine().options().max_running, 3u);
  for (std::uint64_t q = 0; q < 5; ++q) rig->submit(request_of(q, false));
  const Status ran = rig->run();
  ASSERT_TRUE(ran.ok()) << ran.to_string();
  for (const testing::Outcome& o : rig->outcomes()) EXPECT_TRUE(o.completed());
  EXPECT_EQ(rig->engine().stats().peak_running, 3u);
  rig->expect_ledger_returns("sized by sequences");
}

}  // namespace
}  // namespace kvvm::engine
