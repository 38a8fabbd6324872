#include "grammar/regex_parser.h"

#include <string>
#include <utility>

#include "grammar/text.h"
#include "tokenizer/utf8.h"

namespace kvvm::grammar {
namespace regex_syntax {
namespace {

using Ranges = std::vector<CodepointRange>;

// ECMAScript's \s: WhiteSpace (tab, VT, FF, space, NBSP, ZWNBSP, the Zs category) and
// LineTerminator (LF, CR, LS, PS).
const Ranges& space_ranges() {
  static const Ranges ranges = {
      {0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
      {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
  return ranges;
}

// \d \w \s and their negations (\w and \d are ASCII: no `i` flag, no Unicode case folding).
Ranges class_escape(char letter) {
  Ranges ranges;
  switch (letter | 0x20) {
    case 'd':
      ranges = {{'0', '9'}};
      break;
    case 'w':
      ranges = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
      break;
    default:
      ranges = space_ranges();
  }
  return normalize_ranges(std::move(ranges), letter >= 'A' && letter <= 'Z');
}

bool is_class_escape(char c) {
  return c == 'd' || c == 'D' || c == 'w' || c == 'W' || c == 's' || c == 'S';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
bool is_surrogate(std::uint32_t cp) { return cp >= 0xD800 && cp <= 0xDFFF; }

std::string utf8(std::uint32_t cp) {
  std::string out;
  tokenizer::detail::utf8_append(out, static_cast<char32_t>(cp));
  return out;
}

// The offset of the first byte that does not start a well-formed UTF-8 sequence (overlong
// forms, surrogates and code points past U+10FFFF included), or nullopt.
std::optional<std::size_t> first_invalid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = tokenizer::detail::utf8_length(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::nullopt;
}

// One class member: a code point, or the set of a class escape (which cannot bound a range).
struct ClassAtom {
  bool is_set = false;
  std::uint32_t codepoint = 0;
  Ranges set;
};

class Parser {
 public:
  Parser(std::string_view pattern, std::string_view label) : p_(pattern), label_(label) {}

  Result<RegexNode> parse() {
    if (const auto bad = first_invalid_utf8(p_)) return error(*bad, "invalid UTF-8");
    KVVM_ASSIGN_OR_RETURN(RegexNode node, alternation(0, 0));
    // alternation() stops only at the end or at a ')' it does not own.
    if (pos_ < p_.size()) return error(pos_, "')' closes no group");
    return node;
  }

 private:
  Status error(std::size_t at, std::string_view what) const {
    return Status::InvalidArgument(concat(label_, " at byte ", at, ": ", what));
  }
  bool at_end() const { return pos_ >= p_.size(); }
  char peek(std::size_t ahead = 0) const {
    return pos_ + ahead < p_.size() ? p_[pos_ + ahead] : '\0';
  }
  bool peek_is(std::string_view text) const { return p_.substr(pos_, text.size()) == text; }
  // The pattern's text from `from` to the current position, for messages.
  std::string_view text_from(std::size_t from) const { return p_.substr(from, pos_ - from); }

  // The code point at the current position (the pattern was checked to be valid UTF-8).
  std::uint32_t take_codepoint() {
    const auto b = static_cast<std::uint8_t>(p_[pos_]);
    const int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    std::uint32_t cp = n == 1 ? b : n == 2 ? b & 0x1Fu : n == 3 ? b & 0x0Fu : b & 0x07u;
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<std::uint8_t>(p_[pos_ + k]) & 0x3Fu);
    pos_ += static_cast<std::size_t>(n);
    return cp;
  }

  // alternative ('|' alternative)*; `offset` names it (its group's '(').
  Result<RegexNode> alternation(int depth, std::size_t offset) {
    RegexNode node;
    node.kind = RegexNode::Kind::kAlternation;
    node.offset = offset;
    while (true) {
      KVVM_ASSIGN_OR_RETURN(RegexNode alternative, sequence(depth));
      node.children.push_back(std::move(alternative));
      if (peek() != '|' || at_end()) break;
      ++pos_;
    }
    if (node.children.size() == 1) return std::move(node.children[0]);
    return node;
  }

  Result<RegexNode> sequence(int depth) {
    RegexNode node;
    node.kind = RegexNode::Kind::kSequence;
    node.offset = pos_;
    // The pattern is matched whole: an anchor at an end of a top alternative says nothing.
    if (depth == 0 && peek() == '^') ++pos_;
    while (!at_end() && peek() != '|' && peek() != ')') {
      const std::size_t at = pos_;
      switch (peek()) {
        case '$':
          if (depth == 0 && (at + 1 == p_.size() || p_[at + 1] == '|')) {
            ++pos_;
            continue;
          }
          return error(at, "anchor \"$\" inside the pattern is not supported (only at its end)");
        case '^':
          return error(at, "anchor \"^\" inside the pattern is not supported (only at its start)");
        case '*':
        case '+':
        case '?':
          return error(at, concat("nothing to repeat before \"", p_[at], "\""));
        case '{':
          KVVM_RETURN_IF_ERROR(braces_quantifier(nullptr));
          return error(at, concat("nothing to repeat before \"", text_from(at), "\""));
        case '}':
          return error(at, "lone '}' (write \\} for the character)");
        case ']':
          return error(at, "lone ']' (write \\] for the character)");
        default:
          break;
      }
      KVVM_ASSIGN_OR_RETURN(RegexNode atom_node, atom(depth));
      KVVM_ASSIGN_OR_RETURN(RegexNode quantified, quantify(std::move(atom_node)));
      // Characters in a row are one literal (a long pattern is not a node per character).
      if (quantified.kind == RegexNode::Kind::kLiteral && !node.children.empty() &&
          node.children.back().kind == RegexNode::Kind::kLiteral) {
        node.children.back().text += quantified.text;
      } else {
        node.children.push_back(std::move(quantified));
      }
    }
    if (node.children.size() == 1) return std::move(node.children[0]);
    return node;
  }

  // {m}, {m,} or {m,n} at the current position, consumed; its bounds into `out` when given.
  // A '{' that starts none of them is an error in unicode mode.
  Status braces_quantifier(RegexNode* out) {
    const std::size_t at = pos_;
    ++pos_;
    const auto number = [this](std::uint64_t& value) {
      if (!is_digit(peek())) return false;
      value = 0;
      for (; is_digit(peek()); ++pos_) {
        const auto digit = static_cast<std::uint64_t>(peek() - '0');
        // Saturate: a count past the grammar's bounds is refused by size, not parsed exactly.
        value = value > (UINT64_MAX - digit) / 10 ? UINT64_MAX : value * 10 + digit;
      }
      return true;
    };
    std::uint64_t min = 0;
    std::uint64_t max = 0;
    bool bounded = true;
    bool ok = number(min);
    if (ok && peek() == ',') {
      ++pos_;
      bounded = number(max);
    } else {
      max = min;
    }
    if (!ok || peek() != '}') {
      pos_ = at;
      return error(at,
                   "'{' does not start a quantifier {m}, {m,} or {m,n} (write \\{ for the "
                   "character)");
    }
    ++pos_;
    if (bounded && max < min) {
      return error(at, concat("quantifier \"", text_from(at), "\" has its bounds out of order"));
    }
    if (out) {
      out->min = min;
      out->max = bounded ? std::optional<std::uint64_t>(max) : std::nullopt;
    }
    return Status::Ok();
  }

  // The atom followed by at most one quantifier (and its lazy '?', the same language).
  Result<RegexNode> quantify(RegexNode atom_node) {
    const std::size_t at = pos_;
    RegexNode node;
    node.kind = RegexNode::Kind::kRepeat;
    node.offset = at;
    switch (peek()) {
      case '*':
        node.max = std::nullopt;
        ++pos_;
        break;
      case '+':
        node.min = 1;
        node.max = std::nullopt;
        ++pos_;
        break;
      case '?':
        node.max = 1;
        ++pos_;
        break;
      case '{':
        KVVM_RETURN_IF_ERROR(braces_quantifier(&node));
        break;
      default:
        return atom_node;
    }
    if (peek() == '?') ++pos_;
    const char next = peek();
    if (!at_end() && (next == '*' || next == '+' || next == '?' || next == '{')) {
      return error(pos_, concat("nothing to repeat before \"", next, "\" (a quantifier follows \"",
                                text_from(at), "\")"));
    }
    node.children.push_back(std::move(atom_node));
    return node;
  }

  Result<RegexNode> atom(int depth) {
    const std::size_t at = pos_;
    RegexNode node;
    node.offset = at;
    switch (peek()) {
      case '(':
        return group(depth);
      case '[':
        return char_class();
      case '.':
        ++pos_;
        node.kind = RegexNode::Kind::kClass;
        // Any code point but a LineTerminator (no `s` flag).
        node.ranges = normalize_ranges({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}, true);
        return node;
      case '\\': {
        ++pos_;
        if (at_end()) return error(at, "the pattern ends with a lone backslash");
        const char c = peek();
        if (is_class_escape(c)) {
          ++pos_;
          node.kind = RegexNode::Kind::kClass;
          node.ranges = class_escape(c);
          return node;
        }
        if (c == 'b') return error(at, "word boundary \"\\b\" is not supported");
        if (c == 'B') return error(at, "non-word-boundary \"\\B\" is not supported");
        KVVM_RETURN_IF_ERROR(refuse_named_escapes(at));
        KVVM_ASSIGN_OR_RETURN(const std::uint32_t cp, character_escape(at, false));
        if (is_surrogate(cp)) {
          return error(at, concat("lone surrogate \"", text_from(at),
                                  "\" matches no UTF-8 text (write a pair for one code point)"));
        }
        node.kind = RegexNode::Kind::kLiteral;
        node.text = utf8(cp);
        return node;
      }
      default: {
        const std::size_t from = pos_;
        take_codepoint();
        node.kind = RegexNode::Kind::kLiteral;
        node.text = std::string(text_from(from));
        return node;
      }
    }
  }

  Result<RegexNode> group(int depth) {
    const std::size_t open = pos_;
    if (depth + 1 > kMaxRegexDepth) {
      return Status::ResourceExhausted(
          concat(label_, " at byte ", open, ": groups nested deeper than ", kMaxRegexDepth),
          {static_cast<std::uint64_t>(depth) + 1, kMaxRegexDepth, kMaxRegexDepth});
    }
    ++pos_;
    if (peek() == '?') {
      if (peek_is("?:")) {
        pos_ += 2;
      } else if (peek_is("?=")) {
        return error(open, "lookahead \"(?=\" is not supported");
      } else if (peek_is("?!")) {
        return error(open, "negative lookahead \"(?!\" is not supported");
      } else if (peek_is("?<=")) {
        return error(open, "lookbehind \"(?<=\" is not supported");
      } else if (peek_is("?<!")) {
        return error(open, "negative lookbehind \"(?<!\" is not supported");
      } else if (peek_is("?<")) {
        pos_ += 2;
        KVVM_RETURN_IF_ERROR(group_name(open));
      } else {
        const std::size_t from = pos_ + 1;
        std::size_t end = from;
        while (end < p_.size() && (p_[end] == '-' || (p_[end] >= 'a' && p_[end] <= 'z'))) ++end;
        if (end > from) {
          return error(open, concat("inline modifiers \"(", p_.substr(pos_, end - pos_),
                                    "\" are not supported"));
        }
        return error(open, "\"(?\" starts no group ECMAScript knows");
      }
    }
    KVVM_ASSIGN_OR_RETURN(RegexNode body, alternation(depth + 1, open));
    if (peek() != ')' || at_end()) return error(open, "the group opened here is not closed");
    ++pos_;
    return body;
  }

  // An identifier and its '>' (non-ASCII code points are taken as letters).
  Status group_name(std::size_t open) {
    const std::size_t from = pos_;
    while (!at_end() && peek() != '>') {
      const char c = peek();
      const bool ascii_ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                            c == '$' || (is_digit(c) && pos_ > from);
      if (!ascii_ok && static_cast<std::uint8_t>(c) < 0x80) {
        return error(pos_, concat("group name has '", c, "', which no identifier has"));
      }
      take_codepoint();
    }
    if (at_end()) return error(open, "the group name opened here has no closing '>'");
    if (pos_ == from) return error(open, "the group name is empty");
    ++pos_;
    return Status::Ok();
  }

  // Escapes that are valid ECMAScript but match what no grammar here can: refused by name.
  // The current position is after the backslash at `at`.
  Status refuse_named_escapes(std::size_t at) {
    const char c = peek();
    if (c >= '1' && c <= '9') {
      while (is_digit(peek())) ++pos_;
      return error(at, concat("backreference \"", text_from(at), "\" is not supported"));
    }
    if (c == 'k') {
      ++pos_;
      if (peek() == '<') {
        while (!at_end() && peek() != '>') ++pos_;
        if (!at_end()) ++pos_;
      }
      return error(at, concat("backreference \"", text_from(at), "\" is not supported"));
    }
    if (c == 'p' || c == 'P') {
      ++pos_;
      if (peek() == '{') {
        while (!at_end() && peek() != '}') ++pos_;
        if (!at_end()) ++pos_;
      }
      return error(at, concat("Unicode property escape \"", text_from(at), "\" is not supported"));
    }
    return Status::Ok();
  }

  // The code point of a CharacterEscape (the position is after the backslash at `at`); '-' is
  // an identity escape only in a class.
  Result<std::uint32_t> character_escape(std::size_t at, bool in_class) {
    const char c = peek();
    ++pos_;
    switch (c) {
      case 'f':
        return 0x0Cu;
      case 'n':
        return 0x0Au;
      case 'r':
        return 0x0Du;
      case 't':
        return 0x09u;
      case 'v':
        return 0x0Bu;
      case 'c': {
        const char letter = peek();
        if (!((letter >= 'a' && letter <= 'z') || (letter >= 'A' && letter <= 'Z'))) {
          return error(at, "control escape \"\\c\" needs a letter A-Z or a-z after it");
        }
        ++pos_;
        return static_cast<std::uint32_t>(letter % 32);
      }
      case '0':
        if (is_digit(peek())) {
          return error(at, "octal escape \"\\0\" followed by a digit is not allowed (write \\xHH)");
        }
        return 0u;
      case 'x': {
        const int hi = hex_value(peek());
        const int lo = hex_value(peek(1));
        if (hi < 0 || lo < 0) return error(at, "\"\\x\" needs two hex digits");
        pos_ += 2;
        return static_cast<std::uint32_t>(hi * 16 + lo);
      }
      case 'u':
        return unicode_escape(at);
      default:
        break;
    }
    static constexpr std::string_view kSyntax = "^$\\.*+?()[]{}|/";
    if (kSyntax.find(c) != std::string_view::npos || (in_class && c == '-')) {
      return static_cast<std::uint32_t>(static_cast<std::uint8_t>(c));
    }
    --pos_;
    take_codepoint();  // the whole character, for the message
    return error(at, concat("unknown escape \"", text_from(at), "\""));
  }

  // \u{X...} (up to U+10FFFF) or \uXXXX, a surrogate pair of two \uXXXX being one code point.
  // The position is after the 'u'.
  Result<std::uint32_t> unicode_escape(std::size_t at) {
    if (peek() == '{') {
      ++pos_;
      std::uint32_t cp = 0;
      const std::size_t first = pos_;
      for (; hex_value(peek()) >= 0; ++pos_) {
        cp = cp * 16 + static_cast<std::uint32_t>(hex_value(peek()));
        if (cp > 0x10FFFF) return error(at, "\"\\u{...}\" is past U+10FFFF");
      }
      if (pos_ == first || peek() != '}') {
        return error(at, "\"\\u{\" needs hex digits and a closing '}'");
      }
      ++pos_;
      return cp;
    }
    const auto four = [this](std::size_t from) -> std::optional<std::uint32_t> {
      std::uint32_t value = 0;
      for (std::size_t k = 0; k < 4; ++k) {
        const int digit = from + k < p_.size() ? hex_value(p_[from + k]) : -1;
        if (digit < 0) return std::nullopt;
        value = value * 16 + static_cast<std::uint32_t>(digit);
      }
      return value;
    };
    const std::optional<std::uint32_t> unit = four(pos_);
    if (!unit) return error(at, "\"\\u\" needs four hex digits or {...}");
    pos_ += 4;
    if (*unit >= 0xD800 && *unit <= 0xDBFF && peek_is("\\u")) {
      const std::optional<std::uint32_t> low = four(pos_ + 2);
      if (low && *low >= 0xDC00 && *low <= 0xDFFF) {
        pos_ += 6;
        return 0x10000 + ((*unit - 0xD800) << 10) + (*low - 0xDC00);
      }
    }
    return *unit;
  }

  Result<RegexNode> char_class() {
    const std::size_t open = pos_;
    ++pos_;
    const bool negate = peek() == '^' && !at_end();
    if (negate) ++pos_;
    Ranges ranges;
    while (true) {
      if (at_end()) return error(open, "the class opened here is not closed");
      if (peek() == ']') break;
      const std::size_t from = pos_;
      KVVM_ASSIGN_OR_RETURN(ClassAtom lo, class_atom());
      if (peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        KVVM_ASSIGN_OR_RETURN(ClassAtom hi, class_atom());
        if (lo.is_set || hi.is_set) {
          return error(from, concat("range \"", text_from(from),
                                    "\" has a class escape at an end (write \\- for a dash)"));
        }
        if (lo.codepoint > hi.codepoint) {
          return error(from, concat("range \"", text_from(from), "\" is out of order"));
        }
        ranges.push_back({lo.codepoint, hi.codepoint});
      } else if (lo.is_set) {
        ranges.insert(ranges.end(), lo.set.begin(), lo.set.end());
      } else {
        ranges.push_back({lo.codepoint, lo.codepoint});
      }
    }
    ++pos_;
    RegexNode node;
    node.kind = RegexNode::Kind::kClass;
    node.offset = open;
    node.ranges = normalize_ranges(std::move(ranges), negate);
    if (node.ranges.empty()) {
      return error(open, concat("class \"", text_from(open), "\" matches no character"));
    }
    return node;
  }

  Result<ClassAtom> class_atom() {
    ClassAtom out;
    if (peek() != '\\') {
      out.codepoint = take_codepoint();
      return out;
    }
    const std::size_t at = pos_;
    ++pos_;
    if (at_end()) return error(at, "the pattern ends with a lone backslash");
    const char c = peek();
    if (is_class_escape(c)) {
      ++pos_;
      out.is_set = true;
      out.set = class_escape(c);
      return out;
    }
    if (c == 'b') {  // backspace, in a class
      ++pos_;
      out.codepoint = 0x08;
      return out;
    }
    KVVM_RETURN_IF_ERROR(refuse_named_escapes(at));
    KVVM_ASSIGN_OR_RETURN(out.codepoint, character_escape(at, true));
    return out;
  }

  std::string_view p_;
  std::string_view label_;
  std::size_t pos_ = 0;
};

}  // namespace
}  // namespace regex_syntax

Result<RegexNode> parse_regex(std::string_view pattern, std::string_view label) {
  return regex_syntax::Parser(pattern, label).parse();
}

}  // namespace kvvm::grammar
