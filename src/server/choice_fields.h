// What the choice fields mean together, once the table has read each (request_fields.h): how
// many answers a request gets (n, best_of) and what each reports (completions' logprobs and
// echo, chat's logprobs and top_logprobs).
#pragma once

#include "field_values.h"
#include "openai_request.h"
#include "request_fields.h"

namespace kvvm::server {

// best_of other than n drops choices, which kvvm does not do; chat's top_logprobs needs
// logprobs, as OpenAI requires; echo with log-probabilities scores the prompt.
Check settle_choice_fields(Endpoint endpoint, const RequestBody& body, ApiRequest* request);

}  // namespace kvvm::server
