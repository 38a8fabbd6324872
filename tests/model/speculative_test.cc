// Accepting speculative tokens: greedy verdicts, the rejection sampler's preservation of the
// target distribution (chi-square over 200,000 draws per case, with and without truncation),
// its acceptance rate, the counters it reads, and the refusals of bad shapes.
#include "kvvm/model/speculative.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kvvm/model/sampling.h"

namespace kvvm::model {
namespace {

constexpr std::uint32_t kSpecVocab = 6;
constexpr int kSpecDraws = 200000;
constexpr std::uint64_t kSpecDraftSeed = 0x5eed;

// Pearson's chi-square critical values at p = 0.001 for 1..5 degrees of freedom (the support of
// p less one: at most 5 over a 6-token vocabulary).
constexpr double kSpecChiCritical[] = {0, 10.828, 13.816, 16.266, 18.467, 20.515};

// The first verification position's row, and the bonus position's.
const std::vector<float> kSpecRow0 = {1.2f, 0.4f, -0.3f, 2.0f, 0.9f, -1.5f};
const std::vector<float> kSpecRow1 = {-0.5f, 1.5f, 0.2f, 0.0f, 1.1f, 0.7f};

SamplingParams spec_params(float temperature, std::uint32_t top_k = 0, float top_p = 1,
                           float min_p = 0, std::uint64_t seed = 2024) {
  SamplingParams params;
  params.temperature = temperature;
  params.top_k = top_k;
  params.top_p = top_p;
  params.min_p = min_p;
  params.seed = seed;
  return params;
}

std::vector<double> spec_distribution(const std::vector<float>& row, const SamplingParams& params) {
  std::vector<double> p(row.size());
  sampling_distribution(row, params, p);
  return p;
}

std::vector<float> spec_rows(std::initializer_list<std::vector<float>> rows) {
  std::vector<float> out;
  for (const std::vector<float>& r : rows) out.insert(out.end(), r.begin(), r.end());
  return out;
}

// Pearson's statistic of `counts` against `p` over the tokens p gives mass, and its degrees of
// freedom; a token p gives no mass that was drawn makes it infinite.
double spec_chi_square(const std::vector<int>& counts, const std::vector<double>& p, int* df) {
  long long n = 0;
  for (const int c : counts) n += c;
  double chi = 0;
  int support = 0;
  for (std::size_t t = 0; t < p.size(); ++t) {
    if (p[t] <= 0) {
      if (counts[t] > 0) return std::numeric_limits<double>::infinity();
      continue;
    }
    ++support;
    const double e = p[t] * static_cast<double>(n);
    chi += (counts[t] - e) * (counts[t] - e) / e;
  }
  *df = support - 1;
  return chi;
}

std::int32_t spec_draw(const std::vector<double>& q, double u) {
  double cumulative = 0;
  std::int32_t last = 0;
  for (std::size_t t = 0; t < q.size(); ++t) {
    if (q[t] <= 0) continue;
    cumulative += q[t];
    last = static_cast<std::int32_t>(t);
    if (u < cumulative) return last;
  }
  return last;
}

struct SpecTally {
  std::vector<int> first = std::vector<int>(kSpecVocab, 0);  // the first emitted token
  std::vector<int> bonus = std::vector<int>(kSpecVocab, 0);  // next, when the draft stood
  int accepted = 0;
};

// kSpecDraws verifications of one draft over (kSpecRow0, kSpecRow1). `q` empty: a point mass on
// `point`; else the draft is drawn from q (its own seed) and q passed as draft_probs.
SpecTally spec_run(const SamplingParams& params, const std::vector<double>& q, std::int32_t point) {
  const std::vector<float> logits = spec_rows({kSpecRow0, kSpecRow1});
  const std::vector<float> q_row(q.begin(), q.end());
  SpecTally tally;
  for (int c = 0; c < kSpecDraws; ++c) {
    const std::int32_t draft =
        q.empty() ? point
                  : spec_draw(q, counter_uniform(kSpecDraftSeed, static_cast<std::uint64_t>(c)));
    const std::int32_t drafts[] = {draft};
    // Two counters a trial (the bonus reads counter + 1), so no trial reads another's.
    const SpeculativeOutcome out =
        accept_drafts(logits, kSpecVocab, drafts, q_row, params, 2 * static_cast<std::uint64_t>(c));
    if (out.accepted == 1) {
      ++tally.accepted;
      ++tally.first[static_cast<std::size_t>(draft)];
      ++tally.bonus[static_cast<std::size_t>(out.next)];
    } else {
      ++tally.first[static_cast<std::size_t>(out.next)];
    }
  }
  return tally;
}

// The cases of the distribution tests: the sampler's settings, then the drafts tried under each.
std::vector<SamplingParams> spec_settings() {
  return {spec_params(1.0f), spec_params(0.7f, /*top_k=*/4), spec_params(1.3f, 0, /*top_p=*/0.8f),
          spec_params(1.0f, 0, 1, /*min_p=*/0.15f),
          spec_params(0.9f, /*top_k=*/5, /*top_p=*/0.9f, /*min_p=*/0.05f)};
}

struct SpecDraft {
  std::string name;
  std::vector<double> q;  // empty: a point mass on `point`
  std::int32_t point = 0;
};

std::vector<SpecDraft> spec_drafts() {
  return {{"point mass on the likely token 3", {}, 3},
          {"point mass on the unlikely token 5", {}, 5},
          {"point mass on token 2", {}, 2},
          {"uniform q", std::vector<double>(kSpecVocab, 1.0 / kSpecVocab), 0},
          {"q skewed to the unlikely tokens", {0.05, 0.1, 0.3, 0.05, 0.1, 0.4}, 0},
          {"q with no mass on the likely tokens", {0.0, 0.4, 0.2, 0.0, 0.0, 0.4}, 0}};
}

std::string spec_describe(const SamplingParams& p) {
  return "T " + std::to_string(p.temperature) + " top_k " + std::to_string(p.top_k) + " top_p " +
         std::to_string(p.top_p) + " min_p " + std::to_string(p.min_p);
}

TEST(Speculative, GreedyAcceptsTheArgmaxesAndAddsTheBonus) {
  const std::vector<float> logits =
      spec_rows({{0, 3, 1, 2}, {5, 1, 1, 1}, {0, 0, 0, 4}, {1, 2, 9, 3}});
  const std::int32_t drafts[] = {1, 0, 3};
  const SpeculativeOutcome all = accept_drafts(logits, 4, drafts, {}, SamplingParams{}, 0);
  EXPECT_EQ(all.accepted, 3u);
  EXPECT_EQ(all.next, 2);  // row 3's argmax: the bonus
  // The first mismatch ends it; next is the target's choice there.
  const std::int32_t second_wrong[] = {1, 2, 3};
  const SpeculativeOutcome mismatch =
      accept_drafts(logits, 4, second_wrong, {}, SamplingParams{}, 0);
  EXPECT_EQ(mismatch.accepted, 1u);
  EXPECT_EQ(mismatch.next, 0);
  const std::int32_t first_wrong[] = {3, 0, 3};
  const SpeculativeOutcome none = accept_drafts(logits, 4, first_wrong, {}, SamplingParams{}, 0);
  EXPECT_EQ(none.accepted, 0u);
  EXPECT_EQ(none.next, 1);
  // No drafts: the bonus alone, row 0's argmax.
  const SpeculativeOutcome empty =
      accept_drafts(std::span<const float>(logits).first(4), 4, {}, {}, SamplingParams{}, 0);
  EXPECT_EQ(empty.accepted, 0u);
  EXPECT_EQ(empty.next, 1);
}

TEST(Speculative, GreedyTiesGoToTheLowestIdAndNanIsNeverTheArgmax) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> logits = spec_rows({{1, 4, 2, 4}, {nan, 0, 1, nan}});
  const std::int32_t higher_tie[] = {3};
  SpeculativeOutcome out = accept_drafts(logits, 4, higher_tie, {}, SamplingParams{}, 0);
  EXPECT_EQ(out.accepted, 0u);
  EXPECT_EQ(out.next, 1);
  const std::int32_t lower_tie[] = {1};
  out = accept_drafts(logits, 4, lower_tie, {}, SamplingParams{}, 0);
  EXPECT_EQ(out.accepted, 1u);
  EXPECT_EQ(out.next, 2);  // the NaN ids of row 1 are never chosen
  // Greedy ignores draft_probs, and top_k 1 is greedy at any temperature.
  const std::vector<float> q = {0.1f, 0.2f, 0.3f, 0.4f};
  EXPECT_EQ(accept_drafts(logits, 4, higher_tie, q, SamplingParams{}, 0).next, 1);
  EXPECT_EQ(accept_drafts(logits, 4, higher_tie, q, SamplingParams{}, 0).accepted, 0u);
  const SamplingParams top1 = spec_params(3.0f, /*top_k=*/1);
  for (std::uint64_t c = 0; c < 100; ++c) {
    const SpeculativeOutcome o = accept_drafts(logits, 4, lower_tie, q, top1, c);
    EXPECT_EQ(o.accepted, 1u);
    EXPECT_EQ(o.next, 2);
  }
}

TEST(Speculative, SamplingDistributionIsTheSamplersTruncatedSoftmax) {
  // No truncation: the tempered softmax, in float64.
  const float temperature = 0.8f;
  std::vector<double> expected(kSpecVocab);
  double total = 0;
  for (std::size_t t = 0; t < kSpecVocab; ++t) {
    total += expected[t] = std::exp(static_cast<double>(kSpecRow0[t]) / temperature);
  }
  const std::vector<double> p = spec_distribution(kSpecRow0, spec_params(temperature));
  for (std::size_t t = 0; t < kSpecVocab; ++t) EXPECT_NEAR(p[t], expected[t] / total, 1e-12) << t;
  // top_k 2 keeps tokens 3 and 0, renormalised.
  const std::vector<double> top2 = spec_distribution(kSpecRow0, spec_params(1.0f, 2));
  const double e3 = std::exp(2.0), e0 = std::exp(static_cast<double>(1.2f));
  EXPECT_NEAR(top2[3], e3 / (e3 + e0), 1e-12);
  EXPECT_NEAR(top2[0], e0 / (e3 + e0), 1e-12);
  for (const std::size_t t : {1u, 2u, 4u, 5u}) EXPECT_EQ(top2[t], 0.0) << t;
  // NaN gets nothing; temperature 0 is a point mass on the argmax.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> with_nan = {nan, 1.0f, 0.0f};
  const std::vector<double> pn = spec_distribution(with_nan, spec_params(1.0f));
  EXPECT_EQ(pn[0], 0.0);
  EXPECT_NEAR(pn[1] + pn[2], 1.0, 1e-15);
  EXPECT_EQ(spec_distribution(kSpecRow0, SamplingParams{}),
            (std::vector<double>{0, 0, 0, 1, 0, 0}));
  // Every setting of the distribution tests: sums to 1, and sample_token never draws a token of
  // mass 0.
  for (const SamplingParams& params : spec_settings()) {
    const std::vector<double> q = spec_distribution(kSpecRow0, params);
    double sum = 0;
    for (const double x : q) sum += x;
    EXPECT_NEAR(sum, 1.0, 1e-12) << spec_describe(params);
    for (std::uint64_t c = 0; c < 2000; ++c) {
      EXPECT_GT(q[static_cast<std::size_t>(sample_token(kSpecRow0, params, c))], 0.0);
    }
  }
}

// The guarantee: whatever the draft distribution, the first emitted token follows p_0 and the
// bonus after an accepted draft follows p_1. Pearson's chi-square at p = 0.001 over the support
// of p (df = support - 1; 5 at most), 200,000 verifications a case, each with its own counters.
TEST(Speculative, RejectionSamplingPreservesTheTargetDistribution) {
  for (const SamplingParams& params : spec_settings()) {
    const std::vector<double> p0 = spec_distribution(kSpecRow0, params);
    const std::vector<double> p1 = spec_distribution(kSpecRow1, params);
    for (const SpecDraft& draft : spec_drafts()) {
      const SpecTally tally = spec_run(params, draft.q, draft.point);
      int df = 0;
      const double chi_first = spec_chi_square(tally.first, p0, &df);
      ASSERT_GE(df, 1);
      EXPECT_LT(chi_first, kSpecChiCritical[df])
          << "first token, " << draft.name << ", " << spec_describe(params) << ", df " << df;
      if (tally.accepted >= 1000) {
        const double chi_bonus = spec_chi_square(tally.bonus, p1, &df);
        EXPECT_LT(chi_bonus, kSpecChiCritical[df])
            << "bonus, " << draft.name << ", " << spec_describe(params) << ", df " << df;
      }
    }
  }
}

// The test's power: a sampler that recovers from p instead of the residual max(0, p - q) (the
// usual mistake), emulated here on the same uniforms, fails the same check by far.
TEST(Speculative, ChiSquareSeesARecoveryFromPInsteadOfTheResidual) {
  const SamplingParams params = spec_params(1.0f);
  const std::vector<double> p = spec_distribution(kSpecRow0, params);
  const std::vector<double> q = {0.05, 0.1, 0.3, 0.05, 0.1, 0.4};
  std::vector<int> counts(kSpecVocab, 0);
  for (int c = 0; c < kSpecDraws; ++c) {
    const std::uint64_t counter = 2 * static_cast<std::uint64_t>(c);
    const std::int32_t x =
        spec_draw(q, counter_uniform(kSpecDraftSeed, static_cast<std::uint64_t>(c)));
    const double u = counter_uniform(params.seed, counter);
    const bool stands = u * q[static_cast<std::size_t>(x)] < p[static_cast<std::size_t>(x)];
    const double v = counter_uniform(params.seed, counter | kRecoveryCounterBit);
    ++counts[static_cast<std::size_t>(stands ? x : spec_draw(p, v))];
  }
  int df = 0;
  EXPECT_GT(spec_chi_square(counts, p, &df), 10 * kSpecChiCritical[5]);
}

// The chance a draft stands is sum_x min(p(x), q(x)) (p(x) for a point mass on x), within four
// standard errors of the 200,000 verifications.
TEST(Speculative, AcceptanceRateIsTheOverlapOfPAndQ) {
  for (const SamplingParams& params : spec_settings()) {
    const std::vector<double> p = spec_distribution(kSpecRow0, params);
    for (const SpecDraft& draft : spec_drafts()) {
      double expected = 0;
      if (draft.q.empty()) {
        expected = p[static_cast<std::size_t>(draft.point)];
      } else {
        for (std::size_t t = 0; t < kSpecVocab; ++t) expected += std::min(p[t], draft.q[t]);
      }
      const SpecTally tally = spec_run(params, draft.q, draft.point);
      const double rate = static_cast<double>(tally.accepted) / kSpecDraws;
      const double se = std::sqrt(expected * (1 - expected) / kSpecDraws);
      EXPECT_NEAR(rate, expected, 4 * se + 1e-12) << draft.name << ", " << spec_describe(params);
    }
  }
}

// Point-mass drafts change nothing but the speed: every emitted token is the one sample_token
// draws from the same row at the same counter.
TEST(Speculative, PointMassDraftsEmitWhatSampleTokenDraws) {
  const std::vector<float> row2 = {0.3f, 0.3f, 2.5f, -1.0f, 0.0f, 1.0f};
  const std::vector<float> logits = spec_rows({kSpecRow0, kSpecRow1, row2, kSpecRow0});
  const std::vector<std::vector<float>> rows = {kSpecRow0, kSpecRow1, row2, kSpecRow0};
  const std::int32_t drafts[] = {3, 1, 2};  // each row's most likely token
  std::uint32_t seen_accepted[4] = {0, 0, 0, 0};
  for (const SamplingParams& params : spec_settings()) {
    for (std::uint64_t counter = 0; counter < 3000; counter += 3) {
      const SpeculativeOutcome out = accept_drafts(logits, kSpecVocab, drafts, {}, params, counter);
      ASSERT_LE(out.accepted, 3u);
      ++seen_accepted[out.accepted];
      for (std::uint32_t i = 0; i < out.accepted; ++i) {
        EXPECT_EQ(sample_token(rows[i], params, counter + i), drafts[i]);
      }
      EXPECT_EQ(out.next, sample_token(rows[out.accepted], params, counter + out.accepted));
    }
  }
  for (const std::uint32_t n : seen_accepted) EXPECT_GT(n, 0u);  // every length occurred
}

TEST(Speculative, SameCounterSameOutcome) {
  const std::vector<float> logits = spec_rows({kSpecRow0, kSpecRow1, kSpecRow0});
  const std::vector<float> q =
      spec_rows({{0.05f, 0.1f, 0.3f, 0.05f, 0.1f, 0.4f}, {0.2f, 0.2f, 0.2f, 0.2f, 0.1f, 0.1f}});
  const std::int32_t drafts[] = {2, 1};
  const SamplingParams params = spec_params(1.0f);
  const SamplingParams other_seed = spec_params(1.0f, 0, 1, 0, 2025);
  bool seed_mattered = false;
  for (std::uint64_t counter = 0; counter < 500; ++counter) {
    const SpeculativeOutcome a = accept_drafts(logits, kSpecVocab, drafts, q, params, counter);
    const SpeculativeOutcome b = accept_drafts(logits, kSpecVocab, drafts, q, params, counter);
    EXPECT_EQ(a.accepted, b.accepted);
    EXPECT_EQ(a.next, b.next);
    const SpeculativeOutcome c = accept_drafts(logits, kSpecVocab, drafts, q, other_seed, counter);
    seed_mattered = seed_mattered || c.accepted != a.accepted || c.next != a.next;
  }
  EXPECT_TRUE(seed_mattered);
}

TEST(Speculative, DegenerateDraftsFollowTheirStatedRules) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // p(x) = 0 (cut by top_k 2, which keeps tokens 3 and 0): never stands, point mass or full q.
  const std::vector<float> logits = spec_rows({kSpecRow0, kSpecRow1});
  const SamplingParams top2 = spec_params(1.0f, 2);
  const std::int32_t cut[] = {5};
  const std::vector<float> q_on_cut = {0, 0, 0, 0, 0, 1};
  for (std::uint64_t c = 0; c < 1000; ++c) {
    for (const std::span<const float> q :
         {std::span<const float>(), std::span<const float>(q_on_cut)}) {
      const SpeculativeOutcome out = accept_drafts(logits, kSpecVocab, cut, q, top2, c);
      EXPECT_EQ(out.accepted, 0u);
      EXPECT_TRUE(out.next == 3 || out.next == 0) << out.next;
    }
  }
  // q(x) = 0 for the draft (it was not drawn from q): rejected even where p(x) > 0, and next
  // comes from the residual.
  const std::int32_t likely[] = {3};
  const std::vector<float> q_elsewhere = {0, 0, 0, 0, 0, 1};
  for (std::uint64_t c = 0; c < 200; ++c) {
    const SpeculativeOutcome out =
        accept_drafts(logits, kSpecVocab, likely, q_elsewhere, spec_params(1.0f), c);
    EXPECT_EQ(out.accepted, 0u);
    EXPECT_NE(out.next, 5);  // max(0, p - q) is 0 at 5
  }
  // A residual of no mass falls back to p: min_p 1 leaves p a point mass on token 3, q the same
  // point mass, and a draft q gave nothing to.
  const std::vector<float> q_on_argmax = {0, 0, 0, 1, 0, 0};
  const std::int32_t stray[] = {1};
  for (std::uint64_t c = 0; c < 200; ++c) {
    const SpeculativeOutcome out =
        accept_drafts(logits, kSpecVocab, stray, q_on_argmax, spec_params(1.0f, 0, 1, 1.0f), c);
    EXPECT_EQ(out.accepted, 0u);
    EXPECT_EQ(out.next, 3);
  }
  // NaN target logits are never emitted, and a draft of one never stands.
  const std::vector<float> nan_logits =
      spec_rows({{nan, 1.0f, 0.5f, nan, 0.0f, 0.2f}, {0.1f, nan, 0.3f, 0.0f, nan, 1.0f}});
  const std::int32_t nan_draft[] = {0};
  const std::vector<float> uniform(kSpecVocab, 1.0f / kSpecVocab);
  for (std::uint64_t c = 0; c < 2000; ++c) {
    for (const std::span<const float> q :
         {std::span<const float>(), std::span<const float>(uniform)}) {
      const SpeculativeOutcome out =
          accept_drafts(nan_logits, kSpecVocab, nan_draft, q, spec_params(1.0f), 2 * c);
      EXPECT_EQ(out.accepted, 0u);
      EXPECT_TRUE(out.next != 0 && out.next != 3) << out.next;
    }
    const std::int32_t fine[] = {1};
    const SpeculativeOutcome out =
        accept_drafts(nan_logits, kSpecVocab, fine, uniform, spec_params(1.0f), 2 * c);
    EXPECT_TRUE(out.accepted == 0 ? out.next != 0 && out.next != 3 : out.next != 1 && out.next != 4)
        << out.accepted << " " << out.next;
  }
}

void spec_expect_refused(const Status& s, const std::string& word) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  EXPECT_NE(s.message().find(word), std::string::npos) << s.message();
}

TEST(Speculative, BadShapesAreRefusedByName) {
  const std::vector<float> logits(3 * 5, 0.0f);  // k = 2, vocab 5
  const std::int32_t drafts[] = {1, 4};
  const std::vector<float> q(2 * 5, 0.2f);
  EXPECT_TRUE(check_speculative(logits, 5, drafts, {}).ok());
  EXPECT_TRUE(check_speculative(logits, 5, drafts, q).ok());
  EXPECT_TRUE(check_speculative(std::span<const float>(logits).first(5), 5, {}, {}).ok());

  spec_expect_refused(check_speculative(logits, 0, drafts, {}), "vocab 0");
  spec_expect_refused(check_speculative(std::span<const float>(logits).first(14), 5, drafts, {}),
                      "target_logits: 14 values");
  const std::int32_t outside[] = {1, 5};
  spec_expect_refused(check_speculative(logits, 5, outside, {}), "drafts[1] = 5");
  const std::int32_t negative[] = {-1, 2};
  spec_expect_refused(check_speculative(logits, 5, negative, {}), "drafts[0] = -1");
  spec_expect_refused(check_speculative(logits, 5, drafts, std::span<const float>(q).first(5)),
                      "draft_probs: 5 values");
  std::vector<float> bad = q;
  bad[7] = -0.1f;
  spec_expect_refused(check_speculative(logits, 5, drafts, bad), "draft_probs[1][2] = -0.1");
  bad[7] = std::numeric_limits<float>::quiet_NaN();
  spec_expect_refused(check_speculative(logits, 5, drafts, bad), "draft_probs[1][2]");
  bad = q;
  bad[6] = 0.7f;  // row 1 sums to 1.5
  spec_expect_refused(check_speculative(logits, 5, drafts, bad), "draft_probs row 1 sums to 1.5");
}

}  // namespace
}  // namespace kvvm::model
