// The OpenAI response bodies: a whole completion, the streamed chunks (Server-Sent Events),
// the usage record and the model list. Text is dumped with invalid UTF-8 replaced (U+FFFD),
// never thrown on.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "answer_reader.h"
#include "kvvm/engine/engine.h"
#include "openai_request.h"

namespace kvvm::server {

struct Usage {
  std::uint64_t prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;
  std::uint64_t cached_tokens = 0;  // prompt_tokens_details.cached_tokens
};
Usage usage_of(const engine::RequestStats& stats);

// "stop" (an end token or a stop string) or "length"; cancelled / error are not answered.
// "tool_calls" instead of "stop" when the answer called tools.
std::string_view finish_reason(engine::RequestEnd end, bool called_tools = false);

struct ResponseHead {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;            // "cmpl-..." / "chatcmpl-..."
  std::int64_t created = 0;  // Unix seconds
  std::string model;
};
// A fresh response id for `endpoint`: its prefix and 24 random hex digits.
std::string response_id(Endpoint endpoint);
// `prefix` and 24 random hex digits ("req_": the x-request-id every answer carries).
std::string random_id(std::string_view prefix);

// One choice of an answer, or its piece in a streamed chunk.
struct ChoiceText {
  std::uint32_t index = 0;
  std::string_view text;
  std::optional<std::string_view> finish;  // null until the choice's last chunk
  nlohmann::json logprobs = nullptr;       // logprobs_json.h's, or null when not asked
  // Chat with tools or reasoning (AnswerParsing): the answer read into its parts, which the
  // message (or the delta) carries instead of `text`.
  const AssistantMessage* message = nullptr;  // completion_body
  const AssistantDelta* delta = nullptr;      // stream_chunk
};

// The whole answer: object "text_completion" (choices[i].text) or "chat.completion"
// (choices[i].message {role: assistant, content, refusal: null}; with a read answer: content
// null when it is only calls, tool_calls [{id, type: function, function {name, arguments}}],
// reasoning_content when there was reasoning), finish_reason, logprobs, usage.
nlohmann::json completion_body(const ResponseHead& head, std::span<const ChoiceText> choices,
                               const Usage& usage);
// One choice, no log-probabilities.
nlohmann::json completion_body(const ResponseHead& head, std::string_view text,
                               std::string_view finish, const Usage& usage);
// One streamed chunk of one choice: "text_completion" (choices[0].text) or
// "chat.completion.chunk" (choices[0].delta: {role: assistant} on the choice's first, {content}
// after; with a read answer, reasoning_content and tool_calls [{index, id, type, function
// {name, arguments}}] pieces as the SDKs accumulate them); finish_reason null until the
// choice's last. `usage_follows`
// (stream_options.include_usage): "usage": null, as OpenAI writes it on every chunk before the
// usage chunk; otherwise no usage field.
nlohmann::json stream_chunk(const ResponseHead& head, const ChoiceText& choice, bool first,
                            bool usage_follows = false);
nlohmann::json stream_chunk(const ResponseHead& head, std::string_view text, bool first,
                            std::optional<std::string_view> finish, bool usage_follows = false);
// The last chunk before [DONE] when usage is asked for: choices [] and usage.
nlohmann::json usage_chunk(const ResponseHead& head, const Usage& usage);
// GET /v1/models/{model}: {id, object: model, created, owned_by: kvvm, max_model_len,
// quantization} (quantization: to_string(WeightQuant), "none" for a 16-bit checkpoint).
nlohmann::json model_body(std::string_view model, std::int64_t created, std::uint64_t max_model_len,
                          std::string_view quantization);
// GET /v1/models: {object: list, data: [model_body]}.
nlohmann::json models_body(std::string_view model, std::int64_t created,
                           std::uint64_t max_model_len, std::string_view quantization);

// "data: JSON\n\n", and the stream's end "data: [DONE]\n\n".
std::string sse_event(const nlohmann::json& value);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// nlohmann's dump that replaces invalid UTF-8 instead of throwing.
std::string dump_json(const nlohmann::json& value);

}  // namespace kvvm::server
