#include "choice_fields.h"

#include <cstdint>
#include <string>

namespace kvvm::server {

Check settle_choice_fields(Endpoint endpoint, const RequestBody& body, ApiRequest* request) {
  if (body.best_of && *body.best_of != body.n) {
    return unsupported("best_of", std::to_string(*body.best_of) + " with n " +
                                      std::to_string(body.n) +
                                      " (choosing the best of several; send n alone)");
  }
  request->engine.n = static_cast<std::uint32_t>(body.n);
  if (endpoint == Endpoint::kChat) {
    if (body.top_logprobs && *body.top_logprobs > 0 && !body.chat_logprobs) {
      return bad_field("top_logprobs", "needs logprobs: true");
    }
    if (body.chat_logprobs) {
      request->engine.logprobs = static_cast<std::uint32_t>(body.top_logprobs.value_or(0));
    }
  } else if (body.logprobs) {
    request->engine.logprobs = static_cast<std::uint32_t>(*body.logprobs);
  }
  request->echo = body.echo;
  // Echo with log-probabilities reports the prompt's too (what scoring harnesses read).
  request->engine.prompt_logprobs = request->echo && request->engine.logprobs.has_value();
  return std::nullopt;
}

}  // namespace kvvm::server
