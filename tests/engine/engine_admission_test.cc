// Scheduling under load, on the CPU: admission takes only the room the running sequences'
// growth leaves, and only with a chunk of the step to compute: a request is never admitted and
// then preempted unrun.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "scheduling_rig.h"
#include "support/engine_harness.h"

namespace kvvm::engine::scheduling_test {

// llama-tiny's token-major token is 2 KiB: a 16 KiB window holds 8 tokens.
constexpr std::uint64_t kWindowBytes = 16 << 10;

KvSpaceOptions windows_space(std::uint64_t windows) {
  KvSpaceOptions options;
  options.host_granule = kWindowBytes;
  options.max_slots = 4;
  options.max_context = 64;
  options.budget_bytes = windows * kWindowBytes;
  return options;
}

// Two windows of budget: A's decode grows into the second while B's prompt would take it. B
// waits; it is not admitted, its prompt committed, and then preempted by A's growth unrun.
TEST(SchedulingAdmission, LeavesTheRoomARunningSequenceGrowsInto) {
  const KvSpaceOptions space = windows_space(2);
  const EngineOptions options = no_cache();
  auto rig = EngineRig::make(llama(), space, options);
  ASSERT_NE(rig, nullptr);
  const std::size_t a = rig->submit(greedy_request(rig_prompt(8, 1), 8));
  ASSERT_TRUE(rig->engine().step().ok());  // A's prompt fills its first window
  ASSERT_EQ(rig->outcome(a).tokens.size(), 1u);
  const std::size_t b = rig->submit(greedy_request(rig_prompt(8, 2), 4));
  ASSERT_TRUE(rig->engine().step().ok());  // A's next token writes into a second window
  EXPECT_EQ(rig->outcome(a).tokens.size(), 2u);
  EngineStats stats = rig->engine().stats();
  EXPECT_EQ(stats.preemptions, 0u);
  EXPECT_EQ(stats.running, 1u);
  EXPECT_EQ(stats.waiting, 1u);

  ASSERT_TRUE(rig->run().ok());
  for (const std::size_t i : {a, b}) {
    const testing::Outcome& o = rig->outcome(i);
    ASSERT_TRUE(o.completed()) << i << ": " << o.error.to_string();
    EXPECT_EQ(o.stats.preemptions, 0u) << i;
    EXPECT_EQ(o.tokens, solo_tokens(llama(), space, options, o.request)) << i;
  }
  EXPECT_EQ(rig->engine().stats().preemptions, 0u);
  rig->expect_ledger_returns("after admission waited for room");
}

// A step whose token budget the running prompt takes admits nothing: a request holds KV only
// from the step that starts computing it.
TEST(SchedulingAdmission, WaitsForAChunkOfTheStepToCompute) {
  KvSpaceOptions space = windows_space(0);
  space.max_context = 128;
  EngineOptions options = no_cache();
  options.step_tokens = 8;
  auto rig = EngineRig::make(llama(), space, options);
  ASSERT_NE(rig, nullptr);
  const std::size_t first = rig->submit(greedy_request(rig_prompt(40, 3), 2));
  const std::size_t second = rig->submit(greedy_request(rig_prompt(5, 4), 2));
  ASSERT_TRUE(rig->engine().step().ok());  // 8 of the first's 40 prompt tokens
  const EngineStats stats = rig->engine().stats();
  EXPECT_EQ(stats.running, 1u);
  EXPECT_EQ(stats.waiting, 1u);
  EXPECT_EQ(rig->kv().arena().stats().active_slots, 1u);
  ASSERT_TRUE(rig->run().ok());
  for (const std::size_t i : {first, second}) {
    const testing::Outcome& o = rig->outcome(i);
    ASSERT_TRUE(o.completed()) << i << ": " << o.error.to_string();
    EXPECT_EQ(o.tokens, solo_tokens(llama(), space, options, o.request)) << i;
  }
  rig->expect_ledger_returns("after admission waited for the step's budget");
}

}  // namespace kvvm::engine::scheduling_test
