#include "answer_reader.h"

#include <utility>

namespace kvvm::server {

AssistantMessage read_answer(const AnswerParsing& parsing, std::string_view text,
                             const ToolCallIds& ids) {
  AssistantMessage message;
  std::string content(text);
  if (parsing.reasoning != ReasoningFormat::kNone) {
    ReasoningSplit split = split_reasoning(parsing.reasoning, text, parsing.thinking);
    message.reasoning = std::move(split.reasoning);
    content = std::move(split.content);
  }
  if (parsing.tool_calls) {
    ParsedAnswer parsed = parse_tool_calls(*parsing.tool_calls, content, ids);
    message.content = std::move(parsed.content);
    message.calls = std::move(parsed.calls);
  } else {
    message.content = std::move(content);
  }
  return message;
}

AnswerStream::AnswerStream(const AnswerParsing& parsing, ToolCallIds ids) {
  if (parsing.reasoning != ReasoningFormat::kNone) {
    reasoning_.emplace(parsing.reasoning, parsing.thinking);
  }
  if (parsing.tool_calls) calls_.emplace(*parsing.tool_calls, std::move(ids));
}

AssistantDelta AnswerStream::route(ReasoningSplit split, bool last) {
  AssistantDelta out;
  out.reasoning = std::move(split.reasoning);
  if (!calls_) {
    out.content = std::move(split.content);
    return out;
  }
  AnswerDelta parsed = calls_->push(split.content);
  if (last) {
    AnswerDelta rest = calls_->finish();
    parsed.content += rest.content;
    for (ToolCallDelta& call : rest.calls) parsed.calls.push_back(std::move(call));
  }
  out.content = std::move(parsed.content);
  out.calls = std::move(parsed.calls);
  if (!out.calls.empty()) called_ = true;
  return out;
}

AssistantDelta AnswerStream::push(std::string_view text) {
  ReasoningSplit split;
  if (reasoning_) {
    split = reasoning_->push(text);
  } else {
    split.content = std::string(text);
  }
  return route(std::move(split), false);
}

AssistantDelta AnswerStream::finish() {
  ReasoningSplit split;
  if (reasoning_) split = reasoning_->finish();
  return route(std::move(split), true);
}

}  // namespace kvvm::server
