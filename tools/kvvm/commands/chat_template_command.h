// `kvvm chat-template`: a chat rendered by a model's chat template, printed exactly as the
// server renders it before encoding (what POST /tokenize encodes for messages). For checking a
// checkpoint's template, or a --chat-template FILE, before serving it: no weights are loaded.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

struct ChatTemplateOptions {
  std::string model_dir;                      // --model DIR (required): its tokenizer_config.json
  std::string messages_file;                  // --messages FILE (required)
  std::optional<std::string> tools_file;      // --tools FILE
  std::optional<std::string> documents_file;  // --documents FILE
  std::string chat_template;                  // --chat-template NAME|FILE; empty: the model's own
  std::optional<std::string> kwargs;          // --kwargs JSON: chat_template_kwargs
  bool no_generation_prompt = false;
  bool continue_final_message = false;
};

// Adds the `chat-template` subcommand to `app`, bound to `options` (which must outlive the parse).
CLI::App* add_chat_template_command(CLI::App& app, ChatTemplateOptions& options);

// The rendered prompt to `out` (nothing added after it), errors to `err`: kExitUsage for a bad
// file, field or template, naming it.
int run_chat_template(const ChatTemplateOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
