// The request fields that choose how many answers a request gets and how each is drawn and
// reported: n and best_of, log-probabilities (completions' logprobs and echo, chat's logprobs
// and top_logprobs), the penalties, logit_bias and min_tokens. Read into the EngineRequest;
// settle_choice_fields checks what they mean together once every field is read.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "field_values.h"
#include "openai_request.h"

namespace kvvm::server {

// What the choice fields said, before they are settled into the request.
struct ChoiceFields {
  std::int64_t n = 1;
  std::optional<std::int64_t> best_of;
  bool chat_logprobs = false;                // chat's logprobs
  std::optional<std::int64_t> top_logprobs;  // chat's alternatives
};

bool is_choice_field(const std::string& key);
// n, best_of, logprobs, top_logprobs, echo.
Check read_choice_field(Endpoint endpoint, const std::string& key, const nlohmann::json& value,
                        const ParseContext& context, ApiRequest* request, ChoiceFields* fields);
// best_of other than n drops choices, which kvvm does not do; chat's top_logprobs needs
// logprobs, as OpenAI requires; echo with log-probabilities scores the prompt.
Check settle_choice_fields(Endpoint endpoint, const ChoiceFields& fields, ApiRequest* request);

bool is_penalty_field(const std::string& key);
// presence_penalty and frequency_penalty [-2, 2], repetition_penalty (0, 10], min_tokens
// [0, context], logit_bias {"<id>": [-100, 100]} over ids of the vocabulary (1,024 at most).
Check read_penalty_field(const std::string& key, const nlohmann::json& value,
                         const ParseContext& context, ApiRequest* request);

}  // namespace kvvm::server
