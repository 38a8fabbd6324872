// Tenants and the prefix cache: the tenant is the cache's salt, so a second tenant with the
// same long system prompt finds nothing cached (no hit, no shared KV), while the same tenant
// again reuses its windows. The tokens are the same in every case.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvvm/kv/arena.h"
#include "support/engine_harness.h"

namespace kvvm::engine {
namespace {

using testing::EngineRig;
using testing::FixtureModel;
using testing::Outcome;
using testing::rig_prompt;
using testing::solo_tokens;

constexpr std::uint32_t kTenantSystemTokens = 32;  // four whole windows

EngineRequest request_of(std::uint64_t tenant, std::uint64_t question, bool seeded) {
  EngineRequest request;
  request.prompt = rig_prompt(kTenantSystemTokens, 3);
  const std::vector<std::int32_t> tail = rig_prompt(5, 90 + question);
  request.prompt.insert(request.prompt.end(), tail.begin(), tail.end());
  request.max_tokens = 8;
  request.use_model_eos = false;
  request.tenant = tenant;
  if (seeded) {
    request.sampling.temperature = 0.7f;
    request.sampling.top_p = 0.9f;
    request.sampling.seed = 404;
  }
  return request;
}

// Runs one request alone on the rig's engine; returns its outcome and the prefix-cache hits
// it added.
struct Served {
  Outcome outcome;
  std::uint64_t new_hits = 0;
};
Served serve(EngineRig& rig, const EngineRequest& request) {
  const std::uint64_t hits = rig.engine().stats().prefix.hits;
  const std::size_t i = rig.submit(request);
  const Status run = rig.run();
  EXPECT_TRUE(run.ok()) << run.to_string();
  Served served{rig.outcome(i), rig.engine().stats().prefix.hits - hits};
  EXPECT_TRUE(served.outcome.completed())
      << "tenant " << request.tenant << ": " << served.outcome.error.to_string();
  return served;
}

TEST(EngineTenant, TenantsNeverShareCachedPrefixes) {
  auto model = testing::load_fixture("llama-tiny", testing::kSmallStepLimits);
  ASSERT_NE(model, nullptr);
  for (const bool seeded : {false, true}) {
    const std::string where = seeded ? "seeded sampling" : "greedy";
    const EngineOptions options;
    auto rig = EngineRig::make(*model, testing::small_space_options(), options);
    ASSERT_NE(rig, nullptr);
    const std::vector<std::int32_t> alone =
        solo_tokens(*model, testing::small_space_options(), options, request_of(1, 0, seeded));
    ASSERT_EQ(alone.size(), 8u) << where;

    const Served first = serve(*rig, request_of(1, 0, seeded));
    EXPECT_EQ(first.outcome.stats.cached_tokens, 0u) << where << ": nothing was cached yet";
    EXPECT_EQ(first.outcome.tokens, alone) << where;

    // Another tenant, the very same prompt: a miss, and no hit counted anywhere.
    const Served other = serve(*rig, request_of(2, 0, seeded));
    EXPECT_EQ(other.outcome.stats.cached_tokens, 0u) << where << ": tenant 2 used tenant 1's KV";
    EXPECT_EQ(other.new_hits, 0u) << where;
    EXPECT_EQ(other.outcome.tokens, alone) << where;

    // The first tenant again: its system prompt's windows are found.
    const Served again = serve(*rig, request_of(1, 0, seeded));
    EXPECT_GE(again.outcome.stats.cached_tokens, kTenantSystemTokens) << where;
    EXPECT_LT(again.outcome.stats.cached_tokens, again.outcome.request.prompt.size()) << where;
    EXPECT_GT(again.new_hits, 0u) << where;
    EXPECT_EQ(again.outcome.tokens, alone) << where;

    // The second tenant again hits its own entries, and a new question of the first tenant
    // shares the system prompt only.
    const Served other_again = serve(*rig, request_of(2, 0, seeded));
    EXPECT_GE(other_again.outcome.stats.cached_tokens, kTenantSystemTokens) << where;
    EXPECT_EQ(other_again.outcome.tokens, alone) << where;
    const EngineRequest question = request_of(1, 1, seeded);
    const Served asked = serve(*rig, question);
    EXPECT_EQ(asked.outcome.stats.cached_tokens, kTenantSystemTokens) << where;
    EXPECT_EQ(asked.outcome.tokens,
              solo_tokens(*model, testing::small_space_options(), options, question))
        << where;

    // A third tenant beside the first in one batch: still a miss for it.
    const std::size_t mine = rig->submit(request_of(1, 0, seeded));
    const std::size_t theirs = rig->submit(request_of(3, 0, seeded));
    ASSERT_TRUE(rig->run().ok()) << where;
    EXPECT_GE(rig->outcome(mine).stats.cached_tokens, kTenantSystemTokens) << where;
    EXPECT_EQ(rig->outcome(theirs).stats.cached_tokens, 0u) << where;
    EXPECT_EQ(rig->outcome(mine).tokens, alone) << where;
    EXPECT_EQ(rig->outcome(theirs).tokens, alone) << where;
    EXPECT_EQ(rig->kv().arena().stats().active_slots, 0u) << where;
    rig->expect_ledger_returns(where);
  }
}

// A parked slot: with every slot taken, a finished one is emptied for the next request of
// another tenant, unless there are slots beyond the running sequences where the ended ones
// stay mapped. Then the next request of the same tenant lands in the slot that still maps its
// system prompt. The tokens are the same either way.
TEST(EngineTenant, AParkedSlotKeepsATenantsPromptMappedForItsNextRequest) {
  auto model = testing::load_fixture("llama-tiny", testing::kSmallStepLimits);
  ASSERT_NE(model, nullptr);
  const EngineOptions options;
  const EngineRequest last = request_of(1, 2, false);
  const std::vector<std::int32_t> alone =
      solo_tokens(*model, testing::small_space_options(), options, last);
  for (const std::uint32_t parked : {0u, 1u}) {
    const std::string where = "parked slots " + std::to_string(parked);
    KvSpaceOptions space = testing::small_space_options();
    space.sequences = 1;  // and the padding slot, which no CPU engine takes
    space.parked_slots = parked;
    auto rig = EngineRig::make(*model, space, options);
    ASSERT_NE(rig, nullptr);
    EXPECT_EQ(rig->kv().options().max_slots, 2u + parked) << where;
    // Tenant 1 publishes its prompt; its second question shares it; tenants 2 and 3 follow.
    for (const EngineRequest& request : {request_of(1, 0, false), request_of(1, 1, false),
                                         request_of(2, 0, false), request_of(3, 0, false)}) {
      serve(*rig, request);
    }
    const ArenaStats before = rig->kv().arena().stats();
    const Served served = serve(*rig, last);
    const ArenaStats after = rig->kv().arena().stats();
    EXPECT_EQ(served.outcome.stats.cached_tokens, kTenantSystemTokens) << where;
    EXPECT_EQ(after.shared_admissions, before.shared_admissions + 1) << where;
    EXPECT_EQ(after.reused_admissions, before.reused_admissions + parked)
        << where << ": the slot of tenant 1's second question still maps its system prompt only "
        << "where it was parked";
    EXPECT_EQ(served.outcome.tokens, alone) << where;
    rig->expect_ledger_returns(where);
  }
}

}  // namespace
}  // namespace kvvm::engine
