// A chat request's prompt: its messages, with the tools, documents and template variables the
// body sends beside them, rendered by the model's chat template (tokenizer::ChatRenderer) and
// encoded as `kvvm generate --chat` encodes (the template spells the special tokens out).
//
// Messages as OpenAI's API takes them: system, developer (rendered as system), user,
// assistant (content null or absent beside tool_calls [{id, type: function, function {name,
// arguments}}], reasoning_content) and tool (tool_call_id, content) — each checked and a 400
// naming the field otherwise. Content parts of text are joined with "\n" into one string, and
// an absent or null content is "", as vLLM gives templates content; other parts are refused
// by type. What
// reaches the template keeps the client's key order (tools printed with tojson read as the
// client wrote them), and an assistant call's arguments, sent as JSON text, reach it as the
// object they spell, as vLLM and transformers give them to templates.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "field_values.h"
#include "openai_request.h"
#include "request_fields.h"

namespace kvvm::server {

struct ChatPrompt {
  std::vector<std::int32_t> ids;
  std::string text;  // the rendered template
};

// Reads fields.messages (with fields.tools, documents, chat_template_kwargs,
// add_generation_prompt and continue_final_message) from the body `raw_body` was.
Check read_chat_prompt(const RequestBody& fields, std::string_view raw_body,
                       const ParseContext& context, ChatPrompt* out,
                       std::vector<std::string>* ignored);

}  // namespace kvvm::server
