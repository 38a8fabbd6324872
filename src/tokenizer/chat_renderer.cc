// ChatRenderer: where a model's chat template comes from and how a chat becomes its prompt.
//
// Mirrors transformers (5.x) so that a prompt is the bytes apply_chat_template(tokenize=False)
// returns: the template lookup of from_pretrained (chat_template.jinja clobbers the config's
// chat_template) and get_chat_template (a list: "tool_use" when tools are given, else
// "default"); the variables of apply_chat_template and render_jinja_template (messages, tools
// and documents or None, add_generation_prompt, the special tokens, then the kwargs, which may
// override them); continue_final_message's tag appended to the final message and cut off
// after the render. The JSON texts of the input are spliced into the context as they are (no
// reparse, key order kept, as Python's dicts keep it), except for continue_final_message.
#include "kvvm/tokenizer/chat_renderer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

#include "base/json_reader.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/utf8.h"

namespace kvvm::tokenizer {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr std::string_view kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";
constexpr std::string_view kWhatToPass =
    "pass --chat-template FILE (a Jinja chat template) or a built-in one: chatml, llama3, qwen3";
// The special tokens transformers' special_tokens_map hands every template, when set.
constexpr std::array<std::string_view, 7> kSpecialTokens = {
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"};
// The variables the request sets itself: a kwarg of one of these names is refused (Python
// would raise "got multiple values for keyword argument").
constexpr std::array<std::string_view, 6> kRequestVariables = {
    "messages",     "tools", "documents", "add_generation_prompt", "continue_final_message",
    "chat_template"};

bool file_exists(const std::filesystem::path& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(path, error);
}

Result<std::string> read_text_file(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return detail::not_found("cannot open '" + path.string() + "'");
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return Status::InvalidArgument("cannot read '" + path.string() + "'");
  return std::move(text).str();
}

// Python's str.strip() / rstrip(): Unicode white space off the ends.
std::size_t python_space_at(std::string_view text, std::size_t at) {
  const std::size_t length = detail::utf8_length(text, at);
  if (length == 0 || !detail::is_python_space(detail::utf8_decode(text, at, length))) return 0;
  return length;
}
std::string_view rstrip_python(std::string_view text) {
  std::size_t end = text.size();
  while (end > 0) {
    std::size_t back = 1;
    while (back <= 4 && back <= end && detail::utf8_length(text, end - back) != back) ++back;
    if (back > 4 || back > end || python_space_at(text, end - back) == 0) break;
    end -= back;
  }
  return text.substr(0, end);
}
std::string_view strip_python(std::string_view text) {
  std::size_t begin = 0;
  while (begin < text.size()) {
    const std::size_t length = python_space_at(text, begin);
    if (length == 0) break;
    begin += length;
  }
  return rstrip_python(text.substr(begin));
}

std::string_view trim_ascii(std::string_view text) {
  const std::size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

// An optional ChatInput member is absent when empty or JSON null (Python's None).
bool json_given(std::string_view text) {
  const std::string_view trimmed = trim_ascii(text);
  return !trimmed.empty() && trimmed != "null";
}

// A ChatInput member: a JSON text of the kind it must be ('[' an array, '{' an object). Its
// brackets only: the template's render parses the context (a JSON error there names it), and
// a second parse here would cost a tenth of a render.
Status check_json_member(std::string_view text, char opening, std::string_view member) {
  const std::string_view trimmed = trim_ascii(text);
  const std::string_view kind = opening == '[' ? "array" : "object";
  const char closing = opening == '[' ? ']' : '}';
  if (trimmed.size() < 2 || trimmed.front() != opening || trimmed.back() != closing) {
    return Status::InvalidArgument("chat input " + std::string(member) + ": not a JSON " +
                                   std::string(kind));
  }
  return Status::Ok();
}

// bos_token and the others as tokenizer_config.json gives them: a string or an AddedToken
// ({"content": ...}); null or absent: not passed (the template sees it undefined).
Result<std::vector<std::pair<std::string, std::string>>> read_special_tokens(
    const nlohmann::json& config, const std::string& where) {
  std::vector<std::pair<std::string, std::string>> tokens;
  if (!config.is_object()) return tokens;
  for (std::string_view name : kSpecialTokens) {
    const nlohmann::json* value = detail::find_member(config, name);
    if (value == nullptr) continue;
    if (value->is_object()) value = detail::find_member(*value, "content");
    if (value == nullptr || !value->is_string()) {
      return Status::InvalidArgument(detail::member_path(where, name) +
                                     ": expected a string or {\"content\": string}");
    }
    tokens.emplace_back(std::string(name), value->get<std::string>());
  }
  return tokens;
}

// With no template shipped, the built-in whose tokens the tokenizer holds: Qwen3's ChatML has
// <think> as a token, Qwen2's has not.
std::optional<ChatTemplate> builtin_from_tokens(const std::filesystem::path& dir,
                                                std::string_view config_text) {
  std::string text(config_text);
  if (Result<std::string> json = read_text_file(dir / "tokenizer.json"); json.ok()) {
    text += *json;
  }
  const auto has = [&](std::string_view token) {
    return text.find("\"" + std::string(token) + "\"") != std::string::npos;
  };
  if (has("<|im_start|>")) return has("<think>") ? ChatTemplate::kQwen3 : ChatTemplate::kChatML;
  if (has("<|start_header_id|>")) return ChatTemplate::kLlama3;
  return std::nullopt;
}

// continue_final_message (transformers' render_jinja_template): the final message's content,
// or its last text part, gets the tag appended; `final_text` is the content before it.
Result<std::string> tag_final_message(std::string_view messages_json, std::string& final_text) {
  OrderedJson messages = OrderedJson::parse(messages_json, nullptr, /*allow_exceptions=*/false);
  if (!messages.is_array()) return Status::InvalidArgument("chat input messages: not an array");
  if (messages.empty() || !messages.back().is_object()) {
    return Status::InvalidArgument(
        "continue_final_message is set but there is no final message to continue");
  }
  OrderedJson& last = messages.back();
  const auto content = last.find("content");
  if (content == last.end() || content->is_null()) {
    return Status::InvalidArgument(
        "continue_final_message is set but the final message has no \"content\" to continue!");
  }
  if (content->is_string()) {
    final_text = content->get<std::string>();
    *content = final_text + std::string(kContinueTag);
    return messages.dump();
  }
  if (content->is_array()) {
    for (auto part = content->rbegin(); part != content->rend(); ++part) {
      if (!part->is_object() || !part->contains("text")) continue;
      OrderedJson& text = (*part)["text"];
      if (!text.is_string()) break;
      final_text = text.get<std::string>();
      text = final_text + std::string(kContinueTag);
      return messages.dump();
    }
    return Status::InvalidArgument(
        "continue_final_message is set but we could not find any text to continue in the final "
        "message!");
  }
  return Status::InvalidArgument(
      "continue_final_message is set but the final message's content is neither a string nor "
      "content parts");
}

// The rendered chat cut where the tag starts: the model continues the final message's text.
Result<std::string> cut_at_tag(std::string text, std::string_view final_text) {
  const std::string_view bare_tag = strip_python(kContinueTag);
  if (text.find(strip_python(final_text)) == std::string::npos ||
      text.find(bare_tag) == std::string::npos) {
    return Status::InvalidArgument(
        "continue_final_message is set but the final message does not appear in the chat after "
        "applying the chat template! This can happen if the chat template deletes portions of "
        "the final message.");
  }
  const std::size_t at = text.rfind(bare_tag);
  if (std::string_view(text).substr(at, kContinueTag.size()) == kContinueTag) {
    text.resize(at);
  } else {
    // The template trimmed the tag's space: white space before it was the message's, trimmed too.
    text.resize(rstrip_python(std::string_view(text).substr(0, at)).size());
  }
  return text;
}

// A built-in renders plain conversations: text content of system, user and assistant.
Result<std::vector<ChatMessage>> builtin_messages(const nlohmann::json& messages,
                                                  ChatTemplate kind) {
  const std::string refusal = "the built-in " + std::string(to_string(kind)) +
                              " template renders no tools; pass the checkpoint's template with "
                              "--chat-template FILE";
  std::vector<ChatMessage> out;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& item = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!item.is_object()) return Status::InvalidArgument(where + ": not an object");
    ChatMessage message;
    const nlohmann::json* role = detail::find_member(item, "role");
    if (role == nullptr || !role->is_string()) {
      return Status::InvalidArgument(where + ".role: a string is required");
    }
    message.role = role->get<std::string>();
    if (message.role == "tool" || message.role == "function" ||
        (item.contains("tool_calls") && !item["tool_calls"].is_null() &&
         !item["tool_calls"].empty())) {
      return Status::InvalidArgument(where + ": " + refusal);
    }
    if (const nlohmann::json* content = detail::find_member(item, "content")) {
      if (content->is_string()) {
        message.content = content->get<std::string>();
      } else if (content->is_array()) {
        for (const nlohmann::json& part : *content) {
          const nlohmann::json* text =
              part.is_object() ? detail::find_member(part, "text") : nullptr;
          if (text == nullptr || !text->is_string()) {
            return Status::InvalidArgument(where + ".content: the built-in " +
                                           std::string(to_string(kind)) +
                                           " template renders text parts only");
          }
          message.content += text->get_ref<const std::string&>();
        }
      } else {
        return Status::InvalidArgument(where + ".content: a string or text parts is required");
      }
    }
    out.push_back(std::move(message));
  }
  return out;
}

}  // namespace

// One Jinja template of the checkpoint, under the name a list gives it ("" for a single one).
struct NamedChatTemplate {
  std::string name;
  std::string origin;
  jinja::Template parsed;
  bool mentions_content = false;  // continue_final_message needs the template to read it
};

struct ChatRenderer::State {
  std::string origin;
  std::string source;
  std::optional<ChatTemplate> builtin;
  std::vector<NamedChatTemplate> templates;
  const NamedChatTemplate* default_template = nullptr;  // into templates; null: a list without one
  const NamedChatTemplate* tool_use = nullptr;
  // The special tokens set in tokenizer_config.json: {name, value}.
  std::vector<std::pair<std::string, std::string>> special_tokens;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
};

namespace {

Result<NamedChatTemplate> parse_named(std::string name, std::string origin, std::string source) {
  Result<jinja::Template> parsed = jinja::Template::parse(source, origin);
  if (!parsed.ok()) {
    return Status::InvalidArgument("chat template " + parsed.status().message());
  }
  NamedChatTemplate out{std::move(name), std::move(origin), std::move(parsed).value(),
                        source.find("content") != std::string::npos};
  return out;
}

Status add_additional_templates(const std::filesystem::path& dir,
                                std::vector<NamedChatTemplate>& templates) {
  const std::filesystem::path folder = dir / "additional_chat_templates";
  std::error_code error;
  if (!std::filesystem::is_directory(folder, error)) return Status::Ok();
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(folder, error)) {
    if (entry.path().extension() == ".jinja" && file_exists(entry.path())) {
      files.push_back(entry.path());
    }
  }
  if (files.empty()) return Status::Ok();
  std::sort(files.begin(), files.end());  // the names in a stable order
  if (templates.size() == 1 && templates.front().name.empty()) templates.front().name = "default";
  for (const std::filesystem::path& file : files) {
    KVVM_ASSIGN_OR_RETURN(std::string source, read_text_file(file));
    const std::string name = file.stem().string();
    KVVM_ASSIGN_OR_RETURN(NamedChatTemplate named,
                          parse_named(name, "additional_chat_templates/" + file.filename().string(),
                                      std::move(source)));
    std::erase_if(templates, [&](const NamedChatTemplate& t) { return t.name == name; });
    templates.push_back(std::move(named));
  }
  return Status::Ok();
}

}  // namespace

ChatRenderer::ChatRenderer(std::shared_ptr<const State> state) : state_(std::move(state)) {}
ChatRenderer::ChatRenderer(ChatRenderer&&) noexcept = default;
ChatRenderer& ChatRenderer::operator=(ChatRenderer&&) noexcept = default;
ChatRenderer::ChatRenderer(const ChatRenderer&) = default;
ChatRenderer& ChatRenderer::operator=(const ChatRenderer&) = default;
ChatRenderer::~ChatRenderer() = default;

ChatRenderer ChatRenderer::builtin(ChatTemplate kind) {
  auto state = std::make_shared<State>();
  state->builtin = kind;
  state->origin = "built-in " + std::string(to_string(kind));
  return ChatRenderer(std::move(state));
}

Result<ChatRenderer> ChatRenderer::load(const std::string& model_dir,
                                        std::string_view override_spec) {
  if (override_spec == "chatml" || override_spec == "llama3" || override_spec == "qwen3") {
    KVVM_ASSIGN_OR_RETURN(ChatTemplate kind, parse_chat_template(override_spec));
    return builtin(kind);
  }
  const std::filesystem::path dir(model_dir);
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  auto state = std::make_shared<State>();
  nlohmann::json config;
  std::string config_text;
  if (file_exists(config_path)) {
    KVVM_ASSIGN_OR_RETURN(config_text, read_text_file(config_path));
    KVVM_ASSIGN_OR_RETURN(config, read_json(config_text, {}, "'" + config_path.string() + "'"));
    KVVM_ASSIGN_OR_RETURN(state->special_tokens,
                          read_special_tokens(config, "'" + config_path.string() + "'"));
  }

  if (!override_spec.empty()) {
    const std::filesystem::path file{std::string(override_spec)};
    if (!file_exists(file)) {
      return detail::not_found("--chat-template '" + file.string() +
                               "': no such file, nor a built-in template (chatml, llama3, qwen3)");
    }
    KVVM_ASSIGN_OR_RETURN(std::string source, read_text_file(file));
    KVVM_ASSIGN_OR_RETURN(NamedChatTemplate named,
                          parse_named("", file.string(), std::move(source)));
    state->templates.push_back(std::move(named));
  } else if (const std::filesystem::path jinja_path = dir / "chat_template.jinja";
             file_exists(jinja_path)) {
    // transformers' from_pretrained: the file clobbers any template in the config.
    KVVM_ASSIGN_OR_RETURN(std::string source, read_text_file(jinja_path));
    KVVM_ASSIGN_OR_RETURN(NamedChatTemplate named,
                          parse_named("", "chat_template.jinja", std::move(source)));
    state->templates.push_back(std::move(named));
  } else if (const nlohmann::json* value =
                 config.is_object() ? detail::find_member(config, "chat_template") : nullptr) {
    const std::string where = "'" + config_path.string() + "' chat_template";
    if (value->is_string()) {
      KVVM_ASSIGN_OR_RETURN(NamedChatTemplate named,
                            parse_named("", "tokenizer_config.json", value->get<std::string>()));
      state->templates.push_back(std::move(named));
    } else if (value->is_array()) {
      for (std::size_t i = 0; i < value->size(); ++i) {
        const nlohmann::json& entry = (*value)[i];
        const nlohmann::json* name =
            entry.is_object() ? detail::find_member(entry, "name") : nullptr;
        const nlohmann::json* text =
            entry.is_object() ? detail::find_member(entry, "template") : nullptr;
        if (name == nullptr || !name->is_string() || text == nullptr || !text->is_string()) {
          return Status::InvalidArgument(detail::element_path(where, i) +
                                         ": expected {\"name\": string, \"template\": string}");
        }
        const std::string entry_name = name->get<std::string>();
        KVVM_ASSIGN_OR_RETURN(NamedChatTemplate named,
                              parse_named(entry_name, "tokenizer_config.json (" + entry_name + ")",
                                          text->get<std::string>()));
        state->templates.push_back(std::move(named));
      }
    } else {
      return Status::InvalidArgument(where +
                                     ": expected a string or a list of {name, template}, "
                                     "found " +
                                     detail::json_kind(*value));
    }
  }

  // transformers 5 saves named templates beside chat_template.jinja (then "default") as
  // additional_chat_templates/NAME.jinja; a file replaces a template of its name.
  if (override_spec.empty()) {
    KVVM_RETURN_IF_ERROR(add_additional_templates(dir, state->templates));
  }

  if (state->templates.empty()) {
    if (std::optional<ChatTemplate> kind = builtin_from_tokens(dir, config_text)) {
      return builtin(*kind);
    }
    return detail::not_found("no chat template in '" + config_path.string() + "' (nor in '" +
                             (dir / "chat_template.jinja").string() +
                             "'), and the tokenizer's tokens are none of a built-in template's; " +
                             std::string(kWhatToPass));
  }
  std::string names;
  for (const NamedChatTemplate& named : state->templates) {
    if (named.name.empty() || named.name == "default") state->default_template = &named;
    if (named.name == "tool_use") state->tool_use = &named;
    if (!named.name.empty()) names += (names.empty() ? "" : ", ") + named.name;
  }
  const NamedChatTemplate& shown =
      state->default_template != nullptr ? *state->default_template : state->templates.front();
  state->source = shown.parsed.source();
  // A list's origin: where its first template came from, with the names it holds.
  const std::string& first = state->templates.front().origin;
  state->origin =
      names.empty() ? shown.origin : first.substr(0, first.find(" (")) + " (" + names + ")";
  return ChatRenderer(std::move(state));
}

Result<std::string> ChatRenderer::render(const ChatInput& input,
                                         const jinja::RenderHooks& hooks) const {
  const State& state = *state_;
  if (input.continue_final_message && input.add_generation_prompt) {
    return Status::InvalidArgument(
        "continue_final_message and add_generation_prompt are not compatible. Use "
        "continue_final_message when you want the model to continue the final message, and "
        "add_generation_prompt when you want to add a header that will prompt it to start a new "
        "assistant message instead.");
  }
  KVVM_RETURN_IF_ERROR(check_json_member(input.messages_json, '[', "messages"));
  const bool has_tools = json_given(input.tools_json);
  if (has_tools) KVVM_RETURN_IF_ERROR(check_json_member(input.tools_json, '[', "tools"));
  const bool has_documents = json_given(input.documents_json);
  if (has_documents) {
    KVVM_RETURN_IF_ERROR(check_json_member(input.documents_json, '[', "documents"));
  }
  OrderedJson kwargs = OrderedJson::object();
  if (json_given(input.kwargs_json)) {
    KVVM_RETURN_IF_ERROR(check_json_member(input.kwargs_json, '{', "kwargs"));
    kwargs = OrderedJson::parse(input.kwargs_json, nullptr, /*allow_exceptions=*/false);
    if (!kwargs.is_object()) return Status::InvalidArgument("chat input kwargs: not a JSON object");
    for (std::string_view name : kRequestVariables) {
      if (kwargs.contains(name)) {
        return Status::InvalidArgument("chat_template_kwargs: '" + std::string(name) +
                                       "' is set by the request itself, not a template variable");
      }
    }
  }

  std::string tagged_messages;
  std::string final_text;
  if (input.continue_final_message) {
    KVVM_ASSIGN_OR_RETURN(tagged_messages, tag_final_message(input.messages_json, final_text));
  }
  const std::string_view messages_json =
      input.continue_final_message ? std::string_view(tagged_messages) : input.messages_json;

  if (state.builtin) {
    const nlohmann::json messages =
        nlohmann::json::parse(messages_json, nullptr, /*allow_exceptions=*/false);
    const nlohmann::json tools =
        has_tools ? nlohmann::json::parse(input.tools_json, nullptr, /*allow_exceptions=*/false)
                  : nlohmann::json::array();
    if (!messages.is_array() || !tools.is_array()) {
      return Status::InvalidArgument("chat input: messages and tools must be JSON arrays");
    }
    if (!tools.empty()) {
      return Status::InvalidArgument("tools: the built-in " +
                                     std::string(to_string(*state.builtin)) +
                                     " template renders no tools; pass the checkpoint's template "
                                     "with --chat-template FILE");
    }
    KVVM_ASSIGN_OR_RETURN(std::vector<ChatMessage> chat,
                          builtin_messages(messages, *state.builtin));
    ChatRenderOptions options{.add_generation_prompt = input.add_generation_prompt};
    // Qwen3's switch, as its template reads it: only a literal false turns thinking off.
    if (const auto thinking = kwargs.find("enable_thinking");
        thinking != kwargs.end() && thinking->is_boolean() && !thinking->get<bool>()) {
      options.enable_thinking = false;
    }
    KVVM_ASSIGN_OR_RETURN(std::string text, render_chat(*state.builtin, chat, options));
    if (input.continue_final_message) return cut_at_tag(std::move(text), final_text);
    return text;
  }

  // get_chat_template: a list's "tool_use" when tools are given, else its "default".
  const NamedChatTemplate* chosen =
      has_tools && state.tool_use != nullptr ? state.tool_use : state.default_template;
  if (chosen == nullptr) {
    return Status::InvalidArgument(
        "chat template " + state.origin +
        ": the model has several chat templates and none named 'default'; " +
        std::string(kWhatToPass));
  }
  if (input.continue_final_message && !chosen->mentions_content) {
    return Status::InvalidArgument(
        "continue_final_message is set to \"content\" but this is not an accepted field in the "
        "chat_template");
  }

  // The context as one JSON object: the request's texts as they are, then the special tokens
  // a kwarg does not override, then the kwargs.
  std::string context;
  context.reserve(messages_json.size() + input.tools_json.size() + input.documents_json.size() +
                  input.kwargs_json.size() + 256);
  context += "{\"messages\":";
  context += messages_json;
  context += ",\"tools\":";
  context += has_tools ? std::string_view(input.tools_json) : std::string_view("null");
  context += ",\"documents\":";
  context += has_documents ? std::string_view(input.documents_json) : std::string_view("null");
  context += ",\"add_generation_prompt\":";
  context += input.add_generation_prompt ? "true" : "false";
  for (const auto& [name, value] : state.special_tokens) {
    if (kwargs.contains(name)) continue;
    context += ",\"" + name + "\":" + nlohmann::json(value).dump();
  }
  const std::string_view kwargs_text = trim_ascii(input.kwargs_json);
  if (!kwargs.empty()) {
    // The object's members as the request wrote them: its braces off.
    context += ',';
    context += trim_ascii(kwargs_text.substr(1, kwargs_text.size() - 2));
  }
  context += '}';

  Result<std::string> text = chosen->parsed.render(context, hooks);
  if (!text.ok()) {
    if (text.status().code() != StatusCode::kInvalidArgument) return text.status();
    return Status::InvalidArgument("chat template " + text.status().message());
  }
  if (input.continue_final_message) return cut_at_tag(std::move(text).value(), final_text);
  return text;
}

const std::string& ChatRenderer::origin() const { return state_->origin; }
const std::string& ChatRenderer::source() const { return state_->source; }
bool ChatRenderer::is_builtin() const { return state_->builtin.has_value(); }

}  // namespace kvvm::tokenizer
