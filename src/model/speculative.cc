// Accepting speculative tokens (speculative.h): the drafts' verdict as a pure function of
// (logits, drafts, draft distributions, params, counter), on the sampler's own distribution.
#include "kvvm/model/speculative.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "base/format.h"  // str, number

namespace kvvm::model {
namespace {

// Inverse CDF over `mass` in id order for u in [0, 1): u * total rounding up to total takes the
// last id of positive mass. REQUIRES: total > 0, the sum of mass in id order.
std::int32_t draw_in_id_order(const std::vector<double>& mass, double total, double u) {
  const double target = u * total;
  double cumulative = 0;
  std::int32_t last_positive = 0;
  for (std::size_t t = 0; t < mass.size(); ++t) {
    if (!(mass[t] > 0)) continue;
    cumulative += mass[t];
    last_positive = static_cast<std::int32_t>(t);
    if (target < cumulative) return last_positive;
  }
  return last_positive;
}

}  // namespace

Status check_speculative(std::span<const float> target_logits, std::uint32_t vocab,
                         std::span<const std::int32_t> drafts, std::span<const float> draft_probs) {
  if (vocab == 0) return Status::InvalidArgument("vocab 0: must be > 0");
  const std::uint64_t k = drafts.size();
  if (target_logits.size() != (k + 1) * vocab) {
    return Status::InvalidArgument("target_logits: " + str(target_logits.size()) +
                                   " values, want (k + 1) * vocab = (" + str(k) + " + 1) * " +
                                   str(vocab) + " = " + str((k + 1) * vocab));
  }
  for (std::size_t i = 0; i < drafts.size(); ++i) {
    if (drafts[i] < 0 || static_cast<std::uint32_t>(drafts[i]) >= vocab) {
      return Status::InvalidArgument("drafts[" + str(i) + "] = " + std::to_string(drafts[i]) +
                                     ": outside the vocabulary [0, " + str(vocab) + ")");
    }
  }
  if (draft_probs.empty()) return Status::Ok();
  if (draft_probs.size() != k * vocab) {
    return Status::InvalidArgument("draft_probs: " + str(draft_probs.size()) +
                                   " values, want 0 (point masses) or k * vocab = " + str(k) +
                                   " * " + str(vocab) + " = " + str(k * vocab));
  }
  for (std::size_t i = 0; i < k; ++i) {
    double sum = 0;
    for (std::size_t t = 0; t < vocab; ++t) {
      const float q = draft_probs[i * vocab + t];
      if (!std::isfinite(q) || q < 0) {
        return Status::InvalidArgument("draft_probs[" + str(i) + "][" + str(t) +
                                       "] = " + number(q) + ": must be finite and >= 0");
      }
      sum += q;
    }
    if (!(std::abs(sum - 1) <= kDraftRowTolerance)) {
      return Status::InvalidArgument("draft_probs row " + str(i) + " sums to " + number(sum) +
                                     ": want 1 within " + number(kDraftRowTolerance));
    }
  }
  return Status::Ok();
}

SpeculativeOutcome accept_drafts(std::span<const float> target_logits, std::uint32_t vocab,
                                 std::span<const std::int32_t> drafts,
                                 std::span<const float> draft_probs, const SamplingParams& params,
                                 std::uint64_t counter) {
  const std::uint32_t k = static_cast<std::uint32_t>(drafts.size());
  auto row = [&](std::uint32_t i) { return target_logits.subspan(std::size_t{i} * vocab, vocab); };
  const bool point_mass_p = params.temperature == 0 || params.top_k == 1;
  if (point_mass_p || draft_probs.empty()) {
    // A point mass q: sample_token's own draw is the test (it picks x_i with probability p_i(x_i))
    // and, when it picks another token, the correction (p_i without x_i, renormalised). Greedy
    // is the case of a point-mass p_i, whatever q_i was.
    for (std::uint32_t i = 0; i < k; ++i) {
      const std::int32_t token = sample_token(row(i), params, counter + i);
      if (token != drafts[i]) return {i, token};
    }
    return {k, sample_token(row(k), params, counter + k)};
  }
  std::vector<double> p(vocab);
  std::vector<double> residual(vocab);
  for (std::uint32_t i = 0; i < k; ++i) {
    sampling_distribution(row(i), params, p);
    const std::span<const float> q = draft_probs.subspan(std::size_t{i} * vocab, vocab);
    const std::size_t x = static_cast<std::size_t>(drafts[i]);
    const double qx = q[x];
    const double u = counter_uniform(params.seed, counter + i);
    if (qx > 0 && u * qx < p[x]) continue;  // probability min(1, p(x) / q(x))
    // Rejected: the residual max(0, p - q), normalised; no mass left falls back to p.
    double total = 0;
    for (std::size_t t = 0; t < vocab; ++t) {
      residual[t] = std::max(0.0, p[t] - static_cast<double>(q[t]));
      total += residual[t];
    }
    const double v = counter_uniform(params.seed, (counter + i) | kRecoveryCounterBit);
    if (total > 0) return {i, draw_in_id_order(residual, total, v)};
    total = 0;
    for (const double mass : p) total += mass;
    return {i, draw_in_id_order(p, total, v)};
  }
  return {k, sample_token(row(k), params, counter + k)};
}

}  // namespace kvvm::model
