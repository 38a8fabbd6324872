// The built-in chat templates and the recognition of a model's Jinja template by its markers.
//
// Qwen3's template is rendered as its Jinja text renders system / user / assistant messages
// without tools: Python's str methods (split, lstrip('\n'), ...) spelled out below, so an
// assistant turn with a <think> block renders as transformers' apply_chat_template renders it.
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

constexpr std::string_view kHowToPick = "pass --chat-template chatml|llama3|qwen3";

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

// Recognises a Jinja template by the markers its family's special tokens leave in it. Qwen3's
// is ChatML that handles thinking blocks and can switch thinking off; without that switch a
// ChatML template is plain ChatML.
Result<ChatTemplate> recognise(const std::string& text, const std::string& where) {
  const auto has = [&](std::string_view marker) { return text.find(marker) != std::string::npos; };
  if (has("<|im_start|>") && has("</think>") && has("enable_thinking")) {
    return ChatTemplate::kQwen3;
  }
  if (has("<|im_start|>")) return ChatTemplate::kChatML;
  if (has("<|start_header_id|>")) return ChatTemplate::kLlama3;
  return Status::InvalidArgument(where +
                                 ": the chat template is none of the built-in ones "
                                 "(Qwen3's <|im_start|> with enable_thinking, ChatML's "
                                 "<|im_start|>, Llama-3's <|start_header_id|>); " +
                                 std::string(kHowToPick));
}

// Python's str.lstrip('\n') / rstrip('\n') / strip('\n').
std::string_view lstrip_newlines(std::string_view text) {
  const std::size_t begin = text.find_first_not_of('\n');
  return begin == std::string_view::npos ? std::string_view() : text.substr(begin);
}
std::string_view rstrip_newlines(std::string_view text) {
  const std::size_t last = text.find_last_not_of('\n');
  return last == std::string_view::npos ? std::string_view() : text.substr(0, last + 1);
}
std::string_view strip_newlines(std::string_view text) {
  return rstrip_newlines(lstrip_newlines(text));
}

// Python's text.split(separator)[-1]: what follows the last separator (all of it without one).
std::string_view after_last(std::string_view text, std::string_view separator) {
  const std::size_t at = text.rfind(separator);
  return at == std::string_view::npos ? text : text.substr(at + separator.size());
}

// Qwen3's index of the last user turn that is a query (not a tool response wrapped in
// <tool_response> tags); the last message's index when there is none.
std::size_t qwen3_last_query(std::span<const ChatMessage> messages) {
  for (std::size_t i = messages.size(); i-- > 0;) {
    const std::string_view content = messages[i].content;
    const bool tool_response =
        content.starts_with("<tool_response>") && content.ends_with("</tool_response>");
    if (messages[i].role == "user" && !tool_response) return i;
  }
  return messages.empty() ? 0 : messages.size() - 1;
}

// One assistant turn of Qwen3's template: a <think> block in the content is split off; turns
// after the last query keep it (the last turn always shows one, empty if need be), earlier
// turns show the answer alone.
void qwen3_assistant(std::string_view content, bool after_query, bool last, std::string& out) {
  std::string_view reasoning;
  if (content.find("</think>") != std::string_view::npos) {
    const std::string_view before = content.substr(0, content.find("</think>"));
    reasoning = lstrip_newlines(after_last(rstrip_newlines(before), "<think>"));
    content = lstrip_newlines(after_last(content, "</think>"));
  }
  out += "<|im_start|>assistant\n";
  if (after_query && (last || !reasoning.empty())) {
    out += "<think>\n";
    out += strip_newlines(reasoning);
    out += "\n</think>\n\n";
    out += lstrip_newlines(content);
  } else {
    out += content;
  }
  out += "<|im_end|>\n";
}

std::string render_qwen3(std::span<const ChatMessage> messages, const ChatRenderOptions& options) {
  const std::size_t last_query = qwen3_last_query(messages);
  std::string out;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "assistant") {
      qwen3_assistant(message.content, i > last_query, i + 1 == messages.size(), out);
    } else {
      out += "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!options.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
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
    case ChatTemplate::kQwen3:
      return "qwen3";
  }
  return "unknown";
}

Result<ChatTemplate> parse_chat_template(std::string_view name) {
  if (name == "chatml") return ChatTemplate::kChatML;
  if (name == "llama3") return ChatTemplate::kLlama3;
  if (name == "qwen3") return ChatTemplate::kQwen3;
  return Status::InvalidArgument("unknown chat template '" + std::string(name) +
                                 "' (known: chatml, llama3, qwen3)");
}

Result<ChatTemplate> detect_chat_template(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const std::filesystem::path config = dir / "tokenizer_config.json";
  if (path_exists(config)) {
    KVVM_ASSIGN_OR_RETURN(detail::Json document, read_json_file(config.string()));
    const std::string where = "'" + config.string() + "' chat_template";
    if (document.is_object()) {
      if (const detail::Json* value = detail::find_member(document, "chat_template")) {
        KVVM_ASSIGN_OR_RETURN(std::string text, template_text(*value, where));
        return recognise(text, where);
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
  return render_chat(kind, messages,
                     ChatRenderOptions{.add_generation_prompt = add_generation_prompt});
}

Result<std::string> render_chat(ChatTemplate kind, std::span<const ChatMessage> messages,
                                const ChatRenderOptions& options) {
  const bool add_generation_prompt = options.add_generation_prompt;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return Status::InvalidArgument("messages[" + std::to_string(i) + "].role: '" + role +
                                     "' is not one of system, user, assistant");
    }
  }
  if (kind == ChatTemplate::kQwen3) return render_qwen3(messages, options);
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
