// DRY ("don't repeat yourself", the sampler llama.cpp and text-generation-webui offer): a token
// that would extend a repetition of the context is penalized, more the longer the repetition.
// For each earlier place where the context's last L tokens also occur, the token that followed
// them there would make the repetition L + 1 long; with L >= allowed_length it gets
//   multiplier * base ^ (L - allowed_length)
// subtracted from its logit (the longest L of the token's places). A sequence breaker (a token
// whose text holds "\n", ":", "\"" or "*" by default) ends a repetition: none runs across one,
// and a breaker is never penalized. Found in one pass with the Z-function of the reversed
// context (O(n) a draw), rebuilt from the tokens at every draw like the other transforms.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/model/sampling.h"

namespace kvvm::engine {

// The exponent L - allowed_length at most: the penalty stays finite (1.75^64 is ~3.6e15).
inline constexpr std::uint32_t kDryMaxExponent = 64;

// Appends a LogitAdjustment of bias -penalty for each token `context` (the request's prompt and
// output, its last dry.last_n tokens when that is not 0) penalizes, each once, in no order.
// `scratch` is reused between calls.
void append_dry_penalties(std::span<const std::int32_t> context, const DryPenalty& dry,
                          std::vector<model::LogitAdjustment>& out,
                          std::vector<std::int64_t>& scratch);

}  // namespace kvvm::engine
