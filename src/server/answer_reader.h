// An assistant's text read into what a chat answer carries: the reasoning (a thinking
// template's <think> block, as reasoning_content), the content, and the tool calls in the
// family's format (tool_call_parser.h) — whole for a completion body, piece by piece for a
// stream, the pieces of a whole answer adding up to its whole reading.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "reasoning_parser.h"
#include "tool_call_parser.h"

namespace kvvm::server {

// What a chat request's answer is read for; nothing: its text is the content.
struct AnswerParsing {
  std::optional<ToolCallFormat> tool_calls;  // the request offered tools it may call
  ReasoningFormat reasoning = ReasoningFormat::kNone;
  // With reasoning: whether the answer starts thinking (false: the prompt closed an empty
  // think block, Qwen3's enable_thinking false).
  bool thinking = true;
  bool any() const { return tool_calls.has_value() || reasoning != ReasoningFormat::kNone; }
};

struct AssistantMessage {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> calls;
};
AssistantMessage read_answer(const AnswerParsing& parsing, std::string_view text,
                             const ToolCallIds& ids);

struct AssistantDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
  // `later`'s pieces after this one's.
  void append(AssistantDelta later) {
    reasoning += later.reasoning;
    content += later.content;
    for (ToolCallDelta& call : later.calls) calls.push_back(std::move(call));
  }
};

class AnswerStream {
 public:
  AnswerStream(const AnswerParsing& parsing, ToolCallIds ids);
  AssistantDelta push(std::string_view text);
  AssistantDelta finish();
  // Whether a call was opened so far (finish_reason "tool_calls").
  bool called() const { return called_; }

 private:
  AssistantDelta route(ReasoningSplit split, bool last);
  std::optional<ReasoningStream> reasoning_;
  std::optional<ToolCallStream> calls_;
  bool called_ = false;
};

}  // namespace kvvm::server
