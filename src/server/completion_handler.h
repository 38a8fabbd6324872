// POST /v1/completions and /v1/chat/completions once the request is parsed and authorised:
// submit it to the engine, then answer with the whole completion, or stream it as Server-Sent
// Events once the engine has admitted it (so that a refusal in the queue is still a 429).
#pragma once

#include <httplib.h>

#include "kvvm/engine/engine.h"
#include "metrics.h"
#include "openai_request.h"

namespace kvvm::server {

struct CompletionContext {
  engine::Engine* engine = nullptr;
  ServerMetrics* metrics = nullptr;
};

// Answers `request` into `res`: a JSON body, an error in OpenAI's shape, or a chunked SSE
// provider that the HTTP library calls after the handler returns.
void answer_completion(const CompletionContext& context, ApiRequest request,
                       httplib::Response& res);

// Writes `error` into `res` (status, JSON body, Retry-After on a 429).
void reply_error(httplib::Response& res, const ApiError& error);

}  // namespace kvvm::server
