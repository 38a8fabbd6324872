#include "commands/chat_template_command.h"

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>

#include "base/json_reader.h"
#include "kit/cli_common.h"
#include "kvvm/tokenizer/chat_renderer.h"

namespace kvvm::cli {
namespace {

constexpr const char* kChatTemplate = "kvvm chat-template";

Result<std::string> read_file_text(const std::string& path, const std::string& flag) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    return Status::NotFound(flag + " '" + path + "': no such file");
  }
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  if (!file) return Status::InvalidArgument(flag + " '" + path + "': cannot read it");
  return std::move(text).str();
}

// A file's JSON, checked (errors give the file, line and column), as the text to pass on: the
// file's own when it is of the kind wanted, else `member` of the object it holds (a request
// body). Key order is kept either way: templates print objects in their order.
Result<std::string> json_argument(const std::string& text, const std::string& where,
                                  bool want_array, const char* member) {
  KVVM_RETURN_IF_ERROR(read_json(text, {}, where).status());
  const nlohmann::ordered_json value = nlohmann::ordered_json::parse(text);
  if (want_array && value.is_array()) return text;
  if (!want_array && value.is_object()) return text;
  if (member != nullptr && value.is_object() && value.contains(member)) {
    const nlohmann::ordered_json& inner = value.at(member);
    if (inner.is_array() == want_array && inner.is_object() != want_array) return inner.dump();
    return Status::InvalidArgument(where + ": '" + member + "' must be " +
                                   (want_array ? "an array" : "an object"));
  }
  return Status::InvalidArgument(
      where + ": must be " + std::string(want_array ? "a JSON array" : "a JSON object") +
      (member != nullptr ? std::string(" (or an object with '") + member + "')" : std::string()));
}

}  // namespace

CLI::App* add_chat_template_command(CLI::App& app, ChatTemplateOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "chat-template",
      "Print a chat as the model's chat template renders it: the prompt text the server "
      "encodes for /v1/chat/completions and /tokenize, special tokens spelled out, nothing "
      "added after it. No weights are loaded.");
  cmd->add_option("--model", options.model_dir,
                  "Model directory: its chat_template.jinja or tokenizer_config.json's "
                  "chat_template, and the special tokens (bos_token, eos_token) it passes")
      ->required();
  cmd->add_option("--messages", options.messages_file,
                  "JSON file: an array of messages ({role, content, tool_calls, ...}) or a chat "
                  "request body, whose messages, tools and chat_template_kwargs are taken")
      ->required();
  cmd->add_option("--tools", options.tools_file,
                  "JSON file: an array of tools ({type: function, function: {name, ...}}); "
                  "a list of named templates then renders its tool_use one");
  cmd->add_option("--documents", options.documents_file,
                  "JSON file: an array of documents, for templates that render them");
  cmd->add_option("--chat-template", options.chat_template,
                  "A Jinja template file, or a built-in one: chatml, llama3, qwen3 (default: the "
                  "model's own)");
  cmd->add_option("--kwargs", options.kwargs,
                  "A JSON object: template variables (chat_template_kwargs), e.g. "
                  "'{\"enable_thinking\": false}'");
  cmd->add_flag("--no-generation-prompt", options.no_generation_prompt,
                "End after the last message, without the assistant's header");
  cmd->add_flag("--continue-final-message", options.continue_final_message,
                "End inside the last message (an assistant's), for the model to continue it; "
                "implies --no-generation-prompt");
  return cmd;
}

int run_chat_template(const ChatTemplateOptions& options, std::ostream& out, std::ostream& err) {
  const auto fail = [&err](const Status& status) {
    err << kChatTemplate << ": " << status.to_string() << "\n";
    return exit_code(status);
  };
  tokenizer::ChatInput input;
  Result<std::string> messages = read_file_text(options.messages_file, "--messages");
  if (!messages.ok()) return fail(messages.status());
  const std::string messages_where = "--messages '" + options.messages_file + "'";
  Result<std::string> messages_json = json_argument(*messages, messages_where, true, "messages");
  if (!messages_json.ok()) return fail(messages_json.status());
  input.messages_json = std::move(messages_json).value();
  // A request body's tools and kwargs, unless the flags give them.
  if (const nlohmann::ordered_json body = nlohmann::ordered_json::parse(*messages);
      body.is_object()) {
    if (body.contains("tools") && !options.tools_file) input.tools_json = body["tools"].dump();
    if (body.contains("chat_template_kwargs") && !options.kwargs) {
      input.kwargs_json = body["chat_template_kwargs"].dump();
    }
  }
  if (options.tools_file) {
    Result<std::string> text = read_file_text(*options.tools_file, "--tools");
    if (!text.ok()) return fail(text.status());
    Result<std::string> tools =
        json_argument(*text, "--tools '" + *options.tools_file + "'", true, "tools");
    if (!tools.ok()) return fail(tools.status());
    input.tools_json = std::move(tools).value();
  }
  if (options.documents_file) {
    Result<std::string> text = read_file_text(*options.documents_file, "--documents");
    if (!text.ok()) return fail(text.status());
    Result<std::string> documents =
        json_argument(*text, "--documents '" + *options.documents_file + "'", true, "documents");
    if (!documents.ok()) return fail(documents.status());
    input.documents_json = std::move(documents).value();
  }
  if (options.kwargs) {
    Result<std::string> kwargs = json_argument(*options.kwargs, "--kwargs", false, nullptr);
    if (!kwargs.ok()) return fail(kwargs.status());
    input.kwargs_json = std::move(kwargs).value();
  }
  input.continue_final_message = options.continue_final_message;
  input.add_generation_prompt = !options.no_generation_prompt && !options.continue_final_message;

  std::error_code error;
  if (!std::filesystem::is_directory(options.model_dir, error)) {
    return fail(Status::NotFound("--model '" + options.model_dir + "': no such directory"));
  }
  Result<tokenizer::ChatRenderer> renderer =
      tokenizer::ChatRenderer::load(options.model_dir, options.chat_template);
  if (!renderer.ok()) return fail(renderer.status());
  Result<std::string> text = renderer->render(input);
  if (!text.ok()) return fail(text.status().with_context(renderer->origin()));
  out << *text;
  return kExitOk;
}

}  // namespace kvvm::cli
