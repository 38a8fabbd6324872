#include "openai_request.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/json_reader.h"
#include "chat_messages.h"
#include "choice_fields.h"
#include "dry_breakers.h"
#include "field_reader.h"
#include "field_values.h"
#include "request_fields.h"
#include "structured_output.h"
#include "tool_fields.h"

namespace kvvm::server {
namespace {

using nlohmann::json;

// The deprecated functions / function_call pair is read but never called: a client that
// lets the model call them is told to send tools (which kvvm calls) instead.
Check check_functions(const RequestBody& body) {
  if (body.functions == nullptr || body.functions->empty()) return std::nullopt;
  if (body.function_call != nullptr && *body.function_call == "none") return std::nullopt;
  const std::string asked = body.function_call == nullptr ? std::string("\"auto\" (the default)")
                                                          : shown(*body.function_call);
  return unsupported("functions", "calling the deprecated functions (function_call " + asked +
                                      "); send them as tools with tool_choice");
}

// One prompt: a string (encoded as `kvvm generate --prompt` does) or token ids.
Check read_one_prompt(const json& value, const std::string& param, const ParseContext& context,
                      std::vector<std::int32_t>* ids) {
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (text.empty()) return bad_field(param, "is empty; send at least one character");
    *ids = context.tokenizer->encode(text, /*add_special_tokens=*/true);
    if (ids->empty()) return bad_field(param, "encodes to no tokens");
    return std::nullopt;
  }
  if (!value.is_array()) {
    return bad_field(param, wrong_type(value, "a string or an array of token ids"));
  }
  if (value.empty()) return bad_field(param, "is an empty array; send at least one token id");
  const std::int64_t last_id = static_cast<std::int64_t>(context.vocab_size) - 1;
  const std::string vocab = " (the vocabulary's ids)";
  for (std::size_t i = 0; i < value.size(); ++i) {
    const json& item = value[i];
    const std::string item_param = param + "[" + std::to_string(i) + "]";
    std::int64_t id = 0;
    if (Check error = read_integer(item, item_param, 0, last_id, vocab, &id)) return error;
    ids->push_back(static_cast<std::int32_t>(id));
  }
  return std::nullopt;
}

// completions' prompt: one prompt, or a list of prompts (strings or token-id arrays), as
// LangChain and other batching clients send them.
Check read_prompt(const json& value, const ParseContext& context, std::vector<std::int32_t>* ids,
                  std::vector<std::vector<std::int32_t>>* more) {
  const bool list =
      value.is_array() && !value.empty() && (value.front().is_string() || value.front().is_array());
  if (!list) return read_one_prompt(value, "prompt", context, ids);
  if (value.size() > context.max_prompts) {
    return bad_field("prompt", "a list of " + std::to_string(value.size()) + " prompts; at most " +
                                   std::to_string(context.max_prompts) + " in one request");
  }
  if (Check error = read_one_prompt(value.front(), "prompt[0]", context, ids)) return error;
  for (std::size_t i = 1; i < value.size(); ++i) {
    std::vector<std::int32_t> next;
    if (Check error =
            read_one_prompt(value[i], "prompt[" + std::to_string(i) + "]", context, &next)) {
      return error;
    }
    more->push_back(std::move(next));
  }
  return std::nullopt;
}

// Another model's name is a 404, before anything else is read; the table checks the type.
Check check_model(const json& body, const ParseContext& context) {
  const auto it = body.find("model");
  if (it == body.end() || !it->is_string()) return std::nullopt;
  if (it->get_ref<const std::string&>() == context.model_name) return std::nullopt;
  ApiError error;
  error.status = 404;
  error.type = "invalid_request_error";
  error.code = "model_not_found";
  error.param = "model";
  error.message =
      "model: " + shown(*it) + " does not exist; this server serves \"" + context.model_name + "\"";
  return error;
}

// The body as a JSON object, through the bounded reader; a 400 naming the body otherwise.
std::variant<json, ApiError> read_body(std::string_view body, const ParseContext& context) {
  JsonLimits limits;
  limits.max_bytes = std::numeric_limits<std::size_t>::max();  // the HTTP layer bounds the body
  limits.max_depth = context.max_json_depth;
  Result<json> parsed = read_json(body, limits, "body");
  if (!parsed.ok()) {
    ApiError error;
    error.message = parsed.status().message();
    return error;
  }
  if (!parsed->is_object()) {
    ApiError error;
    error.message = "body: must be a JSON object, not " + type_name(*parsed);
    return error;
  }
  return std::move(parsed).value();
}

// Runs `parse` with a tokenizer required and no exception escaping: every access is
// type-checked first; this only keeps a missed case a 400.
template <typename Parse>
auto guarded(const ParseContext& context, Parse&& run) -> decltype(run()) {
  if (context.tokenizer == nullptr) {
    ApiError error;
    error.status = 500;
    error.type = "server_error";
    error.message = "the server has no tokenizer";
    return error;
  }
  try {
    return run();
  } catch (const std::exception& e) {
    ApiError error;
    error.message = std::string("body: ") + e.what();
    return error;
  }
}

// The fields the engine takes as they are; what needs the prompt is settled in parse().
void copy_fields(const RequestBody& body, ApiRequest* request) {
  request->model = body.model;
  request->stream = body.stream;
  request->include_usage = body.include_usage;
  request->user = body.user;
  engine::EngineRequest& engine = request->engine;
  model::SamplingParams& sampling = engine.sampling;
  sampling.temperature = static_cast<float>(body.temperature);
  sampling.top_p = static_cast<float>(body.top_p);
  sampling.min_p = static_cast<float>(body.min_p);
  sampling.top_k = body.top_k <= 0 ? 0 : static_cast<std::uint32_t>(body.top_k);
  sampling.seed = body.seed;
  sampling.presence_penalty = static_cast<float>(body.presence_penalty);
  sampling.frequency_penalty = static_cast<float>(body.frequency_penalty);
  sampling.repetition_penalty = static_cast<float>(body.repetition_penalty);
  engine.stop_strings = body.stop;
  engine.logit_bias = body.logit_bias;
  engine.min_tokens = static_cast<std::uint32_t>(body.min_tokens);
  engine.use_model_eos = !body.ignore_eos;
  engine.skip_special_tokens = body.skip_special_tokens;
}

std::variant<ApiRequest, ApiError> parse(Endpoint endpoint, std::string_view body,
                                         const ParseContext& context) {
  std::variant<json, ApiError> read = read_body(body, context);
  if (auto* error = std::get_if<ApiError>(&read)) return *error;
  const json& root = std::get<json>(read);
  if (Check error = check_model(root, context)) return *error;

  ApiRequest request;
  request.endpoint = endpoint;
  RequestBody fields;
  if (Check error = read_fields(request_fields(), endpoint_bit(endpoint), root, context, &fields,
                                &request.ignored)) {
    return *error;
  }
  copy_fields(fields, &request);
  if (fields.dry_multiplier > 0 && fields.dry_penalty_last_n != 0) {
    engine::DryPenalty& dry = request.engine.dry;
    dry.multiplier = static_cast<float>(fields.dry_multiplier);
    dry.base = static_cast<float>(fields.dry_base);
    dry.allowed_length = static_cast<std::uint32_t>(fields.dry_allowed_length);
    dry.last_n =
        fields.dry_penalty_last_n < 0 ? 0 : static_cast<std::uint32_t>(fields.dry_penalty_last_n);
    dry.breakers = dry_breaker_tokens(
        *context.tokenizer, fields.dry_sequence_breakers.value_or(default_dry_breakers()));
  }
  ToolRequest tools;
  if (endpoint == Endpoint::kChat) {
    if (Check error = check_functions(fields)) return *error;
    std::variant<ToolRequest, ApiError> read_tools = read_tool_request(fields);
    if (auto* error = std::get_if<ApiError>(&read_tools)) return *error;
    tools = std::move(std::get<ToolRequest>(read_tools));
  }
  if (Check error = settle_structured_output(fields, body, request.ignored, &request.constraint)) {
    return *error;
  }
  if (Check error = settle_tool_calls(tools, context, &request)) return *error;
  if (endpoint == Endpoint::kChat) request.parsing.reasoning = context.reasoning;
  if (Check error = settle_choice_fields(endpoint, fields, &request)) return *error;
  // max_tokens under the name the client used (chat has two).
  std::optional<std::int64_t> max_tokens = fields.max_tokens;
  std::string max_tokens_param = "max_tokens";
  if (fields.max_completion_tokens) {
    if (max_tokens && *max_tokens != *fields.max_completion_tokens) {
      return bad_field("max_completion_tokens",
                       "max_tokens and max_completion_tokens differ; send one");
    }
    if (!max_tokens) max_tokens_param = "max_completion_tokens";
    max_tokens = fields.max_completion_tokens;
  }
  const std::string prompt_field = endpoint == Endpoint::kChat ? "messages" : "prompt";
  std::vector<std::int32_t>& ids = request.engine.prompt;
  if (endpoint == Endpoint::kChat) {
    ChatPrompt prompt;
    if (Check error = read_chat_prompt(fields, body, context, &prompt, &request.ignored)) {
      return *error;
    }
    ids = std::move(prompt.ids);
    // A prompt that closed an empty think block (Qwen3's enable_thinking false) is answered
    // without thinking.
    request.parsing.thinking = !prompt_closes_reasoning(prompt.text);
  } else if (Check error = read_prompt(*fields.prompt, context, &ids, &request.more_prompts)) {
    return *error;
  }
  if (max_tokens && *max_tokens == 0 && !request.echo) {
    return bad_field(max_tokens_param,
                     "0 is out of range [1, " + std::to_string(context.context_tokens) +
                         "] (0 only with echo: the prompt's log-probabilities are the answer)");
  }

  // The longest prompt bounds max_tokens: every prompt of a list gets the same.
  std::uint64_t prompt_tokens = ids.size();
  for (const auto& more : request.more_prompts)
    prompt_tokens = std::max(prompt_tokens, more.size());
  // At least one token must be left to generate.
  const std::uint64_t context_tokens = context.context_tokens;
  if (prompt_tokens >= context_tokens) {
    return bad_field(prompt_field, "the prompt is " + std::to_string(prompt_tokens) +
                                       " tokens; the context holds " +
                                       std::to_string(context_tokens) +
                                       " (prompt and max_tokens together)");
  }
  const std::uint64_t room = context_tokens - prompt_tokens;
  if (max_tokens) {
    request.engine.max_tokens = static_cast<std::uint32_t>(*max_tokens);
  } else {
    const std::uint64_t wanted = std::max<std::uint64_t>(context.default_max_tokens, 1);
    request.engine.max_tokens = static_cast<std::uint32_t>(std::min(wanted, room));
  }
  // Echo with no tokens to generate: the prompt is the answer; it is computed for its scores.
  if (request.echo && request.engine.max_tokens == 0) request.engine.prompt_logprobs = true;
  // The engine's own check and words, so a client reads what Engine::submit would say.
  engine::EngineRequest longest = request.engine;
  longest.prompt.assign(prompt_tokens, 0);
  const Status checked = engine::check_request_limits(
      longest, engine::RequestLimits{.context = context_tokens, .vocab_size = context.vocab_size});
  if (!checked.ok()) {
    // The message names its field first; max_tokens goes under the name the client used.
    const std::string& message = checked.message();
    constexpr std::string_view kMaxTokens = "max_tokens: ";
    if (message.starts_with(kMaxTokens)) {
      return bad_field(max_tokens_param, message.substr(kMaxTokens.size()));
    }
    ApiError refused = bad_field(message.substr(0, message.find_first_of(" :[")), "");
    refused.message = message;
    return refused;
  }
  return request;
}

}  // namespace

std::variant<ApiRequest, ApiError> parse_request(Endpoint endpoint, std::string_view body,
                                                 const ParseContext& context) {
  return guarded(context, [&] { return parse(endpoint, body, context); });
}

namespace {

std::variant<TokenizeRequest, ApiError> tokenize(std::string_view body,
                                                 const ParseContext& context) {
  std::variant<json, ApiError> read = read_body(body, context);
  if (auto* error = std::get_if<ApiError>(&read)) return *error;
  const json& root = std::get<json>(read);
  if (Check error = check_model(root, context)) return *error;
  TokenizeRequest request;
  RequestBody fields;
  if (Check error =
          read_fields(request_fields(), kInTokenize, root, context, &fields, &request.ignored)) {
    return *error;
  }
  const json* prompt = fields.prompt;
  const json* messages = fields.messages;
  if ((prompt == nullptr) == (messages == nullptr)) {
    return bad_field(prompt == nullptr ? "prompt" : "messages",
                     "send exactly one of prompt (text) and messages (a chat)");
  }
  if (prompt != nullptr) {
    // As vLLM: a text prompt gets the tokenizer's special tokens unless told otherwise, as the
    // completions endpoint encodes it.
    request.tokens = context.tokenizer->encode(prompt->get_ref<const std::string&>(),
                                               fields.add_special_tokens.value_or(true));
    return request;
  }
  // The template spells its special tokens out: adding them again would double the BOS.
  if (fields.add_special_tokens.value_or(false)) {
    return unsupported("add_special_tokens", "true with messages (the template writes them)");
  }
  ChatPrompt chat;
  if (Check error = read_chat_prompt(fields, body, context, &chat, &request.ignored)) {
    return *error;
  }
  request.tokens = std::move(chat.ids);
  return request;
}

std::variant<DetokenizeRequest, ApiError> detokenize(std::string_view body,
                                                     const ParseContext& context) {
  std::variant<json, ApiError> read = read_body(body, context);
  if (auto* error = std::get_if<ApiError>(&read)) return *error;
  const json& root = std::get<json>(read);
  if (Check error = check_model(root, context)) return *error;
  DetokenizeRequest request;
  RequestBody fields;
  if (Check error =
          read_fields(request_fields(), kInDetokenize, root, context, &fields, &request.ignored)) {
    return *error;
  }
  request.tokens = std::move(fields.tokens);
  return request;
}

}  // namespace

std::variant<TokenizeRequest, ApiError> parse_tokenize(std::string_view body,
                                                       const ParseContext& context) {
  return guarded(context, [&] { return tokenize(body, context); });
}

std::variant<DetokenizeRequest, ApiError> parse_detokenize(std::string_view body,
                                                           const ParseContext& context) {
  return guarded(context, [&] { return detokenize(body, context); });
}

}  // namespace kvvm::server
