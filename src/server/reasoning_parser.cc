#include "server/reasoning_parser.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace kvvm::server {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
std::size_t leading_blanks(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size() && is_blank(text[i])) ++i;
  return i;
}

// The longest end of `text` that is a proper prefix of `tag`.
std::size_t tag_prefix_at_end(std::string_view text, std::string_view tag) {
  for (std::size_t k = std::min(text.size(), tag.size() - 1); k > 0; --k) {
    if (text.substr(text.size() - k) == tag.substr(0, k)) return k;
  }
  return 0;
}

// Moves `text`'s incomplete last character into `held` (after putting the held one back).
void hold_partial(std::string& text, std::string& held, bool at_end) {
  text.insert(0, held);
  held.clear();
  if (at_end) return;
  const std::size_t whole = tokenizer::detail::utf8_complete_prefix(text);
  held = text.substr(whole);
  text.resize(whole);
}

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
  hold_partial(out.reasoning, partial_reasoning_, at_end);
  hold_partial(out.content, partial_content_, at_end);
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
