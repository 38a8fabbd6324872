// StepTimeModel (src/engine/step_time_model.h): the line through the steps' times by their
// tokens, the prefill share a time-per-token target leaves a decoding step, and the share the
// prompts waiting for their first token need to meet their deadlines (against a search over
// every share).
#include "engine/step_time_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <vector>

namespace kvvm::engine::step_time_model_test {
namespace {

using std::chrono::microseconds;
using PromptDue = StepTimeModel::PromptDue;

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

// --- deadline_share ---------------------------------------------------------------------

// A model fitted to the exact line of `fixed_us` + `per_token_us` a token.
StepTimeModel ttft_fitted(double fixed_us, double per_token_us) {
  StepTimeModel model;
  for (const std::uint32_t tokens : {1u, 9u, 64u, 3u, 200u, 17u}) {
    model.observe(tokens, std::chrono::nanoseconds(static_cast<std::int64_t>(
                              1000 * (fixed_us + per_token_us * tokens))));
  }
  return model;
}

// When the prompt whose tokens, with those before it, are `cumulative` finishes at `share`
// tokens a step: ceil(cumulative / share) steps, each of decodes + share tokens. `round_up`
// false takes the floor instead (the off-by-one the search must not make).
double ttft_finish(const StepTimeModel& model, std::uint32_t decodes, std::uint64_t cumulative,
                   std::uint32_t share, bool round_up = true) {
  const std::uint64_t steps = round_up ? (cumulative + share - 1) / share : cumulative / share;
  return static_cast<double>(steps) * *model.predict(decodes + share);
}

// What deadline_share must answer, by trying every share from 1: the smallest at which every
// prompt that makes its deadline at `most` (lowered to the prompts' tokens) makes it; 0 when
// none does.
std::uint32_t ttft_brute_force(const StepTimeModel& model, std::uint32_t decodes,
                               std::span<const PromptDue> prompts, std::uint32_t most,
                               bool round_up = true) {
  std::uint64_t total = 0;
  for (const PromptDue& p : prompts) total += p.tokens_left;
  most = static_cast<std::uint32_t>(std::min<std::uint64_t>(most, total));
  if (most == 0) return 0;
  std::vector<std::pair<std::uint64_t, double>> counted;  // cumulative tokens, deadline
  std::uint64_t cumulative = 0;
  for (const PromptDue& p : prompts) {
    cumulative += p.tokens_left;
    if (p.seconds_left > 0 &&
        ttft_finish(model, decodes, cumulative, most, round_up) <= p.seconds_left) {
      counted.emplace_back(cumulative, p.seconds_left);
    }
  }
  if (counted.empty()) return 0;
  for (std::uint32_t share = 1; share <= most; ++share) {
    const bool all = std::all_of(counted.begin(), counted.end(), [&](const auto& c) {
      return ttft_finish(model, decodes, c.first, share, round_up) <= c.second;
    });
    if (all) return share;
  }
  ADD_FAILURE() << "`most` must satisfy every prompt counted";
  return 0;
}

TEST(StepTimeModelDeadline, SaysNothingUntilFitted) {
  StepTimeModel model;
  const PromptDue prompts[] = {{.tokens_left = 100, .seconds_left = 0.01}};
  EXPECT_FALSE(model.deadline_share(4, prompts, 64).has_value());
  for (int i = 0; i < 20; ++i) model.observe(8, took(8, 1000, 50));
  EXPECT_FALSE(model.deadline_share(4, prompts, 64).has_value())
      << "one size of step says nothing per token";
  model.observe(40, took(40, 1000, 50));
  EXPECT_TRUE(model.deadline_share(4, prompts, 64).has_value());
}

// 1 ms + 10 us a token, 100 prompt tokens due in 3.5 ms: 34..49 tokens a step take three steps
// (4.02 ms and more), 50 take two of 1.5 ms. Without the ceil (C / S steps) 40 would do; with
// the floor, 34; with ceil one too many ((C + S) / S), 51.
TEST(StepTimeModelDeadline, CountsTheLastPartialStepOfAPrompt) {
  const StepTimeModel model = ttft_fitted(1000, 10);
  const PromptDue one[] = {{.tokens_left = 100, .seconds_left = 3.5e-3}};
  EXPECT_EQ(model.deadline_share(0, one, 512), 50u);
  EXPECT_EQ(ttft_brute_force(model, 0, one, 512), 50u);
  EXPECT_NE(ttft_brute_force(model, 0, one, 512, /*round_up=*/false), 50u);
  // Just too short for two steps of 50: the whole prompt in one step of 2 ms.
  const PromptDue tight[] = {{.tokens_left = 100, .seconds_left = 2.9e-3}};
  EXPECT_EQ(model.deadline_share(0, tight, 512), 100u);
  // The decodes lengthen every step: 4 of them make two steps of 50 3.08 ms, and 3.05 ms
  // needs one step of the whole prompt.
  const PromptDue decoding[] = {{.tokens_left = 100, .seconds_left = 3.05e-3}};
  EXPECT_EQ(model.deadline_share(0, decoding, 512), 50u);
  EXPECT_EQ(model.deadline_share(4, decoding, 512), 100u);
}

// No prompt, no tokens, or none that can still make it: 0 (nothing to raise a share to).
TEST(StepTimeModelDeadline, ZeroWhenNoPromptConstrains) {
  const StepTimeModel model = ttft_fitted(1000, 10);
  EXPECT_EQ(model.deadline_share(2, {}, 512), 0u);
  const PromptDue empty[] = {{.tokens_left = 0, .seconds_left = 1}};
  EXPECT_EQ(model.deadline_share(2, empty, 512), 0u);
  const PromptDue some[] = {{.tokens_left = 10, .seconds_left = 1}};
  EXPECT_EQ(model.deadline_share(2, some, 0), 0u);
  const PromptDue late[] = {{.tokens_left = 10, .seconds_left = -1e-3}};
  EXPECT_EQ(model.deadline_share(2, late, 512), 0u);
  const PromptDue now[] = {{.tokens_left = 10, .seconds_left = 0}};
  EXPECT_EQ(model.deadline_share(2, now, 512), 0u);
  // 5,000 tokens at 512 a step: ten steps of over 6 ms, never within 10 ms.
  const PromptDue impossible[] = {{.tokens_left = 5000, .seconds_left = 10e-3}};
  EXPECT_EQ(model.deadline_share(2, impossible, 512), 0u);
}

// A prompt already late, or one that cannot make it even at the whole bound, is not chased;
// its tokens still come before the prompts behind it.
TEST(StepTimeModelDeadline, LeavesOutThePromptsThatCannotMakeIt) {
  const StepTimeModel model = ttft_fitted(1000, 10);
  const PromptDue alone[] = {{.tokens_left = 100, .seconds_left = 10e-3}};
  const PromptDue behind_late[] = {{.tokens_left = 40, .seconds_left = -2e-3},
                                   {.tokens_left = 60, .seconds_left = 10e-3}};
  const PromptDue behind_impossible[] = {{.tokens_left = 50, .seconds_left = 1.2e-3},
                                         {.tokens_left = 50, .seconds_left = 10e-3}};
  // 100 tokens in 10 ms: 13 a step (8 steps of 1.13 ms = 9.04 ms; 12 take 9 of 1.12).
  EXPECT_EQ(model.deadline_share(0, alone, 512), 13u);
  EXPECT_EQ(model.deadline_share(0, behind_late, 512), 13u);
  EXPECT_EQ(model.deadline_share(0, behind_impossible, 512), 13u)
      << "50 tokens cannot finish within 1.2 ms: a step of them alone takes 1.5 ms";
  for (const auto prompts :
       {std::span<const PromptDue>(alone), std::span<const PromptDue>(behind_late),
        std::span<const PromptDue>(behind_impossible)}) {
    EXPECT_EQ(model.deadline_share(0, prompts, 512), ttft_brute_force(model, 0, prompts, 512));
  }
}

// Random lines, prompt lists (some late, some impossible, some without a deadline) and bounds:
// always the smallest share a search over every share finds; and often one the floor would
// get wrong, so an off-by-one in the ceil fails here.
TEST(StepTimeModelDeadline, EqualsASearchOverEveryShare) {
  std::mt19937_64 random(20240611);
  const auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(random);
  };
  const auto count = [&](std::uint32_t lo, std::uint32_t hi) {
    return std::uniform_int_distribution<std::uint32_t>(lo, hi)(random);
  };
  int constrained = 0, ceil_matters = 0, left_out = 0;
  for (int line = 0; line < 40; ++line) {
    const StepTimeModel model = ttft_fitted(uniform(0, 3000), uniform(1, 200));
    for (int trial = 0; trial < 50; ++trial) {
      const std::uint32_t decodes = count(0, 64);
      const std::uint32_t most = count(1, 600);
      std::vector<PromptDue> prompts(count(1, 8));
      for (PromptDue& p : prompts) {
        p.tokens_left = count(1, 800);
        const double kind = uniform(0, 1);
        p.seconds_left = kind < 0.1    ? -uniform(0, 0.05)                        // late
                         : kind < 0.15 ? std::numeric_limits<double>::infinity()  // no deadline
                                       : uniform(0.0005, 0.3);
      }
      const std::optional<std::uint32_t> got = model.deadline_share(decodes, prompts, most);
      ASSERT_TRUE(got.has_value());
      const std::uint32_t want = ttft_brute_force(model, decodes, prompts, most);
      ASSERT_EQ(*got, want) << "line " << line << " trial " << trial << " decodes " << decodes
                            << " most " << most;
      if (want > 1) ++constrained;
      if (want != ttft_brute_force(model, decodes, prompts, most, /*round_up=*/false)) {
        ++ceil_matters;
      }
      std::uint64_t total = 0;
      for (const PromptDue& p : prompts) total += p.tokens_left;
      const auto bound = static_cast<std::uint32_t>(std::min<std::uint64_t>(most, total));
      std::uint64_t cumulative = 0;
      for (const PromptDue& p : prompts) {
        cumulative += p.tokens_left;
        if (p.seconds_left > 0 && ttft_finish(model, decodes, cumulative, bound) > p.seconds_left) {
          ++left_out;  // cannot make it: must not count
        }
      }
    }
  }
  // The cases are the ones that matter, not only trivial ones.
  EXPECT_GT(constrained, 200);
  EXPECT_GT(ceil_matters, 50);
  EXPECT_GT(left_out, 50);
}

}  // namespace
}  // namespace kvvm::engine::step_time_model_test
