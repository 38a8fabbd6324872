// The OpenAI request bodies kvvm serves, read into an EngineRequest: POST /v1/completions and
// POST /v1/chat/completions.
//
// Lenient where OpenAI's and vLLM's servers are, strict where it matters:
// - A field kvvm does not know (at the top level, in a message, in a content part, in
//   stream_options), or one only another endpoint takes, is ignored and its name reported in
//   ApiRequest::ignored (the server logs each name once and counts it): SDKs and frameworks
//   send newer API fields routinely.
// - A field kvvm knows but does not implement is accepted with its neutral value (suffix "",
//   response_format {type: text}, modalities ["text"], tools with tool_choice "none") and
//   otherwise refused with a 400 "<field>: ... is not supported by this server" (suffix,
//   best_of other than n, tool calls, audio, image parts, the tool role).
// - Structured output (response_format json_object / json_schema, vLLM's guided_* fields and
//   structured_outputs) is read into at most one constraint (structured_output.h); anything
//   near a constraint that kvvm does not know is refused, never ignored.
// - Every field kvvm uses is checked (type, range) and a bad value is a 400 naming the field.
//
// Every field is declared once, in request_fields.cc (its type, range, default and the
// endpoints that accept it), and read by the one reader (field_reader.h). The values with an
// inner structure are read here after the table: completions' prompt (a string, an array of
// token ids, or a list of up to max_prompts of those) and chat's messages ([{role:
// system|developer|user|assistant, content: string or [{type: "text", text}], name}], through
// the model's chat template; developer is rendered as system). What fields mean together is
// settled after: max_tokens (chat also max_completion_tokens; default: min(default_max_tokens,
// the context left after the prompt); 0 only with echo), n and best_of, the log-probabilities
// (choice_fields.h), tools with their tool choice.
// A prompt or messages past the context, or prompt + max_tokens past it, is a 400 naming the
// field with both numbers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "answer_reader.h"
#include "api_error.h"
#include "kvvm/engine/engine.h"
#include "kvvm/grammar/constraint.h"
#include "kvvm/tokenizer/chat_renderer.h"
#include "kvvm/tokenizer/tokenizer.h"

namespace kvvm::server {

enum class Endpoint : std::uint8_t { kCompletions, kChat };

struct ParseContext {
  const tokenizer::Tokenizer* tokenizer = nullptr;  // required
  // The model's chat template (it outlives the context); null: chat requests are refused (400
  // naming messages, the message saying to start the server with --chat-template).
  const tokenizer::ChatRenderer* chat_renderer = nullptr;
  std::string model_name;                  // what `model` must equal
  std::uint32_t context_tokens = 0;        // prompt + max_tokens must fit
  std::uint32_t vocab_size = 0;            // token-id prompts must be below it
  std::uint32_t default_max_tokens = 256;  // when the body gives none
  std::uint32_t max_n = 16;                // n (and best_of) at most
  std::uint32_t max_prompts = 128;         // prompts in a completions list at most
  // How a chat answer is read when its request offers tools the model may call (nullopt: such
  // a request is a 400 saying to start the server with --tool-call-parser), and whether its
  // reasoning is split out.
  std::optional<ToolCallFormat> tool_call_format;
  ReasoningFormat reasoning = ReasoningFormat::kNone;
  // Nesting the body may have (the reader's bound): tool definitions and their JSON Schemas nest
  // tens of levels; nlohmann's recursion stays far from the stack's end at this depth.
  std::size_t max_json_depth = 128;
};

// A request's structured output (structured_output.h): the constraint and the field the body
// gave it in, which every refusal of it names ("guided_regex",
// "response_format.json_schema.schema").
struct ConstraintRequest {
  grammar::Constraint constraint;
  std::string field;
};

struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  // Prompt ids (completions' text encoded with the tokenizer's special tokens added, as
  // `kvvm generate --prompt` does; chat rendered by the template and encoded without adding
  // them, as `kvvm generate --chat` does), max_tokens, sampling, stop strings. The tenant is
  // left 0: the server sets it from the API key.
  engine::EngineRequest engine;
  // A completions prompt list's other prompts, each answered as engine with its prompt
  // replaced: choices are ordered by prompt, then by n.
  std::vector<std::vector<std::int32_t>> more_prompts;
  // Completions' echo: each choice's text starts with its prompt (and its log-probabilities
  // with the prompt's, the first token's null).
  bool echo = false;
  std::string model;
  bool stream = false;
  // Streamed: a last chunk with usage before [DONE]; only when stream_options asks, as OpenAI
  // sends it (a chunk with no choices breaks clients that read choices[0]).
  bool include_usage = false;
  std::string user;
  // What the output must match (at most one per request); compiled by the server's grammar
  // cache on the HTTP thread into engine.grammar before submit.
  std::optional<ConstraintRequest> constraint;
  // Chat: how the answer's text is read (reasoning, tool calls); nothing for plain text.
  AnswerParsing parsing;
  // Fields the body held that kvvm does not know ("temprature", "messages.tool_calls",
  // "stream_options.continuous_usage_stats"): ignored. Top-level names first, in key order.
  std::vector<std::string> ignored;
};

// POST /tokenize (vLLM's): {model (optional; the served one), prompt (text, special tokens
// added unless add_special_tokens is false) or messages (a chat through the template, as the
// chat endpoint renders it; add_generation_prompt, default true)}.
struct TokenizeRequest {
  std::vector<std::int32_t> tokens;
  std::vector<std::string> ignored;  // as ApiRequest::ignored
};
// POST /detokenize (vLLM's): {model (optional), tokens: [ids of the vocabulary]}.
struct DetokenizeRequest {
  std::vector<std::int32_t> tokens;
  std::vector<std::string> ignored;
};
std::variant<TokenizeRequest, ApiError> parse_tokenize(std::string_view body,
                                                       const ParseContext& context);
std::variant<DetokenizeRequest, ApiError> parse_detokenize(std::string_view body,
                                                           const ParseContext& context);

// The body's JSON is read with kvvm's bounded reader (depth, UTF-8): a body nested deeper
// than max_json_depth, invalid JSON or invalid UTF-8 is a 400 naming the body.
std::variant<ApiRequest, ApiError> parse_request(Endpoint endpoint, std::string_view body,
                                                 const ParseContext& context);

}  // namespace kvvm::server
