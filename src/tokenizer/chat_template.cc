// The built-in chat templates and the recognition of a model's Jinja template by its markers.
#include "kvvm/tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "base/json_reader.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/utf8.h"

namespace kvvm::tokenizer {
namespace {

constexpr std::string_view kHowToPick = "pass --chat-template chatml|llama3";

// Jinja's `trim` is Python's str.strip(): white space off both ends.
std::string_view trim(std::string_view text) {
  std::size_t begin = 0;
  std::size_t end = text.size();
  while (begin < end) {
    const std::size_t length = detail::utf8_length(text, begin);
    if (length == 0 || !detail::is_python_space(detail::utf8_decode(text, begin, length))) break;
    begin += length;
  }
  while (end > begin) {
    std::size_t back = 1;
    while (back <= 4 && back <= end - begin && detail::utf8_length(text, end - back) != back)
      ++back;
    if (back > 4 || back > end - begin) break;
    if (!detail::is_python_space(detail::utf8_decode(text, end - back, back))) break;
    end -= back;
  }
  return text.substr(begin, end - begin);
}

// Recognises a Jinja template by the markers its family's special tokens leave in it.
Result<ChatTemplate> recognise(const std::string& text, const std::string& where) {
  if (text.find("<|im_start|>") != std::string::npos) return ChatTemplate::kChatML;
  if (text.find("<|start_header_id|>") != std::string::npos) return ChatTemplate::kLlama3;
  return Status::InvalidArgument(where +
                                 ": the chat template is none of the built-in ones "
                                 "(ChatML's <|im_start|>, Llama-3's <|start_header_id|>); " +
                                 std::string(kHowToPick));
}

// tokenizer_config.json's chat_template: a string, or a list of {name, template} of which the
// one named "default" is taken.
Result<std::string> template_text(const detail::Json& value, const std::string& where) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    for (const detail::Json& entry : value) {
      if (!entry.is_object()) continue;
      const detail::Json* name = detail::find_member(entry, "name");
      const detail::Json* text = detail::find_member(entry, "template");
      if (name != nullptr && name->is_string() && *name == "default" && text != nullptr &&
          text->is_string()) {
        return text->get<std::string>();
      }
    }
    return Status::InvalidArgument(where + ": no template named 'default' in the list; " +
                                   std::string(kHowToPick));
  }
  return Status::InvalidArgument(where +
                                 ": expected a string or a list of {name, template}, "
                                 "found " +
                                 detail::json_kind(value) + "; " + std::string(kHowToPick));
}

bool path_exists(const std::filesystem::path& path) {
  std::error_code error;
  return std::filesystem::exists(path, error);
}

}  // namespace

std::string_view to_string(ChatTemplate kind) {
  switch (kind) {
    case ChatTemplate::kChatML:
      return "chatml";
    case ChatTemplate::kLlama3:
      return "llama3";
  }
  return "unknown";
}

Result<ChatTemplate> parse_chat_template(std::string_view name) {
  if (name == "chatml") return ChatTemplate::kChatML;
  if (name == "llama3") return ChatTemplate::kLlama3;
  return Status::InvalidArgument("unknown chat template '" + std::string(name) +
                                 "' (known: chatml, llama3)");
}

Result<ChatTemplate> detect_chat_template(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const std::filesystem::path config = dir / "tokenizer_config.json";
  if (path_exists(config)) {
    Result<detail::Json> document = read_json_file(config.string());
    if (!document.ok()) return document.status();
    const std::string where = "'" + config.string() + "' chat_template";
    if (document->is_object()) {
      if (const detail::Json* value = detail::find_member(*document, "chat_template")) {
        Result<std::string> text = template_text(*value, where);
        if (!text.ok()) return text.status();
        return recognise(*text, where);
      }
    }
  }
  // Newer transformers save the template beside the config, in chat_template.jinja.
  const std::filesystem::path jinja = dir / "chat_template.jinja";
  if (path_exists(jinja)) {
    std::ifstream file(jinja, std::ios::binary);
    std::ostringstream text;
    text << file.rdbuf();
    if (!file) {
      return Status::InvalidArgument("cannot read '" + jinja.string() + "'; " +
                                     std::string(kHowToPick));
    }
    return recognise(text.str(), "'" + jinja.string() + "'");
  }
  return detail::not_found("no chat template in '" + config.string() + "' (nor in '" +
                           jinja.string() + "'); " + std::string(kHowToPick));
}

Result<std::string> render_chat(ChatTemplate kind, std::span<const ChatMessage> messages,
                                bool add_generation_prompt) {
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return Status::InvalidArgument("messages[" + std::to_string(i) + "].role: '" + role +
                                     "' is not one of system, user, assistant");
    }
  }
  std::string out;
  if (kind == ChatTemplate::kChatML) {
    for (const ChatMessage& message : messages) {
      out += "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n";
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }
  out = "<|begin_of_text|>";
  for (const ChatMessage& message : messages) {
    out += "<|start_header_id|>" + message.role + "<|end_header_id|>\n\n";
    out += trim(message.content);
    out += "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace kvvm::tokenizer
