// Accepting speculative tokens: given the target model's logits at the k + 1 positions of one
// verification forward (after each of k proposed draft tokens and before the first), how many
// drafts stand and which token follows them. Greedy requests keep the drafts that equal the
// target's argmax; sampled ones use the rejection sampling of Leviathan et al. 2023 and Chen et
// al. 2023 (vLLM's rejection sampler), whose emitted tokens follow the target's distribution
// whatever the drafts were.
//
// Why counters, as in sample_token: a request's n-th output token draws from
// counter_uniform(seed, n), so the same seed gives the same tokens whether the engine speculates
// or not, batches or not, preempts or not. Drafts taken as a point mass (n-gram and greedy draft
// models; draft_probs empty) go further: the tokens are those sample_token would have drawn at
// the same counters from the same rows, so speculation changes the speed and never the text.
//
// Not yet wired into the engine (docs/ARCHITECTURE.md, "Sampling and ends").
#pragma once

#include <cstdint>
#include <span>

#include "kvvm/base/status.h"
#include "kvvm/model/sampling.h"

namespace kvvm::model {

// The recovery draw of a rejected position n (a full draft distribution only) uses counter
// n | kRecoveryCounterBit: the upper half of the counter space, which an ordinary draw
// (n < 2^63) never reaches, so no output's own draw is reused.
inline constexpr std::uint64_t kRecoveryCounterBit = std::uint64_t{1} << 63;

// How far a draft_probs row's sum may lie from 1 (float probabilities summed in double).
inline constexpr double kDraftRowTolerance = 1e-3;

struct SpeculativeOutcome {
  std::uint32_t accepted = 0;  // drafts kept, 0..k: drafts[0, accepted) are emitted as they are
  std::int32_t next = 0;       // the token after them: a correction, or at accepted == k the bonus
};

// InvalidArgument naming the value: vocab 0, target_logits not (k + 1) * vocab values, a draft id
// outside [0, vocab), draft_probs neither empty nor k * vocab values, a draft_probs entry
// negative or not finite, a row whose sum lies more than kDraftRowTolerance from 1.
Status check_speculative(std::span<const float> target_logits, std::uint32_t vocab,
                         std::span<const std::int32_t> drafts, std::span<const float> draft_probs);

// The drafts' verdict. target_logits: [k + 1][vocab], row i the target's logits for the token at
// output counter + i (already through adjust_logits and mask_logits: what sample_token would
// read there). draft_probs: [k][vocab], q_i, the distribution drafts[i] was drawn from; empty:
// a point mass on each draft. p_i is sampling_distribution of row i.
//
// Greedy (temperature 0 or top_k 1): drafts[i] stands while it is row i's argmax (lowest id
// among equals, NaN never); next is the argmax of the first row whose draft fell, or of row k.
//
// Sampled, draft_probs empty: drafts[i] stands when sample_token(row i, counter + i) drew it;
// otherwise next is that draw. The test passes with probability p_i(x_i) (= min(1, p/q) for q a
// point mass) and the draw it rejects with is p_i without x_i, renormalised: the papers' rule,
// with the acceptance and the recovery read off the one uniform of counter + i.
//
// Sampled, draft_probs given: drafts[i] = x stands when u * q_i(x) < p_i(x), u =
// counter_uniform(seed, counter + i) (probability min(1, p_i(x) / q_i(x))); q_i(x) = 0 is a
// rejection (vLLM's rule; such a draft was not drawn from q_i) and p_i(x) = 0 always is. On the
// first rejection next is drawn from max(0, p_i - q_i), normalised, by inverse CDF in id order
// with counter_uniform(seed, (counter + i) | kRecoveryCounterBit); a residual of no mass (q_i
// >= p_i everywhere, by rounding) falls back to p_i with the same uniform.
//
// In every case, all k standing: next = sample_token(row k, params, counter + k), the bonus.
// Counters read: counter + i for i <= accepted (each the counter of an emitted token), and
// (counter + accepted) | kRecoveryCounterBit at a rejection; the following step starts at
// counter + accepted + 1, so nothing is drawn twice.
// REQUIRES: check_sampling(params) and check_speculative(...) passed.
SpeculativeOutcome accept_drafts(std::span<const float> target_logits, std::uint32_t vocab,
                                 std::span<const std::int32_t> drafts,
                                 std::span<const float> draft_probs, const SamplingParams& params,
                                 std::uint64_t counter);

}  // namespace kvvm::model
