// ChatRenderer: a model's chat as its prompt text. The checkpoint's own Jinja template when it
// ships one (tokenizer_config.json's chat_template, a string or a list of named templates, or
// chat_template.jinja beside it), rendered as transformers' apply_chat_template renders it; a
// template file the operator names (--chat-template FILE); else the built-in template its
// special tokens identify (chat_template.h), the fallback for checkpoints with none.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "kvvm/base/status.h"
#include "kvvm/jinja/template.h"
#include "kvvm/tokenizer/chat_template.h"

namespace kvvm::tokenizer {

// What a template renders, as the OpenAI API and transformers take it. JSON texts, so that
// callers pass what a request body held without another data model.
struct ChatInput {
  // A JSON array of messages: {role, content (a string, null, or content parts), name,
  // tool_calls [{id, type, function {name, arguments}}], tool_call_id, reasoning_content}.
  std::string messages_json;
  std::string tools_json;      // "" or a JSON array of {type: "function", function: {...}}
  std::string documents_json;  // "" or a JSON array of documents (RAG templates)
  // "" or a JSON object: chat_template_kwargs, each member a variable of the template
  // (enable_thinking, ...). As transformers: a member overrides a special token of its name
  // (bos_token, ...); one named messages, tools, documents, add_generation_prompt,
  // continue_final_message or chat_template is refused (the request sets those).
  std::string kwargs_json;
  bool add_generation_prompt = true;
  // The last message (an assistant's) left open for the model to continue: the text ends where
  // its content ends (transformers' continue_final_message); excludes add_generation_prompt.
  bool continue_final_message = false;
};

class ChatRenderer {
 public:
  // The model's renderer: `override_spec` empty: DIR's own template, else the built-in its
  // tokens identify; "chatml" / "llama3" / "qwen3": that built-in; anything else: a file path
  // holding a Jinja template. NotFound when DIR has no template and no built-in fits (the
  // message says what to pass); InvalidArgument naming the file and line for a template that
  // does not parse.
  static Result<ChatRenderer> load(const std::string& model_dir, std::string_view override_spec);
  static ChatRenderer builtin(ChatTemplate kind);

  // The prompt text, special tokens spelled out (encode it with special tokens parsed and none
  // added). InvalidArgument naming the template's line for a template error (a
  // raise_exception() call's message kept) and for input a built-in cannot render (tools with
  // a built-in that has no tool block). `hooks`: strftime_now's clock (tests fix it).
  Result<std::string> render(const ChatInput& input, const jinja::RenderHooks& hooks = {}) const;

  // Where the template came from, for logs, `kvvm info` and errors: "tokenizer_config.json",
  // "tokenizer_config.json (default, tool_use)" (a list: the names it renders),
  // "chat_template.jinja", "FILE", "built-in chatml".
  const std::string& origin() const;
  // The Jinja text (the default one of a list); empty for a built-in.
  const std::string& source() const;
  bool is_builtin() const;

  ChatRenderer(ChatRenderer&&) noexcept;
  ChatRenderer& operator=(ChatRenderer&&) noexcept;
  ChatRenderer(const ChatRenderer&);
  ChatRenderer& operator=(const ChatRenderer&);
  ~ChatRenderer();

 private:
  struct State;
  explicit ChatRenderer(std::shared_ptr<const State> state);
  std::shared_ptr<const State> state_;  // immutable: shared by the server's threads
};

}  // namespace kvvm::tokenizer
