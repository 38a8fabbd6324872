// DRY's penalties against a brute-force reference (every earlier place compared token by token,
// rapidcheck over random contexts with repeats and breakers), the worked examples of its
// definition, and the engine refusing bad DRY settings by name.
#include "engine/dry_penalty.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "support/engine_harness.h"

namespace kvvm::engine {
namespace {

// token -> penalty, from append_dry_penalties.
std::map<std::int32_t, double> penalties(const std::vector<std::int32_t>& context,
                                         const DryPenalty& dry) {
  std::vector<model::LogitAdjustment> out;
  std::vector<std::int64_t> scratch;
  append_dry_penalties(context, dry, out, scratch);
  std::map<std::int32_t, double> by_token;
  for (const model::LogitAdjustment& a : out) {
    EXPECT_EQ(by_token.count(a.id), 0u) << "token " << a.id << " listed twice";
    by_token[a.id] = -static_cast<double>(a.bias);
  }
  return by_token;
}

// The definition, directly: for every earlier end position i, the longest L with the L tokens
// ending at i equal to the context's last L (no breaker among them), then ctx[i + 1] gets L.
std::map<std::int32_t, double> reference(std::vector<std::int32_t> context, const DryPenalty& dry) {
  if (dry.last_n > 0 && context.size() > dry.last_n) {
    context.erase(context.begin(), context.end() - dry.last_n);
  }
  const auto breaker = [&](std::int32_t t) {
    return std::binary_search(dry.breakers.begin(), dry.breakers.end(), t);
  };
  const std::size_t n = context.size();
  std::map<std::int32_t, std::uint32_t> longest;
  for (std::size_t i = 0; i + 1 < n; ++i) {
    std::uint32_t length = 0;
    while (length <= i && !breaker(context[i - length]) &&
           context[i - length] == context[n - 1 - length]) {
      ++length;
    }
    const std::int32_t next = context[i + 1];
    if (length >= std::max<std::uint32_t>(dry.allowed_length, 1) && !breaker(next)) {
      longest[next] = std::max(longest[next], length);
    }
  }
  std::map<std::int32_t, double> out;
  for (const auto& [token, length] : longest) {
    const std::uint32_t exponent = std::min(length - dry.allowed_length, kDryMaxExponent);
    out[token] =
        static_cast<double>(static_cast<float>(dry.multiplier * std::pow(dry.base, exponent)));
  }
  return out;
}

DryPenalty dry_of(float multiplier, std::uint32_t allowed = 2) {
  DryPenalty dry;
  dry.multiplier = multiplier;
  dry.allowed_length = allowed;
  return dry;
}

TEST(DryPenalty, PenalizesTheTokenThatWouldExtendARepeat) {
  // "a b c d ... a b c": after "a b c" came "d"; the context ends in "a b c" (L = 3).
  const std::vector<std::int32_t> context = {1, 2, 3, 4, 9, 9, 8, 1, 2, 3};
  const auto got = penalties(context, dry_of(0.8f));
  ASSERT_EQ(got.count(4), 1u);
  EXPECT_NEAR(got.at(4), 0.8 * 1.75, 1e-6);  // 0.8 * 1.75^(3 - 2)
  EXPECT_EQ(got.size(), 1u) << "only 4 followed a repeat of length >= 2";
  // Allowed length 4: a repeat of 3 is free.
  EXPECT_TRUE(penalties(context, dry_of(0.8f, 4)).empty());
  // Off.
  EXPECT_TRUE(penalties(context, dry_of(0.0f)).empty());
}

TEST(DryPenalty, NoRepeatRunsAcrossABreakerAndABreakerIsNeverPenalized) {
  std::vector<std::int32_t> context = {1, 2, 3, 4, 8, 1, 2, 3};
  DryPenalty dry = dry_of(1.0f);
  dry.breakers = {2};
  // The repeat "1 2 3" crosses the breaker 2: only "3" (length 1) matches, under the allowed 2.
  EXPECT_TRUE(penalties(context, dry).empty());
  dry.breakers = {4};
  context = {1, 2, 3, 4, 8, 1, 2, 3};
  EXPECT_TRUE(penalties(context, dry).empty()) << "4 follows the repeat but is a breaker";
}

TEST(DryPenalty, ARunOfOneTokenGrowsItsOwnPenalty) {
  // 7 7 7 7 7: the context's last 4 sevens also end one place earlier, followed by a 7.
  const auto got = penalties({7, 7, 7, 7, 7}, dry_of(1.0f));
  ASSERT_EQ(got.count(7), 1u);
  EXPECT_NEAR(got.at(7), std::pow(1.75, 4 - 2), 1e-5);
}

TEST(DryPenalty, OnlyTheLastNTokensAreSearched) {
  const std::vector<std::int32_t> context = {1, 2, 3, 4, 9, 8, 7, 6, 5, 1, 2, 3};
  EXPECT_EQ(penalties(context, dry_of(1.0f)).count(4), 1u);
  DryPenalty dry = dry_of(1.0f);
  dry.last_n = 6;
  EXPECT_TRUE(penalties(context, dry).empty());
}

// Through the engine on llama-tiny, greedy: a prompt that repeats itself; with a penalty no
// finite logit survives, no output token extends a repeat of 2 or more, where without DRY the
// model repeats freely; bad settings refused by name.
TEST(DryPenaltyEngine, AHeavyPenaltyLeavesNoRepeatExtended) {
  testing::FixtureModel& model = testing::llama();
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 4; ++i) {
    for (std::int32_t t : {101, 102, 103, 104, 105}) prompt.push_back(t);
  }
  EngineRequest plain = testing::greedy_request(prompt, 24);
  EngineRequest penalized = plain;
  penalized.dry = dry_of(1e4f);
  const auto free_tokens =
      testing::solo_tokens(model, testing::small_space_options(), EngineOptions{}, plain);
  const auto dry_tokens =
      testing::solo_tokens(model, testing::small_space_options(), EngineOptions{}, penalized);
  ASSERT_EQ(dry_tokens.size(), 24u);
  EXPECT_NE(free_tokens, dry_tokens);
  // Each output token, appended to what came before, would have been penalized by DRY if it
  // extended a repeat: recheck with the definition.
  std::vector<std::int32_t> context = prompt;
  for (std::int32_t token : dry_tokens) {
    const auto penalized_now = reference(context, penalized.dry);
    EXPECT_EQ(penalized_now.count(token), 0u) << "token " << token << " extends a repeat";
    context.push_back(token);
  }
  EngineRequest bad = plain;
  bad.dry.multiplier = 1;
  bad.dry.base = 0.5f;
  auto rig = testing::EngineRig::make(model, testing::small_space_options(), EngineOptions{});
  ASSERT_TRUE(rig);
  const std::size_t i = rig->submit(bad);
  EXPECT_FALSE(rig->outcome(i).submit_status.ok());
  EXPECT_NE(rig->outcome(i).submit_status.message().find("dry_base"), std::string::npos)
      << rig->outcome(i).submit_status.to_string();
}

RC_GTEST_PROP(DryPenaltyProperty, MatchesTheDefinition, ()) {
  const auto vocab = *rc::gen::inRange<std::int32_t>(1, 6);
  const auto context = *rc::gen::container<std::vector<std::int32_t>>(
      *rc::gen::inRange<std::size_t>(0, 60), rc::gen::inRange<std::int32_t>(0, vocab));
  DryPenalty dry;
  dry.multiplier = *rc::gen::element(0.5f, 1.0f, 2.0f);
  dry.base = *rc::gen::element(1.5f, 1.75f, 3.0f);
  dry.allowed_length = *rc::gen::inRange<std::uint32_t>(0, 5);
  dry.last_n = *rc::gen::element(0u, 5u, 17u);
  if (*rc::gen::arbitrary<bool>()) dry.breakers = {*rc::gen::inRange<std::int32_t>(0, vocab)};
  const auto got = penalties(context, dry);
  const auto want = reference(context, dry);
  RC_ASSERT(got.size() == want.size());
  for (const auto& [token, penalty] : want) {
    RC_ASSERT(got.count(token) == 1u);
    RC_ASSERT(std::abs(got.at(token) - penalty) <= 1e-6 * penalty);
  }
}

}  // namespace
}  // namespace kvvm::engine
