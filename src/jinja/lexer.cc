#include "jinja/lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "jinja/text.h"
#include "jinja/value.h"

namespace kvvm::jinja::detail {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

std::string rstrip_space(std::string_view s) {
  std::size_t n = s.size();
  while (n > 0 && is_space(s[n - 1])) --n;
  return std::string(s.substr(0, n));
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  Lexer(std::string source, const LexOptions& options)
      : src_(std::move(source)), options_(options) {
    line_starts_.push_back(0);
    for (std::size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    bool line_starting = true;  // the last tag's end consumed a newline (or at the start)
    while (pos_ < src_.size()) {
      std::size_t tag = find_tag(pos_);
      std::string text = src_.substr(pos_, tag - pos_);
      if (tag == src_.size()) {
        emit_text(std::move(text), pos_);
        break;
      }
      char type = src_[tag + 1];
      char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign != '-' && sign != '+') sign = '\0';
      if (type == '%' && is_raw_begin(tag)) {
        apply_left(text, sign, type, line_starting);
        emit_text(std::move(text), pos_);
        line_starting = lex_raw(tag);
        continue;
      }
      apply_left(text, sign, type, line_starting);
      emit_text(std::move(text), pos_);
      std::size_t inner = tag + 2 + (sign != '\0' ? 1 : 0);
      if (type == '#') {
        line_starting = lex_comment(tag, inner);
      } else {
        line_starting = lex_tag(tag, inner, type);
      }
    }
    Token end;
    end.kind = TokenKind::kEnd;
    end.pos = pos_at(src_.size());
    tokens_.push_back(std::move(end));
    return std::move(tokens_);
  }

 private:
  SourcePos pos_at(std::size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    auto line = static_cast<std::size_t>(it - line_starts_.begin());
    return SourcePos{static_cast<std::uint32_t>(line),
                     static_cast<std::uint32_t>(offset - line_starts_[line - 1] + 1)};
  }

  [[noreturn]] void error_at(std::size_t offset, std::string message) const {
    fail_at(pos_at(offset), std::move(message));
  }

  std::size_t find_tag(std::size_t from) const {
    for (std::size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  // Whitespace control on the text before a tag: `-` strips it all, lstrip_blocks the blanks
  // before a block or comment tag alone on its line.
  void apply_left(std::string& text, char sign, char type, bool line_starting) const {
    if (sign == '-') {
      text = rstrip_space(text);
    } else if (sign != '+' && options_.lstrip_blocks && type != '{') {
      std::size_t line_pos = text.rfind('\n');
      line_pos = line_pos == std::string::npos ? 0 : line_pos + 1;
      if (line_pos > 0 || line_starting) {
        bool blank = line_pos < text.size();
        // Python's \s: Unicode whitespace, not just blanks.
        for (std::size_t i = line_pos; i < text.size() && blank;) {
          blank = is_unicode_space(decode_at(text, i));
        }
        if (blank) text.resize(line_pos);
      }
    }
  }

  void emit_text(std::string text, std::size_t offset) {
    if (text.empty()) return;
    Token t;
    t.kind = TokenKind::kText;
    t.text = std::move(text);
    t.pos = pos_at(offset);
    tokens_.push_back(std::move(t));
  }

  // After a tag's closing delimiter at `end` (one past it): `-` consumed all whitespace,
  // trim_blocks one newline. Returns whether the consumed text ended with a newline.
  bool consume_right(std::size_t end, char sign, bool trim) {
    pos_ = end;
    if (sign == '-') {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    } else if (sign != '+' && trim && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    return pos_ > 0 && src_[pos_ - 1] == '\n';
  }

  bool is_raw_begin(std::size_t tag) const {
    std::size_t i = tag + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    while (i < src_.size() && is_space(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0) return false;
    i += 3;
    if (i < src_.size() && is_name_char(src_[i])) return false;
    while (i < src_.size() && is_space(src_[i])) ++i;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    return src_.compare(i, 2, "%}") == 0;
  }

  bool lex_raw(std::size_t tag) {
    std::size_t i = src_.find("%}", tag) + 2;
    char begin_sign = src_[i - 3];
    // The raw begin tag itself: `-%}` strips what follows; no trim_blocks newline.
    pos_ = i;
    if (begin_sign == '-') {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    }
    std::size_t body = pos_;
    for (std::size_t j = find_tag(body); j < src_.size(); j = find_tag(j + 1)) {
      if (src_[j + 1] != '%') continue;
      std::size_t k = j + 2;
      char sign = '\0';
      if (k < src_.size() && (src_[k] == '-' || src_[k] == '+')) sign = src_[k++];
      while (k < src_.size() && is_space(src_[k])) ++k;
      if (src_.compare(k, 6, "endraw") != 0) continue;
      k += 6;
      while (k < src_.size() && is_space(src_[k])) ++k;
      char end_sign = '\0';
      if (k < src_.size() && (src_[k] == '-' || src_[k] == '+')) end_sign = src_[k++];
      if (src_.compare(k, 2, "%}") != 0) continue;
      std::string text = src_.substr(body, j - body);
      apply_left(text, sign, '%', false);
      emit_text(std::move(text), body);
      return consume_right(k + 2, end_sign, options_.trim_blocks);
    }
    error_at(tag, "missing end of raw directive");
  }

  bool lex_comment(std::size_t tag, std::size_t inner) {
    std::size_t end = src_.find("#}", inner);
    if (end == std::string::npos) error_at(tag, "missing end of comment tag");
    char sign =
        end > inner && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : '\0';
    return consume_right(end + 2, sign, options_.trim_blocks);
  }

  void push(TokenKind kind, std::size_t offset, std::string text = {}) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    t.pos = pos_at(offset);
    tokens_.push_back(std::move(t));
  }

  bool lex_tag(std::size_t tag, std::size_t inner, char type) {
    push(type == '{' ? TokenKind::kVariableBegin : TokenKind::kBlockBegin, tag);
    const char close = type == '{' ? '}' : '%';
    int depth = 0;  // open brackets: an end delimiter inside them is an operator
    std::size_t i = inner;
    while (true) {
      while (i < src_.size() && is_space(src_[i])) ++i;
      if (i >= src_.size()) {
        error_at(tag, type == '{' ? "unexpected end of template, expected '}}'"
                                  : "unexpected end of template, expected '%}'");
      }
      if (depth == 0) {
        char sign = '\0';
        std::size_t j = i;
        if ((src_[j] == '-' || (src_[j] == '+' && type == '%')) && j + 2 < src_.size() + 1 &&
            src_.compare(j + 1, 2, std::string{close, '}'}) == 0) {
          sign = src_[j++];
        }
        if (src_.compare(j, 2, std::string{close, '}'}) == 0) {
          push(type == '{' ? TokenKind::kVariableEnd : TokenKind::kBlockEnd, j);
          return consume_right(j + 2, sign, type == '%' && options_.trim_blocks);
        }
      }
      char c = src_[i];
      if (is_name_start(c)) {
        std::size_t j = i;
        while (j < src_.size() && is_name_char(src_[j])) ++j;
        push(TokenKind::kName, i, src_.substr(i, j - i));
        i = j;
      } else if (is_digit(c)) {
        i = lex_number(i);
      } else if (c == '\'' || c == '"') {
        i = lex_string(i);
      } else {
        i = lex_operator(i, depth);
      }
    }
  }

  std::size_t lex_number(std::size_t i) {
    std::size_t start = i;
    // 0x1f, 0o17, 0b101; a decimal integer never starts with 0 unless it is all zeros.
    if (src_[i] == '0' && i + 1 < src_.size()) {
      char prefix = static_cast<char>(src_[i + 1] | 0x20);
      int base = prefix == 'x' ? 16 : prefix == 'o' ? 8 : prefix == 'b' ? 2 : 0;
      if (base != 0) {
        std::string digits;
        std::size_t j = i + 2;
        while (j < src_.size() &&
               (std::isxdigit(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) {
          if (src_[j] != '_') digits.push_back(src_[j]);
          ++j;
        }
        errno = 0;
        char* end = nullptr;
        long long v = std::strtoll(digits.c_str(), &end, base);
        if (digits.empty() || errno == ERANGE || *end != '\0') {
          error_at(start, "invalid integer literal");
        }
        Token t;
        t.kind = TokenKind::kInteger;
        t.integer = v;
        t.pos = pos_at(start);
        tokens_.push_back(std::move(t));
        return j;
      }
    }
    std::string digits;
    auto take_digits = [&] {
      while (i < src_.size() && (is_digit(src_[i]) || (src_[i] == '_' && i + 1 < src_.size() &&
                                                       is_digit(src_[i + 1])))) {
        if (src_[i] != '_') digits.push_back(src_[i]);
        ++i;
      }
    };
    take_digits();
    if (digits.size() > 1 && digits[0] == '0' &&
        digits.find_first_not_of('0') != std::string::npos &&
        !(i < src_.size() && (src_[i] == '.' || src_[i] == 'e' || src_[i] == 'E'))) {
      // "07": Python has no such literal; Jinja reads the zeros as one integer and the rest as
      // another, which the parser refuses.
      i = start + 1;
      while (i < src_.size() && (src_[i] == '0' || src_[i] == '_')) ++i;
      digits = "0";
    }
    bool is_float = false;
    if (i + 1 < src_.size() && src_[i] == '.' && is_digit(src_[i + 1])) {
      is_float = true;
      digits.push_back('.');
      ++i;
      take_digits();
    }
    if (i < src_.size() && (src_[i] == 'e' || src_[i] == 'E')) {
      std::size_t j = i + 1;
      if (j < src_.size() && (src_[j] == '+' || src_[j] == '-')) ++j;
      if (j < src_.size() && is_digit(src_[j])) {
        is_float = true;
        digits.append(src_, i, j - i);
        i = j;
        take_digits();
      }
    }
    Token t;
    t.pos = pos_at(start);
    if (is_float) {
      t.kind = TokenKind::kFloat;
      t.floating = std::strtod(digits.c_str(), nullptr);
    } else {
      t.kind = TokenKind::kInteger;
      errno = 0;
      t.integer = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno == ERANGE) error_at(start, "integer literal out of range");
    }
    tokens_.push_back(std::move(t));
    return i;
  }

  std::size_t lex_string(std::size_t i) {
    std::size_t start = i;
    char quote = src_[i++];
    std::string out;
    while (true) {
      if (i >= src_.size()) error_at(start, "unexpected end of string");
      char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) error_at(start, "unexpected end of string");
      char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case '\n':
          break;  // a backslash-newline continues the line
        case 'x':
        case 'u':
        case 'U': {
          std::size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (std::size_t k = 0; k < n; ++k) {
            int h = i + k < src_.size() ? hex_value(src_[i + k]) : -1;
            if (h < 0) error_at(start, "truncated \\" + std::string(1, e) + " escape in string");
            cp = cp * 16 + static_cast<char32_t>(h);
          }
          if (cp > 0x10ffff) error_at(start, "illegal Unicode character in string");
          append_utf8(cp, out);
          i += n;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              cp = cp * 8 + static_cast<char32_t>(src_[i++] - '0');
            }
            append_utf8(cp, out);
          } else {
            out.push_back('\\');  // an unknown escape keeps its backslash, as Python does
            i -= 1;
          }
      }
    }
    push(TokenKind::kString, start, std::move(out));
    return i + 1;
  }

  std::size_t lex_operator(std::size_t i, int& depth) {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwo) {
      if (src_.compare(i, 2, op) == 0) {
        push(TokenKind::kOperator, i, std::string(op));
        return i + 2;
      }
    }
    char c = src_[i];
    static constexpr std::string_view kOne = "+-/*%~[](){}<>=.:|,;";
    if (kOne.find(c) == std::string_view::npos) {
      error_at(i, std::string("unexpected char '") + c + "'");
    }
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') {
      if (depth == 0) error_at(i, std::string("unexpected '") + c + "'");
      --depth;
    }
    push(TokenKind::kOperator, i, std::string(1, c));
    return i + 1;
  }

  std::string src_;
  LexOptions options_;
  std::vector<std::size_t> line_starts_;
  std::vector<Token> tokens_;
  std::size_t pos_ = 0;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& options) {
  // Jinja reads \r\n and \r as \n, and drops one trailing newline unless told to keep it.
  std::string normalized;
  normalized.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized.push_back(source[i]);
    }
  }
  if (!options.keep_trailing_newline && !normalized.empty() && normalized.back() == '\n') {
    normalized.pop_back();
  }
  return Lexer(std::move(normalized), options).run();
}

}  // namespace kvvm::jinja::detail
