// The OpenAI request bodies kvvm serves, read into an EngineRequest: POST /v1/completions and
// POST /v1/chat/completions.
//
// Every field is checked with the field named in the 400: type, range, and anything kvvm does
// not do is refused by name rather than ignored (n > 1, best_of, logprobs, echo, suffix,
// non-zero presence / frequency penalties, a non-empty logit_bias, tools, a list of prompts);
// an unknown field is refused too (a typo must not silently change the output). Fields sent
// with their neutral value by common clients (n: 1, logprobs: false / null, penalties 0,
// stream_options) are accepted.
//
// Fields: model (required; must be the served model's name, else 404), prompt (completions:
// a string, or an array of token ids), messages (chat: [{role: system|user|assistant,
// content: string or [{type: "text", text}]}], through the model's chat template),
// max_tokens (chat also max_completion_tokens; default: min(default_max_tokens, the context
// left after the prompt)), temperature [0, 2], top_p (0, 1], top_k (-1 or 0: off, else
// >= 1), seed (integer; default 0), stop (a string or up to 4 strings, each 1..256 bytes),
// stream (bool), stream_options {include_usage: bool}, user (string, kept for logs).
// A prompt or messages past the context, or prompt + max_tokens past it, is a 400 naming the
// field with both numbers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "api_error.h"
#include "kvvm/engine/engine.h"
#include "kvvm/tokenizer/chat_template.h"
#include "kvvm/tokenizer/tokenizer.h"

namespace kvvm::server {

enum class Endpoint : std::uint8_t { kCompletions, kChat };

struct ParseContext {
  const tokenizer::Tokenizer* tokenizer = nullptr;  // required
  // The model's chat template; nullopt: chat requests are refused (400 naming messages, the
  // message saying to start the server with --chat-template).
  std::optional<tokenizer::ChatTemplate> chat_template;
  std::string model_name;                  // what `model` must equal
  std::uint32_t context_tokens = 0;        // prompt + max_tokens must fit
  std::uint32_t vocab_size = 0;            // token-id prompts must be below it
  std::uint32_t default_max_tokens = 256;  // when the body gives none
  std::size_t max_json_depth = 16;         // nesting the body may have (the reader's bound)
};

struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  // Prompt ids (completions' text encoded with the tokenizer's special tokens added, as
  // `kvvm generate --prompt` does; chat rendered by the template and encoded without adding
  // them, as `kvvm generate --chat` does), max_tokens, sampling, stop strings. The tenant is
  // left 0: the server sets it from the API key.
  engine::EngineRequest engine;
  std::string model;
  bool stream = false;
  bool include_usage = true;  // streamed: a last chunk with usage before [DONE] (default on)
  std::string user;
};

// The body's JSON is read with kvvm's bounded reader (depth, UTF-8): a body nested deeper
// than max_json_depth, invalid JSON or invalid UTF-8 is a 400 naming the body.
std::variant<ApiRequest, ApiError> parse_request(Endpoint endpoint, std::string_view body,
                                                 const ParseContext& context);

}  // namespace kvvm::server
