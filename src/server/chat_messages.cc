#include "chat_messages.h"

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace kvvm::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// One message's content as the template reads it: a string, or text parts joined with "\n".
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
    if (i > 0) *out += '\n';
    *out += text->get_ref<const std::string&>();
  }
  return std::nullopt;
}

Check read_string(const json& message, const char* key, const std::string& param, bool required) {
  const auto it = message.find(key);
  if (it == message.end() || it->is_null()) {
    if (required) return bad_field(param + "." + key, "is required");
    return std::nullopt;
  }
  if (!it->is_string()) return bad_field(param + "." + key, wrong_type(*it, "a string"));
  return std::nullopt;
}

// An assistant's tool_calls: [{id, type: "function", function: {name, arguments}}].
Check read_tool_calls(const json& calls, const std::string& param) {
  if (!calls.is_array()) return bad_field(param, wrong_type(calls, "an array"));
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const json& call = calls[i];
    const std::string at = param + "[" + std::to_string(i) + "]";
    if (!call.is_object()) return bad_field(at, wrong_type(call, "an object"));
    if (Check error = read_string(call, "id", at, true)) return error;
    const auto type = call.find("type");
    if (type != call.end() && *type != "function") {
      return bad_field(at + ".type", shown(*type) + " is not \"function\"");
    }
    const auto function = call.find("function");
    if (function == call.end()) return bad_field(at + ".function", "is required");
    if (!function->is_object())
      return bad_field(at + ".function", wrong_type(*function, "an object"));
    if (Check error = read_string(*function, "name", at + ".function", true)) return error;
    if (Check error = read_string(*function, "arguments", at + ".function", true)) return error;
  }
  return std::nullopt;
}

// One message checked; `out` is its ordered copy as the template gets it.
Check read_message(const json& item, const std::string& param, ordered_json* out,
                   std::vector<std::string>* ignored) {
  if (!item.is_object()) return bad_field(param, wrong_type(item, "an object"));
  if (!item.contains("role")) return bad_field(param + ".role", "is required");
  const json& role = item.at("role");
  const bool assistant = role == "assistant";
  const bool tool = role == "tool";
  if (role == "function") {
    return unsupported(param + ".role", "\"function\" (the deprecated functions); send tool");
  }
  if (role != "system" && role != "developer" && role != "user" && !assistant && !tool) {
    return bad_field(param + ".role", shown(role) +
                                          " is not a role kvvm takes: system, developer, user, "
                                          "assistant or tool");
  }
  for (const auto& [key, field] : item.items()) {
    const bool known =
        key == "role" || key == "content" || key == "name" ||
        (assistant && (key == "tool_calls" || key == "reasoning_content" || key == "refusal")) ||
        (tool && key == "tool_call_id");
    if (!known) ignored->push_back("messages." + key);
  }
  if (Check error = read_string(item, "name", param, false)) return error;
  const auto calls = item.find("tool_calls");
  const bool calling = assistant && calls != item.end() && !calls->is_null();
  if (calling) {
    if (Check error = read_tool_calls(*calls, param + ".tool_calls")) return error;
  }
  if (assistant) {
    if (Check error = read_string(item, "reasoning_content", param, false)) return error;
  }
  if (tool) {
    if (Check error = read_string(item, "tool_call_id", param, true)) return error;
  }
  // An assistant's content may be null or absent beside its calls (OpenAI's SDKs send null).
  const auto content = item.find("content");
  const bool no_content = content == item.end() || content->is_null();
  if (no_content && !calling) {
    return bad_field(param + ".content", content == item.end()
                                             ? std::string("is required")
                                             : wrong_type(*content, "a string or an array"));
  }
  if (!no_content) {
    std::string text;
    if (Check error = read_content(*content, param + ".content", &text, ignored)) return error;
    (*out)["content"] = std::move(text);
  } else {
    // As vLLM hands templates a message without content: an empty string (Qwen3's template,
    // for one, searches the content for </think> and fails on null).
    (*out)["content"] = "";
  }
  // OpenAI's newer name for the system prompt.
  if (role == "developer") (*out)["role"] = "system";
  if (calling) {
    // Arguments reach the template as the object their text spells (templates print them
    // with tojson), as vLLM passes them; text that is not an object stays text.
    for (ordered_json& call : (*out)["tool_calls"]) {
      ordered_json& arguments = call["function"]["arguments"];
      ordered_json parsed = ordered_json::parse(arguments.get<std::string>(), nullptr, false);
      if (parsed.is_object()) arguments = std::move(parsed);
    }
  }
  return std::nullopt;
}

// `key` of the body with its keys in the client's order; null when absent.
const ordered_json* ordered_member(const ordered_json& root, const char* key) {
  if (!root.is_object()) return nullptr;
  const auto it = root.find(key);
  return it == root.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

Check read_chat_prompt(const RequestBody& fields, std::string_view raw_body,
                       const ParseContext& context, ChatPrompt* out,
                       std::vector<std::string>* ignored) {
  const json& value = *fields.messages;
  if (!value.is_array()) return bad_field("messages", wrong_type(value, "an array"));
  if (value.empty()) return bad_field("messages", "is empty; send at least one message");
  // The body again, keys in the client's order (the reader's JSON sorts them): it was read
  // once already, so this parse succeeds.
  const ordered_json root = ordered_json::parse(raw_body, nullptr, /*allow_exceptions=*/false);
  const ordered_json* ordered = ordered_member(root, "messages");
  ordered_json messages =
      ordered != nullptr && ordered->is_array() && ordered->size() == value.size()
          ? *ordered
          : ordered_json::parse(value.dump());
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (Check error =
            read_message(value[i], "messages[" + std::to_string(i) + "]", &messages[i], ignored)) {
      return error;
    }
  }
  if (context.chat_renderer == nullptr) {
    return bad_field("messages",
                     "this model has no chat template; start the server with --chat-template "
                     "FILE (a Jinja chat template) or chatml|llama3|qwen3, or use "
                     "/v1/completions");
  }
  tokenizer::ChatInput input;
  input.messages_json = messages.dump();
  // A built-in template has no tool block: the tools are not shown, as a checkpoint's template
  // that ignores them would not show them.
  if (const ordered_json* tools = ordered_member(root, "tools");
      tools != nullptr && !tools->empty() && !context.chat_renderer->is_builtin()) {
    input.tools_json = tools->dump();
  }
  if (const ordered_json* documents = ordered_member(root, "documents")) {
    input.documents_json = documents->dump();
  }
  if (const ordered_json* kwargs = ordered_member(root, "chat_template_kwargs")) {
    input.kwargs_json = kwargs->dump();
  }
  input.continue_final_message = fields.continue_final_message;
  // The final message continued is not followed by the assistant's header.
  input.add_generation_prompt = fields.add_generation_prompt && !fields.continue_final_message;
  Result<std::string> text = context.chat_renderer->render(input);
  if (!text.ok()) return bad_field("messages", text.status().message());
  // The template spells the special tokens out: adding them again would double the BOS.
  out->ids = context.tokenizer->encode(*text, /*add_special_tokens=*/false);
  if (out->ids.empty()) return bad_field("messages", "encode to no tokens");
  out->text = std::move(text).value();
  return std::nullopt;
}

}  // namespace kvvm::server
