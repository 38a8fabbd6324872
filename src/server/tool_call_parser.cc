#include "server/tool_call_parser.h"

#include <algorithm>
#include <random>
#include <utility>

#include "server/streamed_text.h"
#include "server/tool_call_json.h"

namespace kvvm::server {
namespace {

using detail::all_blank;
using detail::leading_blanks;
using detail::tag_prefix_at_end;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralTag = "[TOOL_CALLS]";

std::string random_alphanumerics(std::size_t count) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 engine{std::random_device{}()};
  std::uniform_int_distribution<std::size_t> pick(0, kAlphabet.size() - 1);
  std::string out(count, ' ');
  for (char& c : out) c = kAlphabet[pick(engine)];
  return out;
}

}  // namespace

std::string_view to_string(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
  }
  return "unknown";
}

Result<ToolCallFormat> parse_tool_call_format(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json" || name == "llama4_json") return ToolCallFormat::kLlama3Json;
  if (name == "mistral") return ToolCallFormat::kMistral;
  return Status::InvalidArgument("unknown tool call parser \"" + std::string(name) +
                                 "\"; known: hermes, llama3_json, llama4_json, mistral");
}

std::optional<ToolCallFormat> detect_tool_call_format(std::string_view source) {
  const auto has = [source](std::string_view s) { return source.find(s) != std::string::npos; };
  if (has(kHermesOpen)) return ToolCallFormat::kHermes;
  if (has(kMistralTag)) return ToolCallFormat::kMistral;
  if (has(kPythonTag) || (has("<|start_header_id|>") && has("\"parameters\""))) {
    return ToolCallFormat::kLlama3Json;
  }
  return std::nullopt;
}

ToolCallIds random_tool_call_ids() {
  return [] { return "call_" + random_alphanumerics(24); };
}

ToolCallIds random_tool_call_ids(ToolCallFormat format) {
  if (format == ToolCallFormat::kMistral) return [] { return random_alphanumerics(9); };
  return random_tool_call_ids();
}

ToolCallSyntax syntax_of(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return {.open = "<tool_call>\n",
              .close = "\n</tool_call>",
              .between = "\n</tool_call>\n<tool_call>\n",
              .arguments_key = "arguments",
              .trigger = "<tool_call>\n"};
    case ToolCallFormat::kLlama3Json:
      return {
          .open = "", .close = "", .between = "; ", .arguments_key = "parameters", .trigger = ""};
    case ToolCallFormat::kMistral:
      return {.open = "[TOOL_CALLS][",
              .close = "]",
              .between = ", ",
              .arguments_key = "arguments",
              .trigger = "[TOOL_CALLS]["};
  }
  return {};
}

grammar::ToolCallsSpec tool_calls_spec(ToolCallFormat format, std::vector<ToolSpec> tools,
                                       bool parallel, bool after_open) {
  const ToolCallSyntax syntax = syntax_of(format);
  grammar::ToolCallsSpec spec;
  spec.tools = std::move(tools);
  spec.open = syntax.open;
  spec.close = syntax.close;
  spec.between = syntax.between;
  spec.arguments_key = syntax.arguments_key;
  spec.min_calls = 1;
  spec.max_calls = parallel ? 0 : 1;
  spec.after_open = after_open;
  // One blank at most where JSON allows blanks: room for the template's own spacing
  // ({"name": "f", "arguments": {...}}), none for a model to spend max_tokens on blanks.
  spec.whitespace = grammar::JsonWhitespace{.flexible = true, .max_run = 1};
  return spec;
}

ParsedAnswer parse_tool_calls(ToolCallFormat format, std::string_view text,
                              const ToolCallIds& ids) {
  // The stream over the whole text: one reading, so a streamed answer is the same answer.
  ToolCallStream stream(format, ids);
  ParsedAnswer answer;
  for (AnswerDelta delta : {stream.push(text), stream.finish()}) {
    answer.content += delta.content;
    for (ToolCallDelta& call : delta.calls) {
      if (call.index == answer.calls.size()) {
        answer.calls.push_back({std::move(call.id), std::move(call.name), {}});
      }
      answer.calls[call.index].arguments += call.arguments;
    }
  }
  return answer;
}

ToolCallStream::ToolCallStream(ToolCallFormat format, ToolCallIds ids)
    : format_(format),
      ids_(std::move(ids)),
      state_(format == ToolCallFormat::kLlama3Json ? State::kStart : State::kText) {}

AnswerDelta ToolCallStream::push(std::string_view text) {
  AnswerDelta out;
  text_ += text;
  run(/*at_end=*/false, out);
  release_utf8(out, /*at_end=*/false);
  return out;
}

AnswerDelta ToolCallStream::finish() {
  AnswerDelta out;
  run(/*at_end=*/true, out);
  // Whitespace alone next to calls is dropped; an answer of nothing else is its content.
  if (!segment_has_text_ && calls_ == 0) out.content += blank_;
  blank_.clear();
  release_utf8(out, /*at_end=*/true);
  return out;
}

void ToolCallStream::release_utf8(AnswerDelta& out, bool at_end) {
  detail::hold_partial_utf8(out.content, partial_utf8_, at_end);
}

void ToolCallStream::emit_content(std::string_view text, AnswerDelta& out) {
  if (text.empty()) return;
  if (!segment_has_text_) {
    if (all_blank(text)) {
      blank_ += text;
      return;
    }
    out.content += blank_;
    blank_.clear();
    segment_has_text_ = true;
  }
  out.content += text;
}

void ToolCallStream::emit_call(std::string name, std::string arguments, AnswerDelta& out) {
  if (!segment_has_text_) blank_.clear();
  segment_has_text_ = false;
  out.calls.push_back({.index = calls_++,
                       .id = ids_ ? ids_() : std::string(),
                       .name = std::move(name),
                       .arguments = std::move(arguments)});
}

void ToolCallStream::give_up(std::size_t to, State next, AnswerDelta& out) {
  emit_content(std::string_view(text_).substr(region_, to - region_), out);
  pos_ = to;
  state_ = next;
}

void ToolCallStream::run(bool at_end, AnswerDelta& out) {
  // Where a region that is not a call after all goes on: Llama's answer is then text; the
  // tagged families watch for their tag again.
  const State failed = format_ == ToolCallFormat::kLlama3Json ? State::kPlain : State::kText;
  for (;;) {
    const std::string_view rest = std::string_view(text_).substr(pos_);
    switch (state_) {
      case State::kText: {
        const std::string_view tag = format_ == ToolCallFormat::kHermes ? kHermesOpen : kMistralTag;
        const std::size_t at = rest.find(tag);
        if (at == std::string_view::npos) {
          const std::size_t held = at_end ? 0 : tag_prefix_at_end(rest, tag);
          emit_content(rest.substr(0, rest.size() - held), out);
          pos_ += rest.size() - held;
          return;
        }
        emit_content(rest.substr(0, at), out);
        region_ = pos_ + at;
        pos_ = region_ + tag.size();
        body_ = search_ = pos_;
        state_ = format_ == ToolCallFormat::kHermes ? State::kBlock : State::kArrayOpen;
        break;
      }
      case State::kBlock: {
        std::size_t end = text_.find(kHermesClose, search_);
        std::size_t stop = end + kHermesClose.size();
        if (end == std::string::npos) {
          if (!at_end) {
            search_ = std::max(body_, text_.size() - std::min(text_.size(), kHermesClose.size()));
            return;
          }
          end = stop = text_.size();  // left open: a call still when its JSON is whole
        }
        if (auto call = detail::read_call(std::string_view(text_).substr(body_, end - body_))) {
          pos_ = stop;
          state_ = State::kText;
          emit_call(std::move(call->name), std::move(call->arguments), out);
        } else {
          give_up(stop, State::kText, out);
        }
        break;
      }
      case State::kStart: {
        const std::size_t blanks = leading_blanks(rest);
        emit_content(rest.substr(0, blanks), out);
        pos_ += blanks;
        const std::string_view next = rest.substr(blanks);
        if (next.empty()) return;
        region_ = pos_;
        if (next.front() == '{') {
          body_ = pos_;
          depth_ = 0;
          state_ = State::kObject;
        } else if (next.starts_with(kPythonTag)) {
          pos_ += kPythonTag.size();
          state_ = State::kAfterTag;
        } else if (!at_end && kPythonTag.starts_with(next)) {
          return;
        } else {
          state_ = State::kPlain;
        }
        break;
      }
      case State::kAfterTag:
      case State::kArrayOpen:
      case State::kElement: {
        const std::size_t blanks = leading_blanks(rest);
        if (blanks == rest.size()) {
          if (at_end) {
            give_up(text_.size(), failed, out);
            break;
          }
          return;
        }
        const char want = state_ == State::kArrayOpen ? '[' : '{';
        if (rest[blanks] != want) {
          give_up(pos_ + blanks, failed, out);
          break;
        }
        pos_ += blanks;
        if (state_ == State::kArrayOpen) {
          ++pos_;
          state_ = State::kElement;
        } else {
          body_ = pos_;
          depth_ = 0;
          state_ = State::kObject;
        }
        break;
      }
      case State::kObject: {
        // The object's extent by its braces, strings skipped; whether it is JSON at all is
        // read_call's to say once it is closed.
        bool closed = false;
        for (; pos_ < text_.size() && !closed; ++pos_) {
          const char c = text_[pos_];
          if (in_string_) {
            if (escaped_) {
              escaped_ = false;
            } else if (c == '\\') {
              escaped_ = true;
            } else if (c == '"') {
              in_string_ = false;
            }
          } else if (c == '"') {
            in_string_ = true;
          } else if (c == '{' || c == '[') {
            ++depth_;
          } else if ((c == '}' || c == ']') && --depth_ == 0) {
            closed = true;
          }
        }
        if (!closed) {
          if (at_end) {
            in_string_ = escaped_ = false;
            give_up(text_.size(), failed, out);
            break;
          }
          return;
        }
        if (auto call = detail::read_call(std::string_view(text_).substr(body_, pos_ - body_))) {
          region_ = pos_;  // what follows is held as the gap to the next call
          state_ = State::kAfterCall;
          emit_call(std::move(call->name), std::move(call->arguments), out);
        } else {
          give_up(pos_, failed, out);
        }
        break;
      }
      case State::kAfterCall: {
        const std::size_t blanks = leading_blanks(rest);
        if (blanks == rest.size()) {
          if (at_end) {
            give_up(text_.size(), failed, out);
            break;
          }
          return;
        }
        const char c = rest[blanks];
        if (format_ == ToolCallFormat::kMistral && (c == ',' || c == ']')) {
          pos_ += blanks + 1;
          state_ = c == ',' ? State::kElement : State::kText;
        } else if (format_ == ToolCallFormat::kLlama3Json && c == ';') {
          pos_ += blanks + 1;
          state_ = State::kAfterTag;  // the next object, after blanks
        } else {
          give_up(pos_ + blanks, failed, out);
        }
        break;
      }
      case State::kPlain:
        emit_content(rest, out);
        pos_ = text_.size();
        return;
    }
  }
}

}  // namespace kvvm::server
