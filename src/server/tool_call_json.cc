#include "server/tool_call_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <utility>

#include "server/streamed_text.h"
#include "tokenizer/utf8.h"

namespace kvvm::server::detail {
namespace {

using Json = nlohmann::ordered_json;  // keys in the model's order, as Python's dicts keep them

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

}  // namespace

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

}  // namespace kvvm::server::detail
