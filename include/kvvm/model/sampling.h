// Sampling a next token from a row of logits: greedy, temperature, top-k, top-p; and the
// log-probabilities a request may ask beside its tokens. It lives beside the model because both
// backends sample inside a step (CUDA on the device, from the same counter-based draws); the engine
// takes its names (kvvm/engine/generate.h).
//
// Why counter-based: the random draw for a request's n-th token is a pure function of
// (seed, n), not of a generator's state shared across a batch, so the same seed gives the
// same tokens whatever else runs beside the request, and a preempted request recomputed
// later draws the same numbers again.
#pragma once

#include <cstdint>
#include <span>

#include "kvvm/base/status.h"

namespace kvvm::model {

struct SamplingParams {
  float temperature = 0;    // 0: greedy (argmax, lowest id among equals)
  std::uint32_t top_k = 0;  // 0: no limit
  float top_p = 1;          // (0, 1]
  // [0, 1]; 0: off. Tokens whose probability is below min_p times the most likely one's are
  // dropped first, then top-k, then top-p over what is left (vLLM's order).
  float min_p = 0;
  std::uint64_t seed = 0;
  // Penalties on what the sequence has seen (vLLM's and OpenAI's): presence and frequency on
  // the output so far, repetition (> 0; 1: none) on the prompt and the output. They act
  // through the chunk's LogitAdjustment entries (model.h), which say what was seen.
  float presence_penalty = 0;
  float frequency_penalty = 0;
  float repetition_penalty = 1;
};

// InvalidArgument naming the field: temperature < 0 or not finite, top_p outside (0, 1], min_p
// outside [0, 1], a penalty not finite, repetition_penalty <= 0.
Status check_sampling(const SamplingParams& params);

// One token's transform before a draw: what the row's sequence has seen of it, and a bias.
struct LogitAdjustment {
  std::int32_t id = 0;
  std::uint32_t count = 0;      // times in the output so far
  std::uint32_t in_prompt = 0;  // 1: in the prompt
  float bias = 0;               // logit_bias; -inf bans the token (min_tokens)
};

// The transforms of one row, in place, in vLLM's order: l += bias; then, when the token was
// seen (count > 0 or in_prompt) and repetition_penalty != 1, l = l > 0 ? l / r : l * r; then
// l -= frequency_penalty * count + presence_penalty * (count > 0). Tokens not listed keep
// their logit. The draw and the log-probabilities read the transformed row.
// REQUIRES: ids inside the row, each listed once.
void adjust_logits(std::span<float> logits, const SamplingParams& params,
                   std::span<const LogitAdjustment> adjustments);
// One entry's transformed logit (what adjust_logits writes; the CUDA kernel's arithmetic).
float adjusted_logit(float logit, const SamplingParams& params, const LogitAdjustment& a);

// A token mask on one row, in place: every token whose bit (bit t % 32 of word t / 32) is 0 gets
// -inf, so no draw picks it and its probability is 0. REQUIRES: the mask covers the row.
void mask_logits(std::span<float> logits, std::span<const std::uint32_t> mask);

// A uniform double in [0, 1) from (seed, counter): the same pair, the same number.
double counter_uniform(std::uint64_t seed, std::uint64_t counter);

// The token drawn for the `counter`-th output of a request. REQUIRES: check_sampling passed,
// logits non-empty. NaN logits are never chosen (a row of NaN gives token 0).
std::int32_t sample_token(std::span<const float> logits, const SamplingParams& params,
                          std::uint64_t counter);

// The distribution sample_token draws from, one double per token of the row: the temperature's
// softmax after the min_p, top-k and top-p cuts, renormalised over what they keep; 0 for NaN
// logits and cut tokens. Where sample_token takes the argmax (temperature 0, top_k 1, no finite
// maximum), a point mass on it. The same cuts, in the same arithmetic, as sample_token (one
// function under both). REQUIRES: check_sampling passed, logits non-empty, out.size() ==
// logits.size().
void sampling_distribution(std::span<const float> logits, const SamplingParams& params,
                           std::span<double> out);

// The most alternatives a row's log-probabilities report (OpenAI's top_logprobs bound).
inline constexpr std::uint32_t kMaxTopLogprobs = 20;

// Log-probabilities are log_softmax of the row's logits divided by the temperature when it is
// > 0 (the logits themselves when 0); top_k / top_p truncations are not applied to them.
// CPU reference used by the CPU model and by tests: fills `target_logprob` = logprob of
// `target`, and the `top` (<= kMaxTopLogprobs) most likely ids in descending log-prob order
// (lowest id first among equals) with their log-probs. Computed in double, stored as float.
// NaN logits are left out of the softmax and never listed: when fewer than `top` ids remain,
// the slots past them get id -1 and log-prob -inf. A target outside the vocabulary, or of a
// NaN logit, scores NaN.
void row_logprobs(std::span<const float> logits, float temperature, std::int32_t target,
                  std::uint32_t top, float* target_logprob, std::int32_t* top_ids,
                  float* top_logprobs);

}  // namespace kvvm::model
