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

namespace kvvm::server {
namespace {

using nlohmann::json;

// Every check returns the error it found, or nothing.
using Check = std::optional<ApiError>;

constexpr std::size_t kMaxStopStrings = 4;
constexpr std::size_t kMaxStopBytes = 256;

// The fields each endpoint knows, space-separated: anything else is refused by name.
constexpr std::string_view kCompletionFields =
    " model prompt max_tokens temperature top_p top_k seed stop stream stream_options user n"
    " best_of logprobs echo suffix presence_penalty frequency_penalty logit_bias ";
constexpr std::string_view kChatFields =
    " model messages max_tokens max_completion_tokens temperature top_p top_k seed stop stream"
    " stream_options user n logprobs top_logprobs presence_penalty frequency_penalty logit_bias"
    " tools tool_choice functions function_call ";

bool known(std::string_view fields, const std::string& key) {
  return !key.empty() && key.find(' ') == std::string::npos &&
         fields.find(" " + key + " ") != std::string_view::npos;
}

// The value as the client wrote it, shortened: for messages that name a bad value.
std::string shown(const json& value) {
  constexpr std::size_t kMaxShown = 64;
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > kMaxShown) text = text.substr(0, kMaxShown) + "...";
  return text;
}

std::string type_name(const json& value) { return value.type_name(); }

std::string wrong_type(const json& value, std::string_view wanted) {
  return "must be " + std::string(wanted) + ", not " + type_name(value) + " " + shown(value);
}

// A JSON number (integer or float, never a boolean or a string) as a double.
Check read_number(const json& value, std::string_view param, double* out) {
  if (!value.is_number()) return bad_field(param, wrong_type(value, "a number"));
  *out = value.get<double>();
  return std::nullopt;
}

// An integer in [lo, hi]: a JSON integer, or a float with no fraction (16.0), as the
// OpenAI server takes them. `limit` says where the bounds come from.
Check read_integer(const json& value, std::string_view param, std::int64_t lo, std::int64_t hi,
                   std::string_view limit, std::int64_t* out) {
  if (!value.is_number()) return bad_field(param, wrong_type(value, "an integer"));
  const std::string range =
      "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]" + std::string(limit);
  if (value.is_number_unsigned()) {
    const std::uint64_t v = value.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(hi)) {
      return bad_field(param, std::to_string(v) + " is out of range " + range);
    }
    *out = static_cast<std::int64_t>(v);
  } else if (value.is_number_integer()) {
    *out = value.get<std::int64_t>();
  } else {
    const double v = value.get<double>();
    if (std::floor(v) != v) return bad_field(param, shown(value) + " is not an integer");
    // Compared as doubles: a value past int64 (1e30, 2^64) must not reach the cast.
    if (v < static_cast<double>(lo) || v > static_cast<double>(hi)) {
      return bad_field(param, shown(value) + " is out of range " + range);
    }
    *out = static_cast<std::int64_t>(v);
  }
  if (*out < lo || *out > hi) {
    return bad_field(param, std::to_string(*out) + " is out of range " + range);
  }
  return std::nullopt;
}

// Any 64-bit signed or unsigned integer, folded into the sampler's uint64 (two's complement).
Check read_seed(const json& value, std::uint64_t* out) {
  if (!value.is_number()) return bad_field("seed", wrong_type(value, "an integer"));
  if (value.is_number_unsigned()) {
    *out = value.get<std::uint64_t>();
  } else if (value.is_number_integer()) {
    *out = static_cast<std::uint64_t>(value.get<std::int64_t>());
  } else {
    const double v = value.get<double>();
    constexpr double kTwo63 = 9223372036854775808.0;
    if (std::floor(v) != v) return bad_field("seed", shown(value) + " is not an integer");
    if (v < -kTwo63 || v >= 2 * kTwo63) {
      return bad_field("seed", shown(value) + " is out of the 64-bit integer range");
    }
    *out = v < 0 ? static_cast<std::uint64_t>(static_cast<std::int64_t>(v))
                 : static_cast<std::uint64_t>(v);
  }
  return std::nullopt;
}

Check read_bool(const json& value, std::string_view param, bool* out) {
  if (!value.is_boolean()) return bad_field(param, wrong_type(value, "true or false"));
  *out = value.get<bool>();
  return std::nullopt;
}

// Fields kvvm does not implement: accepted only with the value that changes nothing.
Check refuse_unless_neutral(const std::string& key, const json& value) {
  const auto refuse = [&](std::string_view why) {
    return bad_field(key, shown(value) + " is not supported: " + std::string(why));
  };
  if (key == "n" || key == "best_of") {
    if (!value.is_number()) return bad_field(key, wrong_type(value, "an integer"));
    if (value != 1) return refuse("kvvm generates one choice per request; send 1 or omit it");
  } else if (key == "logprobs") {
    if (value != false) return refuse("kvvm returns no log probabilities; send false or omit it");
  } else if (key == "top_logprobs") {
    if (!value.is_number()) return bad_field(key, wrong_type(value, "an integer"));
    if (value != 0) return refuse("kvvm returns no log probabilities; send 0 or omit it");
  } else if (key == "echo") {
    if (value != false) return refuse("kvvm does not echo the prompt; send false or omit it");
  } else if (key == "suffix") {
    if (value != "") return refuse("kvvm does not insert text; omit it");
  } else if (key == "presence_penalty" || key == "frequency_penalty") {
    if (!value.is_number()) return bad_field(key, wrong_type(value, "a number"));
    if (value.get<double>() != 0) return refuse("kvvm applies no penalties; send 0 or omit it");
  } else if (key == "logit_bias") {
    if (!value.is_object()) return bad_field(key, wrong_type(value, "an object"));
    if (!value.empty()) return refuse("kvvm applies no logit bias; send {} or omit it");
  } else if (key == "tools" || key == "functions") {
    if (!value.is_array()) return bad_field(key, wrong_type(value, "an array"));
    if (!value.empty()) return refuse("kvvm does not call tools");
  } else if (key == "tool_choice" || key == "function_call") {
    if (value != "none") return refuse("kvvm does not call tools; send \"none\" or omit it");
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

Check read_stream_options(const json& value, bool* include_usage) {
  if (!value.is_object()) return bad_field("stream_options", wrong_type(value, "an object"));
  for (const auto& [key, item] : value.items()) {
    const std::string param = "stream_options." + key;
    if (key != "include_usage") return bad_field(param, "unknown field");
    if (item.is_null()) continue;
    if (Check error = read_bool(item, param, include_usage)) return error;
  }
  return std::nullopt;
}

// completions' prompt: one string (encoded as `kvvm generate --prompt` does) or token ids.
Check read_prompt(const json& value, const ParseContext& context, std::vector<std::int32_t>* ids) {
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (text.empty()) return bad_field("prompt", "is empty; send at least one character");
    *ids = context.tokenizer->encode(text, /*add_special_tokens=*/true);
    if (ids->empty()) return bad_field("prompt", "encodes to no tokens");
    return std::nullopt;
  }
  if (!value.is_array()) {
    return bad_field("prompt", wrong_type(value, "a string or an array of token ids"));
  }
  if (value.empty()) return bad_field("prompt", "is an empty array; send at least one token id");
  const std::int64_t last_id = static_cast<std::int64_t>(context.vocab_size) - 1;
  const std::string vocab = " (the vocabulary's ids)";
  for (std::size_t i = 0; i < value.size(); ++i) {
    const json& item = value[i];
    const std::string param = "prompt[" + std::to_string(i) + "]";
    if (item.is_string() || item.is_array()) {
      return bad_field(param, "a list of prompts is not supported; send one prompt per request");
    }
    std::int64_t id = 0;
    if (Check error = read_integer(item, param, 0, last_id, vocab, &id)) return error;
    ids->push_back(static_cast<std::int32_t>(id));
  }
  return std::nullopt;
}

// One message's content: a string, or text parts joined.
Check read_content(const json& value, const std::string& param, std::string* out) {
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
      return bad_field(part_param + ".type", shown(*type) + " is not supported; only \"text\"");
    }
    for (const auto& [key, item] : part.items()) {
      if (key != "type" && key != "text") return bad_field(part_param + "." + key, "unknown field");
    }
    const auto text = part.find("text");
    if (text == part.end()) return bad_field(part_param + ".text", "is required");
    if (!text->is_string()) return bad_field(part_param + ".text", wrong_type(*text, "a string"));
    *out += text->get_ref<const std::string&>();
  }
  return std::nullopt;
}

// chat's messages through the model's template, encoded as `kvvm generate --chat` does.
Check read_messages(const json& value, const ParseContext& context,
                    std::vector<std::int32_t>* ids) {
  if (!value.is_array()) return bad_field("messages", wrong_type(value, "an array"));
  if (value.empty()) return bad_field("messages", "is empty; send at least one message");
  std::vector<tokenizer::ChatMessage> messages;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const json& item = value[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!item.is_object()) return bad_field(param, wrong_type(item, "an object"));
    for (const auto& [key, field] : item.items()) {
      if (key != "role" && key != "content") return bad_field(param + "." + key, "unknown field");
    }
    tokenizer::ChatMessage message;
    if (!item.contains("role")) return bad_field(param + ".role", "is required");
    const json& role = item.at("role");
    if (role != "system" && role != "user" && role != "assistant") {
      return bad_field(param + ".role",
                       shown(role) + " is not a role kvvm takes: system, user or assistant");
    }
    message.role = role.get<std::string>();
    if (!item.contains("content")) return bad_field(param + ".content", "is required");
    if (Check error = read_content(item.at("content"), param + ".content", &message.content)) {
      return error;
    }
    messages.push_back(std::move(message));
  }
  if (!context.chat_template) {
    return bad_field("messages",
                     "this model has no chat template kvvm recognises; start the server with "
                     "--chat-template chatml|llama3, or use /v1/completions");
  }
  Result<std::string> text = tokenizer::render_chat(*context.chat_template, messages);
  if (!text.ok()) return bad_field("messages", text.status().message());
  // The template spells the special tokens out: adding them again would double the BOS.
  *ids = context.tokenizer->encode(*text, /*add_special_tokens=*/false);
  if (ids->empty()) return bad_field("messages", "encode to no tokens");
  return std::nullopt;
}

struct Fields {
  std::optional<std::int64_t> max_tokens;
  std::string max_tokens_param = "max_tokens";
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
      return bad_field(key, "unknown field");
    }
    if (value.is_null()) continue;  // null is the default, as OpenAI reads it
    if (key == prompt_field) {
      *prompt = &value;
    } else if (key == "model") {
      if (!value.is_string()) return bad_field(key, wrong_type(value, "a string"));
      request->model = value.get<std::string>();
    } else if (key == "max_tokens" || key == "max_completion_tokens") {
      std::int64_t max_tokens = 0;
      if (Check error =
              read_integer(value, key, 1, context.context_tokens, context_limit, &max_tokens)) {
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
      if (Check error = read_stream_options(value, &request->include_usage)) return error;
    } else if (key == "user") {
      if (!value.is_string()) return bad_field(key, wrong_type(value, "a string"));
      request->user = value.get<std::string>();
    } else if (Check error = refuse_unless_neutral(key, value)) {
      return error;
    }
  }
  return std::nullopt;
}

Check check_model(const json& body, const ParseContext& context) {
  const auto it = body.find("model");
  if (it == body.end() || it->is_null()) return bad_field("model", "is required");
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

std::variant<ApiRequest, ApiError> parse(Endpoint endpoint, std::string_view body,
                                         const ParseContext& context) {
  JsonLimits limits;
  limits.max_bytes = std::numeric_limits<std::size_t>::max();  // the HTTP layer bounds the body
  limits.max_depth = context.max_json_depth;
  Result<json> parsed = read_json(body, limits, "body");
  if (!parsed.ok()) {
    ApiError error;
    error.message = parsed.status().message();
    return error;
  }
  const json& root = *parsed;
  if (!root.is_object()) {
    ApiError error;
    error.message = "body: must be a JSON object, not " + type_name(root);
    return error;
  }
  if (Check error = check_model(root, context)) return *error;

  ApiRequest request;
  request.endpoint = endpoint;
  Fields fields;
  const json* prompt = nullptr;
  if (Check error = read_fields(endpoint, root, context, &request, &fields, &prompt)) {
    return *error;
  }
  const std::string prompt_field = endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (prompt == nullptr) return bad_field(prompt_field, "is required");
  std::vector<std::int32_t>& ids = request.engine.prompt;
  Check error = endpoint == Endpoint::kChat ? read_messages(*prompt, context, &ids)
                                            : read_prompt(*prompt, context, &ids);
  if (error) return *error;

  // At least one token must be left to generate.
  const std::uint64_t prompt_tokens = ids.size();
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
    // The engine's own check and words, so a client reads what Engine::submit would say.
    const Status checked = engine::check_request_limits(
        request.engine,
        engine::RequestLimits{.context = context_tokens, .vocab_size = context.vocab_size});
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
  } else {
    const std::uint64_t wanted = std::max<std::uint64_t>(context.default_max_tokens, 1);
    request.engine.max_tokens = static_cast<std::uint32_t>(std::min(wanted, room));
  }
  request.engine.use_model_eos = true;
  return request;
}

}  // namespace

std::variant<ApiRequest, ApiError> parse_request(Endpoint endpoint, std::string_view body,
                                                 const ParseContext& context) {
  if (context.tokenizer == nullptr) {
    ApiError error;
    error.status = 500;
    error.type = "server_error";
    error.message = "the server has no tokenizer";
    return error;
  }
  try {
    return parse(endpoint, body, context);
  } catch (const std::exception& e) {
    // Every access above is type-checked first; this only keeps a missed case a 400.
    ApiError error;
    error.message = std::string("body: ") + e.what();
    return error;
  }
}

}  // namespace kvvm::server
