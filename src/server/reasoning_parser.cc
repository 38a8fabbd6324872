#include "server/reasoning_parser.h"

#include "server/streamed_text.h"

namespace kvvm::server {
namespace {

using detail::is_blank;
using detail::leading_blanks;
using detail::tag_prefix_at_end;

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

}  // namespace

std::string_view to_string(ReasoningFormat format) {
  return format == ReasoningFormat::kThinkTags ? "think_tags" : "none";
}

Result<ReasoningFormat> parse_reasoning_format(std::string_view name) {
  if (name == "qwen3" || name == "deepseek_r1") return ReasoningFormat::kThinkTags;
  if (name == "none") return ReasoningFormat::kNone;
  return Status::InvalidArgument("unknown reasoning parser \"" + std::string(name) +
                                 "\"; known: qwen3, deepseek_r1, none");
}

ReasoningFormat detect_reasoning_format(std::string_view source) {
  return source.find(kOpen) != std::string_view::npos &&
                 source.find(kClose) != std::string_view::npos
             ? ReasoningFormat::kThinkTags
             : ReasoningFormat::kNone;
}

bool prompt_closes_reasoning(std::string_view prompt) {
  std::size_t end = prompt.size();
  while (end > 0 && is_blank(prompt[end - 1])) --end;
  return prompt.substr(0, end).ends_with(kClose);
}

ReasoningSplit split_reasoning(ReasoningFormat format, std::string_view text, bool thinking) {
  // The stream over the whole text: one reading for both.
  ReasoningStream stream(format, thinking);
  ReasoningSplit out = stream.push(text);
  ReasoningSplit last = stream.finish();
  out.reasoning += last.reasoning;
  out.content += last.content;
  return out;
}

ReasoningStream::ReasoningStream(ReasoningFormat format, bool thinking)
    : thinking_(thinking),
      state_(format == ReasoningFormat::kThinkTags ? State::kStart : State::kContent) {}

ReasoningSplit ReasoningStream::push(std::string_view text) {
  ReasoningSplit out;
  text_ += text;
  run(/*at_end=*/false, out);
  release_utf8(out, /*at_end=*/false);
  return out;
}

ReasoningSplit ReasoningStream::finish() {
  ReasoningSplit out;
  run(/*at_end=*/true, out);
  release_utf8(out, /*at_end=*/true);
  return out;
}

void ReasoningStream::release_utf8(ReasoningSplit& out, bool at_end) {
  detail::hold_partial_utf8(out.reasoning, partial_reasoning_, at_end);
  detail::hold_partial_utf8(out.content, partial_content_, at_end);
}

void ReasoningStream::run(bool at_end, ReasoningSplit& out) {
  for (;;) {
    const std::string_view rest = std::string_view(text_).substr(pos_);
    switch (state_) {
      case State::kStart: {
        const std::string_view next = rest.substr(leading_blanks(rest));
        if (next.starts_with(kOpen)) {
          pos_ = text_.size() - next.size() + kOpen.size();
          state_ = State::kReasoning;
          break;
        }
        if (!at_end && kOpen.starts_with(next)) return;  // blanks, or a start of <think>
        state_ = thinking_ ? State::kReasoning : State::kContent;
        break;
      }
      case State::kReasoning: {
        const std::size_t at = rest.find(kClose);
        if (at == std::string_view::npos) {
          const std::size_t held = at_end ? 0 : tag_prefix_at_end(rest, kClose);
          out.reasoning += rest.substr(0, rest.size() - held);
          pos_ += rest.size() - held;
          return;
        }
        out.reasoning += rest.substr(0, at);
        pos_ += at + kClose.size();
        state_ = State::kAfterEnd;
        break;
      }
      case State::kAfterEnd: {
        const std::size_t blanks = leading_blanks(rest);
        pos_ += blanks;
        if (blanks == rest.size()) return;
        state_ = State::kContent;
        break;
      }
      case State::kContent:
        out.content += rest;
        pos_ = text_.size();
        return;
    }
  }
}

}  // namespace kvvm::server
