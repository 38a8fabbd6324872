// The token mask of a constrained request's next draw, which the step's draw (the model
// runner) and a draft model's proposals (the draft proposer) both apply.
#pragma once

#include <cstdint>
#include <span>

#include "request_state.h"

namespace kvvm::engine {

// Fills `row` with the tokens r's next draw may take: its grammar's, with the request's own end
// tokens (r.ends, which honour stop_ids and ignore_eos) in place of the vocabulary's, allowed
// where the grammar has matched. A grammar that allows no token the request can draw (every
// continuation needs bytes no token has, and no end may come) allows r's ends, or failing
// those token 0; the scheduler then ends the request when the grammar refuses the draw.
// REQUIRES: r.matcher; `row` holds token_mask_words(vocab) words.
void fill_token_mask(RequestState& r, std::span<std::uint32_t> row);

}  // namespace kvvm::engine
