// Scheduling under load, on the CPU with a fake clock: max_prefill_tokens_while_decoding bounds
// the prompt tokens of a step that also decodes; tpot_target sizes that bound from the steps'
// measured times (a model whose steps take a known time on the fake clock); ttft_target raises
// it when a prompt waiting for its first token would miss its deadline.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "scheduling_rig.h"
#include "support/engine_harness.h"

namespace kvvm::engine::scheduling_test {

// A running answer gains a token every step while a 40-token prompt beside it is computed two
// tokens a step, not the seven the step's budget would leave; the tokens are those alone.
TEST(SchedulingPrefillShare, BoundsThePromptTokensOfAStepThatDecodes) {
  EngineOptions options = no_cache();
  options.step_tokens = 8;
  options.max_prefill_tokens_while_decoding = 2;
  auto rig = EngineRig::make(llama(), roomy_space(), options);
  ASSERT_NE(rig, nullptr);
  const std::size_t first = rig->submit(greedy_request(rig_prompt(3, 50), 30));
  ASSERT_TRUE(rig->engine().step().ok());  // its prompt and first token
  ASSERT_EQ(rig->outcome(first).tokens.size(), 1u);
  const std::uint64_t before = rig->engine().stats().step_tokens.tokens;
  const std::size_t second = rig->submit(greedy_request(rig_prompt(40, 51), 4));
  for (std::size_t i = 2; i <= 11; ++i) {
    ASSERT_TRUE(rig->engine().step().ok());
    EXPECT_EQ(rig->outcome(first).tokens.size(), i) << "a step without the decode token";
  }
  // Ten steps of one decode token and two prompt tokens: 20 of the 40, no answer yet.
  EXPECT_EQ(rig->engine().stats().step_tokens.tokens - before, 30u);
  EXPECT_TRUE(rig->outcome(second).tokens.empty());
  ASSERT_TRUE(rig->run().ok());
  for (const std::size_t i : {first, second}) {
    const testing::Outcome& o = rig->outcome(i);
    ASSERT_TRUE(o.completed()) << i << ": " << o.error.to_string();
    EXPECT_EQ(o.tokens, solo_tokens(llama(), roomy_space(), no_cache(), o.request)) << i;
  }
  rig->expect_ledger_returns("after bounded prefill");
}

// With nothing decoding the bound does not apply: a lone prompt takes the whole step.
TEST(SchedulingPrefillShare, AStepWithoutADecodeIsNotBounded) {
  EngineOptions options = no_cache();
  options.step_tokens = 8;
  options.max_prefill_tokens_while_decoding = 2;
  auto rig = EngineRig::make(llama(), roomy_space(), options);
  ASSERT_NE(rig, nullptr);
  const std::size_t only = rig->submit(greedy_request(rig_prompt(20, 52), 2));
  ASSERT_TRUE(rig->engine().step().ok());
  EXPECT_EQ(rig->engine().stats().step_tokens.tokens, 8u);
  ASSERT_TRUE(rig->run().ok());
  EXPECT_TRUE(rig->outcome(only).completed());
  rig->expect_ledger_returns("after an unbounded prefill");
}

TEST(SchedulingPrefillShare, ABoundAboveTheStepBudgetIsRefusedNamingIt) {
  testing::FixtureModel& m = llama();
  auto kv = make_kv(m.config, 3);
  ASSERT_NE(kv, nullptr);
  EngineOptions options = no_cache();
  options.step_tokens = 8;
  options.max_prefill_tokens_while_decoding = 9;
  auto made = Engine::create(*m.model, *kv, options);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  const std::string message = made.status().message();
  EXPECT_TRUE(message.find("max_prefill_tokens_while_decoding 9") != std::string::npos) << message;
  EXPECT_TRUE(message.find("step_tokens 8") != std::string::npos) << message;
}

// --- tpot_target --------------------------------------------------------------------------

// Once the fit has seen steps of two sizes, a step that decodes computes only the prompt
// tokens the target leaves: 3 ms at 1 ms + 100 us a token is 20 tokens, one of them the decode.
TEST(SchedulingTpotTarget, KeepsADecodingStepWithinTheTargetOnceFitted) {
  EngineOptions options = no_cache();
  options.step_tokens = 64;
  options.tpot_target = microseconds(3050);
  auto t = timed_rig(options);
  ASSERT_NE(t, nullptr);
  EngineRig& rig = *t->rig;
  const std::size_t first = rig.submit(greedy_request(rig_prompt(30, 60), 20));
  ASSERT_TRUE(rig.engine().step().ok());  // 30 tokens: the prompt and its first token
  ASSERT_TRUE(rig.engine().step().ok());  // 1 token: the fit has two sizes now
  const std::size_t second = rig.submit(greedy_request(rig_prompt(60, 61), 4));
  const std::size_t before = t->model->steps.size();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(rig.engine().step().ok());
  // Each of the three: the decode token and 19 of the 60 prompt tokens (20 x 100 us + 1 ms).
  ASSERT_EQ(t->model->steps.size(), before + 3);
  for (std::size_t i = before; i < before + 3; ++i) {
    EXPECT_EQ(t->model->steps[i], 20u) << "step " << i;
  }
  EXPECT_TRUE(rig.outcome(second).tokens.empty());
  ASSERT_TRUE(rig.run().ok());
  for (const std::size_t i : {first, second}) {
    const testing::Outcome& o = rig.outcome(i);
    ASSERT_TRUE(o.completed()) << i << ": " << o.error.to_string();
    EXPECT_EQ(o.tokens, solo_tokens(llama(), roomy_space(), no_cache(), o.request)) << i;
  }
  rig.expect_ledger_returns("after steps sized to a target");
}

// No bound while the fit has seen steps of one size; a target the decodes alone exceed leaves
// the floor (prompts still advance); max_prefill_tokens_while_decoding still bounds below it.
TEST(SchedulingTpotTarget, BoundsNothingBeforeTheFitAndLeavesTheFloorUnderIt) {
  EngineOptions options = no_cache();
  options.step_tokens = 64;
  options.tpot_target = microseconds(500);  // below even a decode step's 1.1 ms
  auto t = timed_rig(options);
  ASSERT_NE(t, nullptr);
  EngineRig& rig = *t->rig;
  rig.submit(greedy_request(rig_prompt(30, 62), 30));
  ASSERT_TRUE(rig.engine().step().ok());  // 30 tokens
  rig.submit(greedy_request(rig_prompt(40, 63), 30));
  ASSERT_TRUE(rig.engine().step().ok());  // unfitted: the decode and all 40 prompt tokens
  ASSERT_EQ(t->model->steps.back(), 41u);
  rig.submit(greedy_request(rig_prompt(40, 64), 30));
  ASSERT_TRUE(rig.engine().step().ok());  // fitted: two decodes and the floor's 16
  EXPECT_EQ(t->model->steps.back(), 2u + kTpotPrefillFloor);

  EngineOptions both = no_cache();
  both.step_tokens = 64;
  both.tpot_target = microseconds(3050);
  both.max_prefill_tokens_while_decoding = 5;
  auto u = timed_rig(both);
  ASSERT_NE(u, nullptr);
  u->rig->submit(greedy_request(rig_prompt(30, 65), 30));
  ASSERT_TRUE(u->rig->engine().step().ok());
  ASSERT_TRUE(u->rig->engine().step().ok());
  u->rig->submit(greedy_request(rig_prompt(40, 66), 30));
  ASSERT_TRUE(u->rig->engine().step().ok());
  EXPECT_EQ(u->model->steps.back(), 6u) << "the fixed bound is below the target's 19";
  ASSERT_TRUE(rig.run().ok());
  ASSERT_TRUE(u->rig->run().ok());
}

TEST(SchedulingTpotTarget, ANegativeTargetIsRefusedNamingIt) {
  testing::FixtureModel& m = llama();
  auto kv = make_kv(m.config, 3);
  ASSERT_NE(kv, nullptr);
  EngineOptions options = no_cache();
  options.tpot_target = microseconds(-5);
  auto made = Engine::create(*m.model, *kv, options);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("tpot_target -5 us"), std::string::npos)
      << made.status().message();
}

// --- ttft_target --------------------------------------------------------------------------

// The steps of a 60-token prompt submitted beside an answer decoding at a 3.05 ms target (19
// prompt tokens a step at 1 ms + 100 us a token), with `ttft` as the first-token target: each
// step's tokens from the one that admits it to the one that gives its first token, and the
// time from its submit to the end of that step (when the client has the token; the engine's
// RequestStats stamp it at the step's start).
struct TtftRun {
  std::vector<std::size_t> steps;
  double first_token_seconds = 0;
};
TtftRun ttft_run(microseconds tpot, microseconds ttft) {
  EngineOptions options = no_cache();
  options.step_tokens = 64;
  options.tpot_target = tpot;
  options.ttft_target = ttft;
  auto t = timed_rig(options);
  EXPECT_NE(t, nullptr);
  if (t == nullptr) return {};
  EngineRig& rig = *t->rig;
  const std::size_t first = rig.submit(greedy_request(rig_prompt(30, 60), 20));
  EXPECT_TRUE(rig.engine().step().ok());  // 30 tokens: the prompt and its first token
  EXPECT_TRUE(rig.engine().step().ok());  // 1 token: the fit has two sizes now
  const std::size_t second = rig.submit(greedy_request(rig_prompt(60, 61), 4));
  const SteadyClock::time_point submitted = t->clock.now();
  const std::size_t before = t->model->steps.size();
  while (rig.outcome(second).tokens.empty()) {
    EXPECT_TRUE(rig.engine().step().ok());
    EXPECT_EQ(rig.outcome(first).tokens.size(), t->model->steps.size())
        << "a step without the decode token";
    if (t->model->steps.size() > before + 10) break;
  }
  TtftRun run;
  run.first_token_seconds = std::chrono::duration<double>(t->clock.now() - submitted).count();
  run.steps.assign(t->model->steps.begin() + static_cast<std::ptrdiff_t>(before),
                   t->model->steps.end());
  EXPECT_TRUE(rig.run().ok());
  for (const std::size_t i : {first, second}) {
    const testing::Outcome& o = rig.outcome(i);
    EXPECT_TRUE(o.completed()) << i << ": " << o.error.to_string();
    EXPECT_EQ(o.tokens, solo_tokens(llama(), roomy_space(), no_cache(), o.request)) << i;
  }
  rig.expect_ledger_returns("after steps sized to a first-token target");
  return run;
}

// With the time-per-token target alone the prompt takes 19 tokens a step: four steps, its first
// token after 3 x 3 ms + 1.4 ms. A 9-ms first-token target raises the share to the fewest that
// make it: two steps of 30 (4.1 ms each; 20 a step would take three of 3.1 ms, 9.3 ms).
TEST(SchedulingTtftTarget, RaisesADecodingStepsPrefillToMeetTheDeadline) {
  const TtftRun tpot_only = ttft_run(microseconds(3050), microseconds(0));
  EXPECT_EQ(tpot_only.steps, (std::vector<std::size_t>{20, 20, 20, 4}));
  EXPECT_NEAR(tpot_only.first_token_seconds, 10.4e-3, 1e-6);
  const TtftRun both = ttft_run(microseconds(3050), milliseconds(9));
  EXPECT_EQ(both.steps, (std::vector<std::size_t>{31, 31}));
  EXPECT_NEAR(both.first_token_seconds, 8.2e-3, 1e-6);
}

// A target the time-per-token share already meets changes nothing; neither does one without a
// time-per-token target (a decoding step then takes all the step leaves).
TEST(SchedulingTtftTarget, ChangesNothingWhereTheShareAlreadyMeetsIt) {
  const TtftRun generous = ttft_run(microseconds(3050), seconds(1));
  EXPECT_EQ(generous.steps, (std::vector<std::size_t>{20, 20, 20, 4}));
  const TtftRun unbounded = ttft_run(microseconds(0), microseconds(0));
  EXPECT_EQ(unbounded.steps, (std::vector<std::size_t>{61}));
  const TtftRun alone = ttft_run(microseconds(0), milliseconds(9));
  EXPECT_EQ(alone.steps, unbounded.steps);
}

TEST(SchedulingTtftTarget, ANegativeTargetIsRefusedNamingIt) {
  testing::FixtureModel& m = llama();
  auto kv = make_kv(m.config, 3);
  ASSERT_NE(kv, nullptr);
  EngineOptions options = no_cache();
  options.ttft_target = microseconds(-7);
  auto made = Engine::create(*m.model, *kv, options);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("ttft_target -7 us"), std::string::npos)
      << made.status().message();
}

}  // namespace kvvm::engine::scheduling_test
