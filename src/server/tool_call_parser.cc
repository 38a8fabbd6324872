#include "server/tool_call_parser.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <utility>

#include "tokenizer/utf8.h"

namespace kvvm::server {
namespace {

using Json = nlohmann::ordered_json;  // keys in the model's order, as Python's dicts keep them

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralTag = "[TOOL_CALLS]";

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool all_blank(std::string_view text) { return std::all_of(text.begin(), text.end(), is_blank); }
std::size_t leading_blanks(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size() && is_blank(text[i])) ++i;
  return i;
}

// The longest end of `text` that is a proper prefix of `tag`: text that may still open it.
std::size_t tag_prefix_at_end(std::string_view text, std::string_view tag) {
  for (std::size_t k = std::min(text.size(), tag.size() - 1); k > 0; --k) {
    if (text.substr(text.size() - k) == tag.substr(0, k)) return k;
  }
  return 0;
}

// Python's json.dumps(value, ensure_ascii=False): ", " and ": " between items, nothing else
// added; strings escaped as nlohmann escapes them (", \, control characters), which is
// Python's set with ensure_ascii off.
void dump_python(const Json& value, std::string& out) {
  if (value.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, item] : value.items()) {
      if (!first) out += ", ";
      first = false;
      out += Json(key).dump(-1, ' ', false, Json::error_handler_t::replace);
      out += ": ";
      dump_python(item, out);
    }
    out += '}';
  } else if (value.is_array()) {
    out += '[';
    bool first = true;
    for (const Json& item : value) {
      if (!first) out += ", ";
      first = false;
      dump_python(item, out);
    }
    out += ']';
  } else if (value.is_number_float() && !std::isfinite(value.get<double>())) {
    // Python writes Infinity, which is no JSON; a literal past a double's range reads back as
    // the same infinity anywhere.
    out += value.get<double>() > 0 ? "1e999" : "-1e999";
  } else {
    out += value.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
}

// JSON text read into a value as Python's json.loads reads it: keys in order, a repeated key's
// last value in its first place. Not nlohmann's parser, which refuses a number past a double's
// range (1e999), one the grammar's JSON allows and Python reads as infinity. Ill-formed text
// (and nesting past kMaxDepth, which would only cost stack) is nullopt.
class JsonReader {
 public:
  explicit JsonReader(std::string_view text) : s_(text) {}

  std::optional<Json> whole() {
    blanks();
    std::optional<Json> v = value(0);
    blanks();
    if (!v || i_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  static constexpr int kMaxDepth = 512;

  void blanks() {
    while (i_ < s_.size() && is_blank(s_[i_])) ++i_;
  }
  bool eat(char c) {
    if (i_ >= s_.size() || s_[i_] != c) return false;
    ++i_;
    return true;
  }
  bool word(std::string_view w) {
    if (!s_.substr(i_).starts_with(w)) return false;
    i_ += w.size();
    return true;
  }

  std::optional<Json> value(int depth) {
    if (depth > kMaxDepth || i_ >= s_.size()) return std::nullopt;
    switch (s_[i_]) {
      case '{':
        return object(depth);
      case '[':
        return array(depth);
      case '"': {
        std::optional<std::string> text = string();
        if (!text) return std::nullopt;
        return Json(std::move(*text));
      }
      case 't':
        return word("true") ? std::optional<Json>(true) : std::nullopt;
      case 'f':
        return word("false") ? std::optional<Json>(false) : std::nullopt;
      case 'n':
        return word("null") ? std::optional<Json>(nullptr) : std::nullopt;
      default:
        return number();
    }
  }

  std::optional<Json> object(int depth) {
    ++i_;
    Json out = Json::object();
    blanks();
    if (eat('}')) return out;
    for (;;) {
      blanks();
      if (i_ >= s_.size() || s_[i_] != '"') return std::nullopt;
      std::optional<std::string> key = string();
      blanks();
      if (!key || !eat(':')) return std::nullopt;
      blanks();
      std::optional<Json> item = value(depth + 1);
      if (!item) return std::nullopt;
      out[*key] = std::move(*item);
      blanks();
      if (eat('}')) return out;
      if (!eat(',')) return std::nullopt;
    }
  }

  std::optional<Json> array(int depth) {
    ++i_;
    Json out = Json::array();
    blanks();
    if (eat(']')) return out;
    for (;;) {
      blanks();
      std::optional<Json> item = value(depth + 1);
      if (!item) return std::nullopt;
      out.push_back(std::move(*item));
      blanks();
      if (eat(']')) return out;
      if (!eat(',')) return std::nullopt;
    }
  }

  std::optional<std::uint32_t> hex4() {
    if (s_.size() - i_ < 4) return std::nullopt;
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<std::uint32_t>(c - '0');
      } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') {
        v |= static_cast<std::uint32_t>((c | 0x20) - 'a' + 10);
      } else {
        return std::nullopt;
      }
    }
    return v;
  }

  // A string's contents, its escapes decoded; well-formed UTF-8 only, and no lone surrogate
  // (no character, and no UTF-8 for it).
  std::optional<std::string> string() {
    ++i_;
    std::string out;
    while (i_ < s_.size()) {
      const auto c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return out;
      }
      if (c < 0x20) return std::nullopt;
      if (c != '\\') {
        const std::size_t n = tokenizer::detail::utf8_length(s_, i_);
        if (n == 0) return std::nullopt;
        out += s_.substr(i_, n);
        i_ += n;
        continue;
      }
      if (++i_ >= s_.size()) return std::nullopt;
      const char e = s_[i_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          std::optional<std::uint32_t> unit = hex4();
          if (!unit || (*unit >= 0xDC00 && *unit <= 0xDFFF)) return std::nullopt;
          char32_t code_point = *unit;
          if (*unit >= 0xD800 && *unit <= 0xDBFF) {
            if (!word("\\u")) return std::nullopt;
            std::optional<std::uint32_t> low = hex4();
            if (!low || *low < 0xDC00 || *low > 0xDFFF) return std::nullopt;
            code_point = 0x10000 + ((*unit - 0xD800) << 10) + (*low - 0xDC00);
          }
          tokenizer::detail::utf8_append(out, code_point);
          break;
        }
        default:
          return std::nullopt;
      }
    }
    return std::nullopt;
  }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?: an integer while it fits 64 bits, a double
  // otherwise (infinite past its range).
  std::optional<Json> number() {
    const std::size_t start = i_;
    const auto digits = [this] {
      const std::size_t from = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ - from;
    };
    eat('-');
    if (i_ >= s_.size()) return std::nullopt;
    if (s_[i_] == '0') {
      ++i_;
    } else if (digits() == 0) {
      return std::nullopt;
    }
    bool integral = true;
    if (eat('.')) {
      integral = false;
      if (digits() == 0) return std::nullopt;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      integral = false;
      ++i_;
      if (!eat('+')) eat('-');
      if (digits() == 0) return std::nullopt;
    }
    const std::string literal(s_.substr(start, i_ - start));
    if (integral) {
      std::int64_t v = 0;
      if (std::from_chars(literal.data(), literal.data() + literal.size(), v).ec == std::errc()) {
        return Json(v);
      }
      std::uint64_t u = 0;
      if (std::from_chars(literal.data(), literal.data() + literal.size(), u).ec == std::errc()) {
        return Json(u);
      }
    }
    return Json(std::strtod(literal.c_str(), nullptr));
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

struct CallText {
  std::string name;
  std::string arguments;
};

// The call in a JSON text: an object with a string "name" and "arguments" (or "parameters",
// as Llama's template names them); nullopt for anything else.
std::optional<CallText> read_call(std::string_view text) {
  const std::optional<Json> value = JsonReader(text).whole();
  if (!value || !value->is_object()) return std::nullopt;
  const auto name = value->find("name");
  if (name == value->end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return std::nullopt;
  }
  auto arguments = value->find("arguments");
  if (arguments == value->end()) arguments = value->find("parameters");
  if (arguments == value->end()) return std::nullopt;
  CallText call{name->get<std::string>(), {}};
  dump_python(*arguments, call.arguments);
  return call;
}

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
  if (partial_utf8_.empty() && out.content.empty()) return;
  out.content.insert(0, partial_utf8_);
  partial_utf8_.clear();
  if (at_end) return;
  const std::size_t whole = tokenizer::detail::utf8_complete_prefix(out.content);
  partial_utf8_ = out.content.substr(whole);
  out.content.resize(whole);
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
        if (auto call = read_call(std::string_view(text_).substr(body_, end - body_))) {
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
        if (auto call = read_call(std::string_view(text_).substr(body_, pos_ - body_))) {
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
