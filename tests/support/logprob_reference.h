// Log-probabilities written out in float64 for the tests: log_softmax(logits / T) over the
// non-NaN logits and the ids in descending order (the lower id first among equals), and a
// check of one RowLogprobs against them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "kvvm/model/model.h"

namespace kvvm::testing {

struct LogprobReference {
  std::vector<double> logprob;      // NaN for a NaN logit
  std::vector<std::int32_t> order;  // the non-NaN ids, best first
};

inline LogprobReference logprob_reference(std::span<const float> logits, float temperature) {
  const double t = temperature > 0 ? temperature : 1.0;
  LogprobReference r;
  r.logprob.assign(logits.size(), NAN);
  double most = -INFINITY;
  for (const float l : logits) {
    if (!std::isnan(l)) most = std::max(most, l / t);
  }
  double sum = 0;
  for (const float l : logits) {
    if (!std::isnan(l)) sum += std::exp(l / t - most);
  }
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    r.logprob[i] = logits[i] / t - most - std::log(sum);
    r.order.push_back(static_cast<std::int32_t>(i));
  }
  std::stable_sort(r.order.begin(), r.order.end(), [&](std::int32_t a, std::int32_t b) {
    return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)];
  });
  return r;
}

// `got` against the reference of `logits`: the target's log-prob, the alternatives' values
// rank by rank, and their ids wherever no neighbouring rank lies within `tolerance` (a near
// tie may swap). Differences up to tolerance * max(1, |expected|) pass, or up to tolerance
// itself when `absolute`.
inline void expect_logprobs(const model::RowLogprobs& got, std::span<const float> logits,
                            float temperature, std::int32_t target, std::uint32_t top,
                            double tolerance, const std::string& where, bool absolute = false) {
  const LogprobReference want = logprob_reference(logits, temperature);
  auto near = [&](double value, double expected, const std::string& what) {
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(value)) << where << ", " << what;
    } else if (std::isinf(expected)) {  // a -inf logit: exactly -inf
      EXPECT_EQ(value, expected) << where << ", " << what;
    } else {
      EXPECT_NEAR(value, expected,
                  absolute ? tolerance : tolerance * std::max(1.0, std::fabs(expected)))
          << where << ", " << what;
    }
  };
  EXPECT_EQ(got.target, target) << where;
  const bool inside = target >= 0 && static_cast<std::size_t>(target) < logits.size();
  near(got.logprob, inside ? want.logprob[static_cast<std::size_t>(target)] : NAN, "target");
  const auto listed = static_cast<std::uint32_t>(std::min<std::size_t>(top, want.order.size()));
  ASSERT_EQ(got.top, listed) << where;
  auto value_at = [&](std::size_t rank) {
    return want.logprob[static_cast<std::size_t>(want.order[rank])];
  };
  for (std::uint32_t j = 0; j < listed; ++j) {
    const double value = value_at(j);
    near(got.top_logprobs[j], value, "rank " + std::to_string(j));
    const double gap = absolute ? tolerance : tolerance * std::max(1.0, std::fabs(value));
    const bool near_tie = (j > 0 && value_at(j - 1) - value <= gap) ||
                          (j + 1 < want.order.size() && value - value_at(j + 1) <= gap);
    if (!near_tie) {
      EXPECT_EQ(got.top_ids[j], want.order[j]) << where << ", rank " << j;
    }
  }
}

}  // namespace kvvm::testing
