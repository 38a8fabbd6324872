// Sampling a next token from a row of logits: greedy, temperature, top-k, top-p.
// It lives beside the model because both backends sample inside a step (CUDA on the device,
// from the same counter-based draws); the engine takes its names (kvvm/engine/generate.h).
//
// Why counter-based: the random draw for a request's n-th token is a pure function of
// (seed, n), not of a generator's state shared across a batch, so the same seed gives the
// same tokens whatever else runs beside the request, and a preempted request recomputed
// later draws the same numbers again.
#pragma once

#include <cstdint>
#include <span>

#include "kvvm/status.h"

namespace kvvm::model {

struct SamplingParams {
  float temperature = 0;    // 0: greedy (argmax, lowest id among equals)
  std::uint32_t top_k = 0;  // 0: no limit
  float top_p = 1;          // (0, 1]
  std::uint64_t seed = 0;
};

// InvalidArgument naming the field: temperature < 0 or not finite, top_p outside (0, 1].
Status check_sampling(const SamplingParams& params);

// A uniform double in [0, 1) from (seed, counter): the same pair, the same number.
double counter_uniform(std::uint64_t seed, std::uint64_t counter);

// The token drawn for the `counter`-th output of a request. REQUIRES: check_sampling passed,
// logits non-empty. NaN logits are never chosen (a row of NaN gives token 0).
std::int32_t sample_token(std::span<const float> logits, const SamplingParams& params,
                          std::uint64_t counter);

}  // namespace kvvm::model
