// What a request's draw changes in the logits before it samples (penalties, logit_bias,
// min_tokens), as the step's LogitAdjustment list: one entry per token the transforms touch,
// rebuilt from the request's tokens at every draw, so a preempted, recomputed or forked
// sequence needs no state of its own beside its tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "kvvm/model/model.h"
#include "request_state.h"

namespace kvvm::engine {

// Whether the request's draws are transformed at all (the common case is not: nothing to build).
bool has_logit_transforms(const RequestState& r);

// An upper bound on the entries append_logit_transforms adds for `r` (at most the vocabulary).
std::size_t logit_transform_bound(const RequestState& r, std::uint32_t vocab);

// Appends the entries of r's next draw to `out` (ids ascending, each once).
// `scratch` is reused between calls.
void append_logit_transforms(const RequestState& r, std::vector<model::LogitAdjustment>& out,
                             std::vector<model::LogitAdjustment>& scratch);

}  // namespace kvvm::engine
