// POST /v1/completions and /v1/chat/completions once the request is parsed and authorised:
// submit it to the engine (one engine request per prompt, each of n choices), then answer with
// the whole completion, or stream it as Server-Sent Events once the engine has answered
// something (so that a refusal in the queue is still a 429). Choices are numbered by prompt,
// then by n, as OpenAI numbers them; a streamed answer interleaves them, each chunk naming
// its choice.
#pragma once

#include <httplib.h>

#include <atomic>

#include "kvvm/engine/engine.h"
#include "metrics.h"
#include "openai_request.h"

namespace kvvm::server {

struct CompletionContext {
  engine::Engine* engine = nullptr;
  ServerMetrics* metrics = nullptr;
  const tokenizer::Tokenizer* tokenizer = nullptr;  // token texts of log-probabilities, echo
  // Streamed answers not yet fully written (httplib cuts a stream at its next write once the
  // server stops, so stop() waits for this to reach zero).
  std::atomic<int>* streams_in_flight = nullptr;
};

// Answers `request` into `res`: a JSON body, an error in OpenAI's shape, or a chunked SSE
// provider that the HTTP library calls after the handler returns.
void answer_completion(const CompletionContext& context, ApiRequest request,
                       httplib::Response& res);

// Writes `error` into `res` (status, JSON body, Retry-After on a 429).
void reply_error(httplib::Response& res, const ApiError& error);

}  // namespace kvvm::server
