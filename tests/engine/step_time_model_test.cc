// StepTimeModel (src/engine/step_time_model.h): the line through the steps' times by their
// tokens, and the prefill share a time-per-token target leaves a decoding step.
#include "engine/step_time_model.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

namespace kvvm::engine::step_time_model_test {
namespace {

using std::chrono::microseconds;

// A step of `tokens` on a GPU that takes `fixed` plus `per_token` a token.
microseconds took(std::uint32_t tokens, int fixed_us, int per_token_us) {
  return microseconds(fixed_us + per_token_us * static_cast<int>(tokens));
}

TEST(StepTimeModel, SaysNothingUntilItHasSeenStepsOfTwoSizes) {
  StepTimeModel model;
  EXPECT_FALSE(model.predict(1).has_value());
  EXPECT_FALSE(model.prefill_share(microseconds(5000), 4, 16).has_value());
  for (int i = 0; i < 20; ++i) model.observe(8, took(8, 1000, 50));
  EXPECT_FALSE(model.predict(8).has_value()) << "one size of step says nothing per token";
  model.observe(40, took(40, 1000, 50));
  ASSERT_TRUE(model.predict(8).has_value());
}

TEST(StepTimeModel, RecoversTheLineOfExactTimes) {
  StepTimeModel model;
  for (const std::uint32_t tokens : {1u, 1u, 64u, 1u, 17u, 200u, 3u}) {
    model.observe(tokens, took(tokens, 1000, 50));
  }
  ASSERT_TRUE(model.predict(0).has_value());
  EXPECT_NEAR(*model.predict(0), 1000e-6, 1e-9);
  EXPECT_NEAR(*model.predict(100), 6000e-6, 1e-9);
  // 1 ms fixed + 50 us a token: a 3.02 ms target with 4 decodes leaves 40.4 - 4 tokens.
  EXPECT_EQ(model.prefill_share(microseconds(3020), 4, 16), 36u);
  // Below what the decodes alone take, the floor: prompts still advance.
  EXPECT_EQ(model.prefill_share(microseconds(1100), 4, 16), 16u);
  EXPECT_EQ(model.prefill_share(microseconds(500), 4, 16), 16u);
}

TEST(StepTimeModel, FollowsALoadThatChanges) {
  StepTimeModel model;
  for (int i = 0; i < 50; ++i) {
    model.observe(1, took(1, 1000, 50));
    model.observe(33, took(33, 1000, 50));
  }
  EXPECT_EQ(model.prefill_share(microseconds(3020), 0, 1), 40u);
  // Longer contexts: every token now costs twice as much.
  for (int i = 0; i < 200; ++i) {
    model.observe(1, took(1, 1000, 100));
    model.observe(33, took(33, 1000, 100));
  }
  EXPECT_EQ(model.prefill_share(microseconds(3020), 0, 1), 20u)
      << "the old steps' weight must have decayed";
}

TEST(StepTimeModel, ATimeThatFallsWithTokensIsNoFit) {
  StepTimeModel model;
  model.observe(1, microseconds(5000));
  model.observe(100, microseconds(1000));
  EXPECT_FALSE(model.predict(1).has_value());
  EXPECT_FALSE(model.prefill_share(microseconds(5000), 1, 16).has_value());
}

}  // namespace
}  // namespace kvvm::engine::step_time_model_test
