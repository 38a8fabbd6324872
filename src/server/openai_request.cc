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
#include "choice_fields.h"
#include "field_values.h"

namespace kvvm::server {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxStopStrings = 4;
constexpr std::size_t kMaxStopBytes = 256;

// The fields each endpoint reads, space-separated. Anything else is ignored (and reported in
// ApiRequest::ignored), as OpenAI's and vLLM's servers do: SDKs and frameworks send fields of
// newer API versions routinely.
constexpr std::string_view kCompletionFields =
    " model prompt max_tokens temperature top_p top_k seed stop stream stream_options user n"
    " best_of logprobs echo suffix presence_penalty frequency_penalty logit_bias"
    " repetition_penalty min_tokens store metadata response_format ";
constexpr std::string_view kChatFields =
    " model messages max_tokens max_completion_tokens temperature top_p top_k seed stop stream"
    " stream_options user n logprobs top_logprobs presence_penalty frequency_penalty logit_bias"
    " repetition_penalty min_tokens store metadata response_format tools tool_choice functions"
    " function_call parallel_tool_calls audio modalities ";

bool known(std::string_view fields, const std::string& key) {
  return !key.empty() && key.find(' ') == std::string::npos &&
         fields.find(" " + key + " ") != std::string_view::npos;
}

// Fields kvvm reads but does not implement: accepted with the value that changes nothing,
// refused as not supported otherwise. Tools are decided in check_tools (they depend on the
// tool choice).
Check refuse_unless_neutral(const std::string& key, const json& value) {
  const auto refuse = [&](std::string_view why) {
    return unsupported(key, shown(value) + " (" + std::string(why) + ")");
  };
  if (key == "suffix") {
    if (value != "") return refuse("no text insertion; omit it");
  } else if (key == "response_format") {
    if (!value.is_object()) return bad_field(key, wrong_type(value, "an object"));
    const auto type = value.find("type");
    if (type == value.end() || *type != "text") {
      return refuse("plain text only; send {\"type\": \"text\"} or omit it");
    }
  } else if (key == "store" || key == "parallel_tool_calls") {
    bool ignored = false;
    if (Check error = read_bool(value, key, &ignored)) return error;
  } else if (key == "metadata") {
    if (!value.is_object()) return bad_field(key, wrong_type(value, "an object"));
  } else if (key == "audio") {
    return refuse("text output only");
  } else if (key == "modalities") {
    if (!value.is_array()) return bad_field(key, wrong_type(value, "an array"));
    for (const json& item : value) {
      if (item != "text") return refuse("text output only; send [\"text\"] or omit it");
    }
  } else if (key == "tools" || key == "functions") {
    if (!value.is_array()) return bad_field(key, wrong_type(value, "an array"));
  } else if (key == "tool_choice" || key == "function_call") {
    if (!value.is_string() && !value.is_object()) {
      return bad_field(key, wrong_type(value, "a string or an object"));
    }
  }
  return std::nullopt;
}

// Tools the client describes are fine while it asks for none to be called (LangChain binds
// tools and then may say "none"); a call kvvm would have to make is refused.
Check check_tools(const json& body) {
  for (const auto& [tools, choice] : {std::pair<const char*, const char*>{"tools", "tool_choice"},
                                      {"functions", "function_call"}}) {
    const auto list = body.find(tools);
    if (list == body.end() || list->is_null() || list->empty()) continue;
    const auto chosen = body.find(choice);
    if (chosen != body.end() && *chosen == "none") continue;
    const std::string asked = chosen == body.end() || chosen->is_null()
                                  ? std::string("\"auto\" (the default)")
                                  : shown(*chosen);
    return unsupported(tools, std::string("calling tools (") + choice + " " + asked + "; send " +
                                  choice + " \"none\" or no " + tools + ")");
  }
  return std::nullopt;
}

Check read_stop(const json& value, std::vector<std::string>* out) {
  const auto one = [&](const json& item, const std::string& param) -> Check {
    if (!item.is_string()) return bad_field(param, wrong_type(item, "a string"));
    const std::string& text = item.get_ref<const std::string&>();
    if (text.empty() || text.size() > kMaxStopBytes) {
      return bad_field(param, "a stop string of " + std::to_string(text.size()) +
                                  " bytes; each must be 1 to " + std::to_string(kMaxStopBytes) +
                                  " bytes");
    }
    out->push_back(text);
    return std::nullopt;
  };
  if (value.is_string()) return one(value, "stop");
  if (!value.is_array()) return bad_field("stop", wrong_type(value, "a string or an array"));
  if (value.size() > kMaxStopStrings) {
    return bad_field("stop", std::to_string(value.size()) + " stop strings; at most " +
                                 std::to_string(kMaxStopStrings));
  }
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (Check error = one(value[i], "stop[" + std::to_string(i) + "]")) return error;
  }
  return std::nullopt;
}

Check read_stream_options(const json& value, bool* include_usage,
                          std::vector<std::string>* ignored) {
  if (!value.is_object()) return bad_field("stream_options", wrong_type(value, "an object"));
  for (const auto& [key, item] : value.items()) {
    const std::string param = "stream_options." + key;
    if (key != "include_usage") {
      ignored->push_back(param);
      continue;
    }
    if (item.is_null()) continue;
    if (Check error = read_bool(item, param, include_usage)) return error;
  }
  return std::nullopt;
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

// One message's content: a string, or text parts joined.
Check read_content(const json& value, const std::string& param, std::string* out,
                   std::vector<std::string>* ignored) {
  if (value.is_string()) {
    *out = value.get<std::string>();
    return std::nullopt;
  }
  if (!value.is_array()) return bad_field(param, wrong_type(value, "a string or an array"));
  for (std::size_t i = 0; i < value.size(); ++i) {
    const json& part = value[i];
    const std::string part_param = param + "[" + std::to_string(i) + "]";
    if (!part.is_object()) return bad_field(part_param, wrong_type(part, "an object"));
    // The type first: an image part is refused for its type, not for its other keys.
    const auto type = part.find("type");
    if (type == part.end()) return bad_field(part_param + ".type", "is required");
    if (*type != "text") {
      return unsupported(part_param + ".type", shown(*type) + " content (text parts only)");
    }
    for (const auto& [key, item] : part.items()) {
      if (key != "type" && key != "text") ignored->push_back("messages.content." + key);
    }
    const auto text = part.find("text");
    if (text == part.end()) return bad_field(part_param + ".text", "is required");
    if (!text->is_string()) return bad_field(part_param + ".text", wrong_type(*text, "a string"));
    *out += text->get_ref<const std::string&>();
  }
  return std::nullopt;
}

// chat's messages through the model's template, encoded as `kvvm generate --chat` does.
Check read_messages(const json& value, const ParseContext& context, std::vector<std::int32_t>* ids,
                    std::vector<std::string>* ignored, bool add_generation_prompt = true) {
  if (!value.is_array()) return bad_field("messages", wrong_type(value, "an array"));
  if (value.empty()) return bad_field("messages", "is empty; send at least one message");
  std::vector<tokenizer::ChatMessage> messages;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const json& item = value[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!item.is_object()) return bad_field(param, wrong_type(item, "an object"));
    for (const auto& [key, field] : item.items()) {
      // A participant's name changes nothing kvvm's templates render: read, not used.
      if (key == "name") {
        if (!field.is_string()) return bad_field(param + ".name", wrong_type(field, "a string"));
      } else if (key != "role" && key != "content") {
        ignored->push_back("messages." + key);
      }
    }
    tokenizer::ChatMessage message;
    if (!item.contains("role")) return bad_field(param + ".role", "is required");
    const json& role = item.at("role");
    if (role == "tool" || role == "function") {
      return unsupported(param + ".role", shown(role) + " (no tool calls)");
    }
    if (role != "system" && role != "developer" && role != "user" && role != "assistant") {
      return bad_field(param + ".role", shown(role) +
                                            " is not a role kvvm takes: system, developer, user "
                                            "or assistant");
    }
    // OpenAI's newer name for the system prompt.
    message.role = role == "developer" ? "system" : role.get<std::string>();
    if (!item.contains("content")) return bad_field(param + ".content", "is required");
    if (Check error =
            read_content(item.at("content"), param + ".content", &message.content, ignored)) {
      return error;
    }
    messages.push_back(std::move(message));
  }
  if (!context.chat_template) {
    return bad_field("messages",
                     "this model has no chat template kvvm recognises; start the server with "
                     "--chat-template chatml|llama3|qwen3, or use /v1/completions");
  }
  Result<std::string> text =
      tokenizer::render_chat(*context.chat_template, messages, add_generation_prompt);
  if (!text.ok()) return bad_field("messages", text.status().message());
  // The template spells the special tokens out: adding them again would double the BOS.
  *ids = context.tokenizer->encode(*text, /*add_special_tokens=*/false);
  if (ids->empty()) return bad_field("messages", "encode to no tokens");
  return std::nullopt;
}

struct Fields {
  std::optional<std::int64_t> max_tokens;
  std::string max_tokens_param = "max_tokens";
  ChoiceFields choices;
};

// Every field but the prompt, into `request`; the prompt's json into `prompt`.
Check read_fields(Endpoint endpoint, const json& body, const ParseContext& context,
                  ApiRequest* request, Fields* fields, const json** prompt) {
  const bool chat = endpoint == Endpoint::kChat;
  const std::string prompt_field = chat ? "messages" : "prompt";
  const std::string context_limit =
      " (the context holds " + std::to_string(context.context_tokens) + " tokens)";
  model::SamplingParams& sampling = request->engine.sampling;
  for (const auto& [key, value] : body.items()) {
    if (!(chat ? known(kChatFields, key) : known(kCompletionFields, key))) {
      request->ignored.push_back(key);
      continue;
    }
    if (value.is_null()) continue;  // null is the default, as OpenAI reads it
    if (key == prompt_field) {
      *prompt = &value;
    } else if (key == "model") {
      if (!value.is_string()) return bad_field(key, wrong_type(value, "a string"));
      request->model = value.get<std::string>();
    } else if (is_penalty_field(key)) {
      if (Check error = read_penalty_field(key, value, context, request)) return error;
    } else if (is_choice_field(key)) {
      if (Check error =
              read_choice_field(endpoint, key, value, context, request, &fields->choices)) {
        return error;
      }
    } else if (key == "max_tokens" || key == "max_completion_tokens") {
      // 0 is for echo (checked once every field is read): the prompt's scores are the answer.
      std::int64_t max_tokens = 0;
      if (Check error = read_integer(value, key, chat ? 1 : 0, context.context_tokens,
                                     context_limit, &max_tokens)) {
        return error;
      }
      if (fields->max_tokens && *fields->max_tokens != max_tokens) {
        return bad_field("max_completion_tokens",
                         "max_tokens and max_completion_tokens differ; send one");
      }
      fields->max_tokens = max_tokens;
      fields->max_tokens_param = key;
    } else if (key == "temperature") {
      double v = 0;
      if (Check error = read_number(value, key, &v)) return error;
      if (v < 0 || v > 2) return bad_field(key, shown(value) + " is out of range [0, 2]");
      sampling.temperature = static_cast<float>(v);
    } else if (key == "top_p") {
      double v = 0;
      if (Check error = read_number(value, key, &v)) return error;
      if (!(v > 0 && v <= 1)) return bad_field(key, shown(value) + " is out of range (0, 1]");
      sampling.top_p = static_cast<float>(v);
    } else if (key == "top_k") {
      std::int64_t v = 0;
      if (Check error = read_integer(value, key, -1, std::numeric_limits<std::uint32_t>::max(),
                                     " (-1 or 0: no limit)", &v)) {
        return error;
      }
      sampling.top_k = v <= 0 ? 0 : static_cast<std::uint32_t>(v);
    } else if (key == "seed") {
      if (Check error = read_seed(value, &sampling.seed)) return error;
    } else if (key == "stop") {
      if (Check error = read_stop(value, &request->engine.stop_strings)) return error;
    } else if (key == "stream") {
      if (Check error = read_bool(value, key, &request->stream)) return error;
    } else if (key == "stream_options") {
      if (Check error = read_stream_options(value, &request->include_usage, &request->ignored)) {
        return error;
      }
    } else if (key == "user") {
      if (!value.is_string()) return bad_field(key, wrong_type(value, "a string"));
      request->user = value.get<std::string>();
    } else if (Check error = refuse_unless_neutral(key, value)) {
      return error;
    }
  }
  return std::nullopt;
}

Check check_model(const json& body, const ParseContext& context, bool required = true) {
  const auto it = body.find("model");
  if (it == body.end() || it->is_null()) {
    if (!required) return std::nullopt;
    return bad_field("model", "is required");
  }
  if (!it->is_string()) return bad_field("model", wrong_type(*it, "a string"));
  if (it->get_ref<const std::string&>() != context.model_name) {
    ApiError error;
    error.status = 404;
    error.type = "invalid_request_error";
    error.code = "model_not_found";
    error.param = "model";
    error.message = "model: " + shown(*it) + " does not exist; this server serves \"" +
                    context.model_name + "\"";
    return error;
  }
  return std::nullopt;
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

std::variant<ApiRequest, ApiError> parse(Endpoint endpoint, std::string_view body,
                                         const ParseContext& context) {
  std::variant<json, ApiError> read = read_body(body, context);
  if (auto* error = std::get_if<ApiError>(&read)) return *error;
  const json& root = std::get<json>(read);
  if (Check error = check_model(root, context)) return *error;

  ApiRequest request;
  request.endpoint = endpoint;
  Fields fields;
  const json* prompt = nullptr;
  if (Check error = read_fields(endpoint, root, context, &request, &fields, &prompt)) {
    return *error;
  }
  if (endpoint == Endpoint::kChat) {
    if (Check error = check_tools(root)) return *error;
  }
  if (Check error = settle_choice_fields(endpoint, fields.choices, &request)) return *error;
  const std::string prompt_field = endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (prompt == nullptr) return bad_field(prompt_field, "is required");
  std::vector<std::int32_t>& ids = request.engine.prompt;
  Check error = endpoint == Endpoint::kChat
                    ? read_messages(*prompt, context, &ids, &request.ignored)
                    : read_prompt(*prompt, context, &ids, &request.more_prompts);
  if (error) return *error;
  if (fields.max_tokens && *fields.max_tokens == 0 && !request.echo) {
    return bad_field(fields.max_tokens_param,
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
  if (fields.max_tokens) {
    request.engine.max_tokens = static_cast<std::uint32_t>(*fields.max_tokens);
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
      return bad_field(fields.max_tokens_param, message.substr(kMaxTokens.size()));
    }
    ApiError refused = bad_field(message.substr(0, message.find_first_of(" :[")), "");
    refused.message = message;
    return refused;
  }
  request.engine.use_model_eos = true;
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
  if (Check error = check_model(root, context, /*required=*/false)) return *error;
  TokenizeRequest request;
  const json* prompt = nullptr;
  const json* messages = nullptr;
  std::optional<bool> add_special;
  bool add_generation_prompt = true;
  for (const auto& [key, value] : root.items()) {
    if (value.is_null()) continue;
    if (key == "model") continue;
    if (key == "prompt") {
      prompt = &value;
    } else if (key == "messages") {
      messages = &value;
    } else if (key == "add_special_tokens") {
      bool v = false;
      if (Check error = read_bool(value, key, &v)) return *error;
      add_special = v;
    } else if (key == "add_generation_prompt") {
      if (Check error = read_bool(value, key, &add_generation_prompt)) return *error;
    } else {
      request.ignored.push_back(key);
    }
  }
  if ((prompt == nullptr) == (messages == nullptr)) {
    return bad_field(prompt == nullptr ? "prompt" : "messages",
                     "send exactly one of prompt (text) and messages (a chat)");
  }
  if (prompt != nullptr) {
    if (!prompt->is_string()) return bad_field("prompt", wrong_type(*prompt, "a string"));
    // As vLLM: a text prompt gets the tokenizer's special tokens unless told otherwise, as the
    // completions endpoint encodes it.
    request.tokens = context.tokenizer->encode(prompt->get_ref<const std::string&>(),
                                               add_special.value_or(true));
    return request;
  }
  // The template spells its special tokens out: adding them again would double the BOS.
  if (add_special.value_or(false)) {
    return unsupported("add_special_tokens", "true with messages (the template writes them)");
  }
  if (Check error = read_messages(*messages, context, &request.tokens, &request.ignored,
                                  add_generation_prompt)) {
    return *error;
  }
  return request;
}

std::variant<DetokenizeRequest, ApiError> detokenize(std::string_view body,
                                                     const ParseContext& context) {
  std::variant<json, ApiError> read = read_body(body, context);
  if (auto* error = std::get_if<ApiError>(&read)) return *error;
  const json& root = std::get<json>(read);
  if (Check error = check_model(root, context, /*required=*/false)) return *error;
  DetokenizeRequest request;
  const json* tokens = nullptr;
  for (const auto& [key, value] : root.items()) {
    if (key == "model" || value.is_null()) continue;
    if (key == "tokens") {
      tokens = &value;
    } else {
      request.ignored.push_back(key);
    }
  }
  if (tokens == nullptr) return bad_field("tokens", "is required");
  if (!tokens->is_array()) return bad_field("tokens", wrong_type(*tokens, "an array of token ids"));
  const std::int64_t last_id = static_cast<std::int64_t>(context.vocab_size) - 1;
  for (std::size_t i = 0; i < tokens->size(); ++i) {
    std::int64_t id = 0;
    if (Check error = read_integer((*tokens)[i], "tokens[" + std::to_string(i) + "]", 0, last_id,
                                   " (the vocabulary's ids)", &id)) {
      return *error;
    }
    request.tokens.push_back(static_cast<std::int32_t>(id));
  }
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
