// Sampling: determinism of the counter-based draw, greedy's tie-break, truncation, and a
// distribution check that a biased or mis-ordered sampler fails.
#include "kvvm/model/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace kvvm::model {
namespace {

SamplingParams sampled(float temperature, std::uint64_t seed = 7) {
  SamplingParams params;
  params.temperature = temperature;
  params.seed = seed;
  return params;
}

TEST(CounterUniform, SamePairSameNumberAndInRange) {
  for (std::uint64_t counter = 0; counter < 1000; ++counter) {
    const double u = counter_uniform(42, counter);
    EXPECT_EQ(u, counter_uniform(42, counter));
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
  // Neighbouring counters and seeds give different numbers (a hash that ignored either
  // argument would not).
  EXPECT_NE(counter_uniform(42, 0), counter_uniform(42, 1));
  EXPECT_NE(counter_uniform(42, 0), counter_uniform(43, 0));
  EXPECT_NE(counter_uniform(1, 2), counter_uniform(2, 1));
}

TEST(CounterUniform, MeanAndSpreadOfManyDraws) {
  constexpr int kDraws = 100000;
  double sum = 0;
  std::vector<int> deciles(10, 0);
  for (int i = 0; i < kDraws; ++i) {
    const double u = counter_uniform(3, static_cast<std::uint64_t>(i));
    sum += u;
    ++deciles[static_cast<std::size_t>(u * 10)];
  }
  EXPECT_NEAR(sum / kDraws, 0.5, 0.01);
  for (int count : deciles) EXPECT_NEAR(count, kDraws / 10, 600);
}

TEST(Sampling, SameSeedAndCounterSameToken) {
  const std::vector<float> logits = {0.1f, 0.3f, 0.2f, 0.25f, 0.15f};
  const SamplingParams params = sampled(1.0f, 11);
  std::vector<std::int32_t> first;
  for (std::uint64_t c = 0; c < 64; ++c) first.push_back(sample_token(logits, params, c));
  for (std::uint64_t c = 0; c < 64; ++c) EXPECT_EQ(sample_token(logits, params, c), first[c]);
  // Another seed draws another sequence (64 draws over 5 near-uniform tokens).
  std::vector<std::int32_t> other;
  for (std::uint64_t c = 0; c < 64; ++c) other.push_back(sample_token(logits, sampled(1, 12), c));
  EXPECT_NE(first, other);
}

TEST(Sampling, GreedyTakesTheLowestIdAmongEqualMaxima) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, 3.0f};
  EXPECT_EQ(sample_token(logits, SamplingParams{}, 0), 1);
  const std::vector<float> single = {-5.0f};
  EXPECT_EQ(sample_token(single, SamplingParams{}, 0), 0);
}

TEST(Sampling, NanIsNeverChosen) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> logits = {nan, 0.5f, nan, 0.25f};
  EXPECT_EQ(sample_token(logits, SamplingParams{}, 0), 1);
  for (std::uint64_t c = 0; c < 200; ++c) {
    const std::int32_t token = sample_token(logits, sampled(2.0f), c);
    EXPECT_TRUE(token == 1 || token == 3) << token;
  }
  const std::vector<float> all_nan = {nan, nan, nan};
  EXPECT_EQ(sample_token(all_nan, SamplingParams{}, 0), 0);
  EXPECT_EQ(sample_token(all_nan, sampled(1.0f), 0), 0);
}

TEST(Sampling, NegativeInfinityIsNeverChosen) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {-inf, 0.0f, -inf, 0.0f};
  for (std::uint64_t c = 0; c < 200; ++c) {
    const std::int32_t token = sample_token(logits, sampled(1.0f), c);
    EXPECT_TRUE(token == 1 || token == 3) << token;
  }
  const std::vector<float> all_minus_inf = {-inf, -inf};
  EXPECT_EQ(sample_token(all_minus_inf, sampled(1.0f), 0), 0);
}

TEST(Sampling, TopKOfOneIsGreedy) {
  const std::vector<float> logits = {0.9f, 1.0f, 0.95f, 1.0f, 0.2f};
  SamplingParams params = sampled(5.0f);
  params.top_k = 1;
  for (std::uint64_t c = 0; c < 100; ++c) EXPECT_EQ(sample_token(logits, params, c), 1);
}

TEST(Sampling, TinyTopPIsGreedy) {
  const std::vector<float> logits = {0.9f, 1.0f, 0.95f, 1.0f, 0.2f};
  SamplingParams params = sampled(5.0f);
  params.top_p = 1e-6f;
  for (std::uint64_t c = 0; c < 100; ++c) EXPECT_EQ(sample_token(logits, params, c), 1);
}

TEST(Sampling, TopKKeepsOnlyTheKLargest) {
  const std::vector<float> logits = {3.0f, 0.0f, 2.9f, 2.8f, 0.1f};
  SamplingParams params = sampled(100.0f);  // nearly uniform before truncation
  params.top_k = 2;
  bool saw[2] = {false, false};
  for (std::uint64_t c = 0; c < 400; ++c) {
    const std::int32_t token = sample_token(logits, params, c);
    ASSERT_TRUE(token == 0 || token == 2) << token;
    saw[token == 0 ? 0 : 1] = true;
  }
  EXPECT_TRUE(saw[0] && saw[1]);
}

TEST(Sampling, TopPKeepsTheSmallestSetReachingP) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (logits are their logs, T = 1).
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.05f),
                                     std::log(0.3f)};
  SamplingParams params = sampled(1.0f);
  params.top_p = 0.79f;  // 0.5 + 0.3 reaches it: tokens 1 and 3
  int counts[4] = {0, 0, 0, 0};
  for (std::uint64_t c = 0; c < 4000; ++c) ++counts[sample_token(logits, params, c)];
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[2], 0);
  // Renormalized: 0.625 and 0.375.
  EXPECT_NEAR(counts[1] / 4000.0, 0.625, 0.03);
  EXPECT_NEAR(counts[3] / 4000.0, 0.375, 0.03);
  params.top_p = 0.81f;  // 0.5 + 0.3 falls short: token 0 joins
  bool saw_zero = false;
  for (std::uint64_t c = 0; c < 4000 && !saw_zero; ++c) {
    saw_zero = sample_token(logits, params, c) == 0;
  }
  EXPECT_TRUE(saw_zero);
}

TEST(Sampling, MinPDropsTokensLessLikelyThanPTimesTheMostLikely) {
  // Probabilities 0.5, 0.3, 0.15, 0.05: min_p 0.25 keeps those >= 0.125 (tokens 1, 3, 0).
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.05f),
                                     std::log(0.3f)};
  SamplingParams params = sampled(1.0f);
  params.min_p = 0.25f;
  ASSERT_TRUE(check_sampling(params).ok());
  int counts[4] = {0, 0, 0, 0};
  for (std::uint64_t c = 0; c < 20000; ++c) ++counts[sample_token(logits, params, c)];
  EXPECT_EQ(counts[2], 0);
  // The rest renormalized over 0.95.
  EXPECT_NEAR(counts[0] / 20000.0, 0.15 / 0.95, 0.015);
  EXPECT_NEAR(counts[1] / 20000.0, 0.5 / 0.95, 0.015);
  EXPECT_NEAR(counts[3] / 20000.0, 0.3 / 0.95, 0.015);
  // 1: only the most likely; then top-p runs over what min_p left (vLLM's order): 0.5 of 0.8 is
  // token 1 alone at top_p 0.6, where the unfiltered 0.6 would admit token 3 too.
  params.min_p = 1.0f;
  for (std::uint64_t c = 0; c < 200; ++c) EXPECT_EQ(sample_token(logits, params, c), 1);
  params.min_p = 0.5f;  // keeps 0.5 and 0.3
  params.top_p = 0.6f;
  for (std::uint64_t c = 0; c < 400; ++c) EXPECT_EQ(sample_token(logits, params, c), 1) << c;
  params.top_p = 0.7f;  // 0.5 / 0.8 = 0.625 falls short: token 3 joins
  bool saw_three = false;
  for (std::uint64_t c = 0; c < 400 && !saw_three; ++c) {
    saw_three = sample_token(logits, params, c) == 3;
  }
  EXPECT_TRUE(saw_three);
}

// Pearson's chi-square over a 4-token distribution. With 3 degrees of freedom the 99.9th
// percentile is 16.3; a sampler off by a few percent on any token, or one that ignores the
// temperature, lands far above it at this many draws.
double chi_square(const std::vector<float>& logits, const SamplingParams& params,
                  const std::vector<double>& expected_p, int draws) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    ++counts[static_cast<std::size_t>(sample_token(logits, params, static_cast<std::uint64_t>(i)))];
  }
  double chi = 0;
  for (std::size_t t = 0; t < counts.size(); ++t) {
    const double e = expected_p[t] * draws;
    chi += (counts[t] - e) * (counts[t] - e) / e;
  }
  return chi;
}

TEST(Sampling, DrawsFollowTheTemperedSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.0f, 1.5f};
  constexpr int kDraws = 40000;
  for (const float temperature : {0.7f, 1.0f, 2.0f}) {
    std::vector<double> p(logits.size());
    double total = 0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      p[i] = std::exp(logits[i] / temperature);
      total += p[i];
    }
    for (double& x : p) x /= total;
    const SamplingParams params = sampled(temperature, 99);
    EXPECT_LT(chi_square(logits, params, p, kDraws), 16.3) << "temperature " << temperature;
    // The same draws judged against T = 1's distribution (when T is not 1) fail: the check
    // has the power to see a sampler that ignores the temperature.
    if (temperature != 1.0f) {
      std::vector<double> p1(logits.size());
      double t1 = 0;
      for (std::size_t i = 0; i < logits.size(); ++i) t1 += p1[i] = std::exp(logits[i]);
      for (double& x : p1) x /= t1;
      EXPECT_GT(chi_square(logits, params, p1, kDraws), 100.0) << "temperature " << temperature;
    }
  }
}

TEST(Sampling, BadParametersAreRefusedByName) {
  SamplingParams params;
  EXPECT_TRUE(check_sampling(params).ok());
  params.temperature = -0.5f;
  Status s = check_sampling(params);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("temperature"), std::string::npos) << s.message();
  params.temperature = std::numeric_limits<float>::infinity();
  EXPECT_NE(check_sampling(params).message().find("temperature"), std::string::npos);
  params.temperature = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(check_sampling(params).message().find("temperature"), std::string::npos);
  params.temperature = 1;
  for (const float top_p : {0.0f, -0.1f, 1.01f, std::numeric_limits<float>::quiet_NaN()}) {
    params.top_p = top_p;
    s = check_sampling(params);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << top_p;
    EXPECT_NE(s.message().find("top_p"), std::string::npos) << s.message();
  }
  params.top_p = 1;
  EXPECT_TRUE(check_sampling(params).ok());
  for (const float min_p : {-0.1f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    params.min_p = min_p;
    s = check_sampling(params);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << min_p;
    EXPECT_NE(s.message().find("min_p"), std::string::npos) << s.message();
  }
  params.min_p = 0;
}

}  // namespace
}  // namespace kvvm::model
