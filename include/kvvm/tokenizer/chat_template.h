// Chat templates built in for the families the runtime serves: ChatML (Qwen2), Qwen3's ChatML
// with thinking tags, and the Llama-3 header template. A checkpoint's own Jinja template is
// rendered by ChatRenderer (chat_renderer.h); these are its fallback for checkpoints that ship
// none, and what --chat-template chatml|llama3|qwen3 picks.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "kvvm/base/status.h"

namespace kvvm::tokenizer {

// kQwen3: Qwen3's template for system / user / assistant messages (no tools): ChatML turns; an
// assistant turn after the last user turn opens with a <think> block (empty unless its content
// carries one), earlier ones lose theirs.
enum class ChatTemplate : std::uint8_t { kChatML, kLlama3, kQwen3 };
std::string_view to_string(ChatTemplate kind);  // "chatml", "llama3", "qwen3"

// "chatml", "llama3" or "qwen3"; InvalidArgument naming the known names otherwise.
Result<ChatTemplate> parse_chat_template(std::string_view name);

// Recognises DIR/tokenizer_config.json's chat_template (Qwen3's by <|im_start|> with its
// enable_thinking switch and </think>, before plain ChatML's <|im_start|>). NotFound when the
// file or the field is absent, InvalidArgument when the template is none of the built-in ones;
// both messages say to pass --chat-template chatml|llama3|qwen3.
Result<ChatTemplate> detect_chat_template(const std::string& model_dir);

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // Qwen3's enable_thinking: false ends the generation prompt with an empty thinking block
  // ("<think>\n\n</think>\n\n"). Ignored by the other templates.
  bool enable_thinking = true;
};

// The prompt text, special tokens spelled out (encode it with special tokens parsed), ending
// with the assistant's header when `add_generation_prompt`. Llama-3's begins with
// <|begin_of_text|>. InvalidArgument for a role other than the three.
Result<std::string> render_chat(ChatTemplate kind, std::span<const ChatMessage> messages,
                                const ChatRenderOptions& options);
Result<std::string> render_chat(ChatTemplate kind, std::span<const ChatMessage> messages,
                                bool add_generation_prompt = true);

}  // namespace kvvm::tokenizer
