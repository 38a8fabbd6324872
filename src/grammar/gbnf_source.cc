// GBNF (llama.cpp's grammar text, as users paste it) compiled to a Grammar.
//
// Rules `name ::= alternatives`, root the start; a rule runs until the next `name ::=`, so rules
// may span lines. Literals and classes are over Unicode code points, written as UTF-8 bytes;
// escapes (\xHH, \uHHHH, \UHHHHHHHH) name code points too, so "\xe9" is the two bytes of "é",
// as llama.cpp reads them. A postfix operator applies to the item before it (a whole literal, a
// class, a group, a reference) and may be stacked: x{2}? is (x x)?.
//
// User rules keep their names, so Grammar::check's messages name them; helpers are named after
// their rule, their kind and their byte offset ("root-star@12"), which no user name can take
// ('@' is not a name character). Refusals say "grammar at LINE:COLUMN: what".
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/builder.h"
#include "grammar/text.h"
#include "kvvm/grammar/constraint.h"
#include "tokenizer/utf8.h"

namespace kvvm::grammar {
namespace {

constexpr std::size_t kMaxText = std::size_t{1} << 20;
// Groups recurse in the parser: a bound keeps "((((..." from exhausting the stack.
constexpr int kMaxNesting = 256;
// Repetition bounds past this are past any grammar's element bound anyway; saturating here
// keeps the arithmetic from wrapping.
constexpr std::uint64_t kMaxCount = std::uint64_t{1} << 40;

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

bool is_continuation(std::uint8_t b) { return (b & 0xC0) == 0x80; }

// The length of the well-formed UTF-8 sequence at `at`, or 0 (overlong forms, surrogates and
// code points past U+10FFFF are not well-formed).
int utf8_sequence(std::string_view text, std::size_t at) {
  return static_cast<int>(tokenizer::detail::utf8_length(text, at));
}

std::uint32_t decode(std::string_view text, std::size_t at, int length) {
  return static_cast<std::uint32_t>(
      tokenizer::detail::utf8_decode(text, at, static_cast<std::size_t>(length)));
}

std::string show_codepoint(std::uint32_t cp) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  if (cp >= 0x20 && cp < 0x7f) return std::string("'") + static_cast<char>(cp) + "'";
  std::string digits;
  for (std::uint32_t v = cp; v != 0 || digits.size() < 4; v >>= 4)
    digits.insert(digits.begin(), kHex[v & 15]);
  return "U+" + digits;
}

class GbnfParser {
 public:
  GbnfParser(std::string_view text, const GrammarLimits& limits)
      : text_(text), limits_(limits), builder_(grammar_, limits) {}

  Result<Grammar> parse();

 private:
  struct Named {
    RuleId id = 0;
    std::size_t first_use = 0;
    std::optional<std::size_t> defined_at;
  };

  std::string place(std::size_t at) const;
  Status error(std::size_t at, std::string_view what) const {
    return Status::InvalidArgument(concat("grammar at ", place(at), ": ", what));
  }
  std::string helper(std::string_view kind, std::size_t at) const {
    return concat(rule_, "-", kind, "@", at);
  }
  bool at_end() const { return pos_ >= text_.size(); }
  std::string describe(std::size_t at) const;
  void skip_space();
  std::string_view name_at(std::size_t at) const;
  bool starts_rule(std::size_t at) const;
  RuleId reference(std::string_view name, std::size_t at);
  Status within_rule_bound(std::size_t at) const;

  Status parse_rule();
  Result<std::vector<Sequence>> parse_alternatives(int depth, std::size_t open);
  Result<Sequence> parse_sequence(int depth, std::size_t open);
  Result<std::uint32_t> parse_char();
  Result<Sequence> parse_literal();
  Result<Sequence> parse_class();
  Result<Sequence> parse_group(int depth);
  Result<Sequence> quantify(Sequence body);
  Result<std::pair<std::uint64_t, std::optional<std::uint64_t>>> parse_bounds();

  std::string_view text_;
  std::size_t pos_ = 0;
  GrammarLimits limits_;
  Grammar grammar_;
  Builder builder_;
  std::map<std::string, Named, std::less<>> named_;
  std::string rule_;  // the rule being read, for helpers' names
  std::optional<Sequence> any_char_;
};

// LINE:COLUMN, both from 1, the column in code points.
std::string GbnfParser::place(std::size_t at) const {
  at = std::min(at, text_.size());
  std::size_t line = 1;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < at; ++i) {
    if (text_[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  std::size_t column = 1;
  for (std::size_t i = line_start; i < at; ++i) {
    if (!is_continuation(static_cast<std::uint8_t>(text_[i]))) ++column;
  }
  return concat(line, ":", column);
}

std::string GbnfParser::describe(std::size_t at) const {
  if (at >= text_.size()) return "the end of the grammar";
  const int length = std::max(utf8_sequence(text_, at), 1);
  return show_codepoint(decode(text_, at, length));
}

// Blanks, newlines and # comments: a rule's end is found by the next `name ::=`, not by a
// line's end.
void GbnfParser::skip_space() {
  while (!at_end()) {
    const char c = text_[pos_];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++pos_;
    } else if (c == '#') {
      while (!at_end() && text_[pos_] != '\n') ++pos_;
    } else {
      return;
    }
  }
}

std::string_view GbnfParser::name_at(std::size_t at) const {
  std::size_t end = at;
  while (end < text_.size() && is_name_char(text_[end])) ++end;
  return text_.substr(at, end - at);
}

// Whether a name at `at` is followed by ::= (blanks and comments between).
bool GbnfParser::starts_rule(std::size_t at) const {
  std::size_t i = at + name_at(at).size();
  while (i < text_.size()) {
    const char c = text_[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
    } else if (c == '#') {
      while (i < text_.size() && text_[i] != '\n') ++i;
    } else {
      break;
    }
  }
  return text_.substr(i).starts_with("::=");
}

RuleId GbnfParser::reference(std::string_view name, std::size_t at) {
  auto it = named_.find(name);
  if (it == named_.end()) {
    // No helper name has an '@', so the user's name is kept as it is.
    it = named_.emplace(std::string(name), Named{grammar_.declare(name), at, std::nullopt}).first;
  }
  return it->second.id;
}

Status GbnfParser::within_rule_bound(std::size_t at) const {
  const std::size_t rules = grammar_.rules().size();
  if (rules <= limits_.max_rules) return Status::Ok();
  return Status::ResourceExhausted(
      concat("grammar at ", place(at), ": the grammar passes its bound of ", limits_.max_rules,
             " rules"),
      {rules, limits_.max_rules, limits_.max_rules});
}

Result<Grammar> GbnfParser::parse() {
  if (text_.size() > kMaxText) {
    return Status::ResourceExhausted(
        concat("grammar: the text is ", text_.size(), " bytes; at most ", kMaxText),
        {text_.size(), kMaxText, kMaxText});
  }
  for (std::size_t i = 0; i < text_.size();) {
    const int length = utf8_sequence(text_, i);
    if (length == 0) {
      return error(
          i, concat("invalid UTF-8 (byte ", show_byte(static_cast<std::uint8_t>(text_[i])), ")"));
    }
    i += static_cast<std::size_t>(length);
  }
  skip_space();
  while (!at_end()) KVVM_RETURN_IF_ERROR(parse_rule());

  // The first use of a rule never defined, as the place to name.
  const Named* undefined = nullptr;
  std::string_view undefined_name;
  for (const auto& [name, entry] : named_) {
    if (!entry.defined_at && (!undefined || entry.first_use < undefined->first_use)) {
      undefined = &entry;
      undefined_name = name;
    }
  }
  if (undefined) {
    return error(undefined->first_use, concat("rule '", undefined_name, "' is not defined"));
  }
  const auto root = named_.find("root");
  if (root == named_.end()) {
    return error(0, "no rule is named root (the rule a grammar starts from)");
  }
  grammar_.set_root(root->second.id);
  KVVM_RETURN_IF_ERROR(grammar_.check(limits_));
  return std::move(grammar_);
}

Status GbnfParser::parse_rule() {
  const std::size_t start = pos_;
  const std::string_view name = name_at(pos_);
  if (name.empty()) {
    return error(
        pos_, concat("expected a rule name (letters, digits, '-', '_'), found ", describe(pos_)));
  }
  pos_ += name.size();
  skip_space();
  if (!text_.substr(pos_).starts_with("::=")) {
    return error(pos_,
                 concat("expected '::=' after the rule name '", name, "', found ", describe(pos_)));
  }
  pos_ += 3;
  const RuleId id = reference(name, start);
  Named& entry = named_.find(name)->second;
  if (entry.defined_at) {
    return error(start, concat("rule '", name, "' is defined twice (first at ",
                               place(*entry.defined_at), ")"));
  }
  entry.defined_at = start;
  rule_ = std::string(name);
  KVVM_ASSIGN_OR_RETURN(std::vector<Sequence> alternatives, parse_alternatives(0, start));
  grammar_.define(id, std::move(alternatives));
  return within_rule_bound(start);
}

// Alternatives up to the end of the rule (depth 0) or the group's ')' (left unread).
Result<std::vector<Sequence>> GbnfParser::parse_alternatives(int depth, std::size_t open) {
  std::vector<Sequence> out;
  while (true) {
    KVVM_ASSIGN_OR_RETURN(Sequence sequence, parse_sequence(depth, open));
    out.push_back(std::move(sequence));
    if (at_end() || text_[pos_] != '|') return out;
    ++pos_;
  }
}

Result<Sequence> GbnfParser::parse_sequence(int depth, std::size_t open) {
  Sequence sequence;
  std::optional<std::size_t> last;  // where the item a postfix operator applies to starts
  while (true) {
    skip_space();
    const std::size_t at = pos_;
    if (at_end()) {
      if (depth > 0) return error(open, "unclosed '(': no ')' before the end of the grammar");
      return sequence;
    }
    const char c = text_[at];
    if (c == '|') return sequence;
    if (c == ')') {
      if (depth > 0) return sequence;
      return error(at, "a ')' that closes no '('");
    }
    Sequence item;
    if (is_name_char(c)) {
      const std::string_view name = name_at(at);
      if (starts_rule(at)) {
        if (depth > 0) {
          return error(open, concat("unclosed '(': rule '", name, "' starts at ", place(at),
                                    " before its ')'"));
        }
        return sequence;
      }
      pos_ += name.size();
      item = builder_.ref(reference(name, at));
    } else if (c == '"') {
      KVVM_ASSIGN_OR_RETURN(item, parse_literal());
    } else if (c == '[') {
      KVVM_ASSIGN_OR_RETURN(item, parse_class());
    } else if (c == '(') {
      KVVM_ASSIGN_OR_RETURN(item, parse_group(depth));
    } else if (c == '.') {
      ++pos_;
      // One rule for every '.', named for no single place.
      if (!any_char_) any_char_ = builder_.codepoints("any-char@", {{0, 0x10FFFF}});
      item = *any_char_;
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
      if (!last) return error(at, concat("'", c, "' follows nothing it could repeat"));
      Sequence body(sequence.begin() + static_cast<std::ptrdiff_t>(*last), sequence.end());
      sequence.resize(*last);
      KVVM_ASSIGN_OR_RETURN(Sequence repeated, quantify(std::move(body)));
      Builder::append(sequence, repeated);
      KVVM_RETURN_IF_ERROR(within_rule_bound(at));
      continue;
    } else if (text_.substr(at).starts_with("::=")) {
      return error(at, "'::=' without a rule name before it");
    } else {
      return error(at, concat("unexpected ", describe(at)));
    }
    last = sequence.size();
    Builder::append(sequence, item);
    KVVM_RETURN_IF_ERROR(within_rule_bound(at));
  }
}

Result<Sequence> GbnfParser::parse_group(int depth) {
  const std::size_t open = pos_;
  if (depth + 1 > kMaxNesting) {
    return Status::ResourceExhausted(
        concat("grammar at ", place(open), ": groups nested more than ", kMaxNesting, " deep"),
        {static_cast<std::uint64_t>(depth + 1), kMaxNesting, kMaxNesting});
  }
  ++pos_;
  KVVM_ASSIGN_OR_RETURN(std::vector<Sequence> alternatives, parse_alternatives(depth + 1, open));
  ++pos_;  // the ')'
  return builder_.any_of(helper("group", open), std::move(alternatives));
}

// One character of a literal or class: an escape or a UTF-8 code point.
Result<std::uint32_t> GbnfParser::parse_char() {
  const std::size_t at = pos_;
  if (text_[at] != '\\') {
    const int length = utf8_sequence(text_, at);  // well-formed: checked up front
    pos_ += static_cast<std::size_t>(length);
    return decode(text_, at, length);
  }
  if (at + 1 >= text_.size()) return error(at, "a '\\' at the end of the grammar");
  const char e = text_[at + 1];
  pos_ += 2;
  switch (e) {
    case 'n':
      return std::uint32_t{'\n'};
    case 't':
      return std::uint32_t{'\t'};
    case 'r':
      return std::uint32_t{'\r'};
    case '\\':
    case '"':
    case '[':
    case ']':
    case '-':
    case '^':
      return static_cast<std::uint32_t>(e);
    case 'x':
    case 'u':
    case 'U': {
      const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
      std::uint32_t cp = 0;
      for (int i = 0; i < digits; ++i) {
        const char h = at_end() ? '\0' : text_[pos_];
        int v = -1;
        if (h >= '0' && h <= '9') v = h - '0';
        if (h >= 'a' && h <= 'f') v = h - 'a' + 10;
        if (h >= 'A' && h <= 'F') v = h - 'A' + 10;
        if (v < 0) {
          return error(at, concat("bad escape '\\", e, "': it takes ", digits,
                                  " hex digits, found ", describe(pos_)));
        }
        cp = cp * 16 + static_cast<std::uint32_t>(v);
        ++pos_;
      }
      if (cp >= 0xD800 && cp <= 0xDFFF) {
        return error(at, concat("bad escape '", text_.substr(at, pos_ - at),
                                "': a surrogate is not a character"));
      }
      if (cp > 0x10FFFF) {
        return error(at, concat("bad escape '", text_.substr(at, pos_ - at),
                                "': past U+10FFFF, the last code point"));
      }
      return cp;
    }
    default: {
      const int length = std::max(utf8_sequence(text_, at + 1), 1);
      pos_ = at + 1 + static_cast<std::size_t>(length);
      return error(at, concat("bad escape '\\", text_.substr(at + 1, length),
                              "' (escapes: \\n \\t \\r \\\\ \\\" \\[ \\] \\- \\^ \\xHH "
                              "\\uHHHH \\UHHHHHHHH)"));
    }
  }
}

Result<Sequence> GbnfParser::parse_literal() {
  const std::size_t open = pos_;
  ++pos_;
  std::string bytes;
  while (true) {
    // A literal ends on its line: a missing quote is reported where the literal opened, not
    // lines later where some other literal's quote closes it.
    if (at_end() || text_[pos_] == '\n') {
      return error(open, "unterminated literal: no closing '\"' on its line");
    }
    if (text_[pos_] == '"') break;
    KVVM_ASSIGN_OR_RETURN(const std::uint32_t cp, parse_char());
    tokenizer::detail::utf8_append(bytes, static_cast<char32_t>(cp));
  }
  ++pos_;
  return builder_.literal(bytes);
}

Result<Sequence> GbnfParser::parse_class() {
  const std::size_t open = pos_;
  ++pos_;
  const bool negate = !at_end() && text_[pos_] == '^';
  if (negate) ++pos_;
  std::vector<CodepointRange> ranges;
  const auto unterminated = [&] {
    return error(open, "unterminated class: no closing ']' on its line");
  };
  while (true) {
    if (at_end() || text_[pos_] == '\n') return unterminated();
    if (text_[pos_] == ']') break;
    const std::size_t item = pos_;
    KVVM_ASSIGN_OR_RETURN(const std::uint32_t lo, parse_char());
    std::uint32_t hi = lo;
    // '-' makes a range between two characters; first or last it is itself.
    if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
      ++pos_;
      if (text_[pos_] == '\n') return unterminated();
      KVVM_ASSIGN_OR_RETURN(hi, parse_char());
      if (hi < lo) {
        return error(item, concat("a reversed range in a class: ", show_codepoint(lo), "-",
                                  show_codepoint(hi)));
      }
    }
    ranges.push_back({lo, hi});
  }
  ++pos_;
  if (ranges.empty() && !negate) return error(open, "an empty class [] matches nothing");
  return builder_.codepoints(helper("class", open), std::move(ranges), negate);
}

// {m}, {m,}, {m,n} (and {,n}: at most n), the '{' at pos_.
Result<std::pair<std::uint64_t, std::optional<std::uint64_t>>> GbnfParser::parse_bounds() {
  const std::size_t open = pos_;
  ++pos_;
  const auto blanks = [&] {
    while (!at_end() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  };
  const auto number = [&]() -> std::optional<std::uint64_t> {
    if (at_end() || text_[pos_] < '0' || text_[pos_] > '9') return std::nullopt;
    std::uint64_t v = 0;
    for (; !at_end() && text_[pos_] >= '0' && text_[pos_] <= '9'; ++pos_) {
      v = std::min(kMaxCount, v * 10 + static_cast<std::uint64_t>(text_[pos_] - '0'));
    }
    return v;
  };
  const auto bad = [&](std::string_view what) {
    const std::size_t close = text_.find('}', open);
    const std::string_view written =
        close == std::string_view::npos ||
                text_.substr(open, close - open).find('\n') != std::string_view::npos
            ? std::string_view("{")
            : text_.substr(open, close - open + 1);
    return error(open, concat("bad repetition bounds '", written, "': ", what));
  };
  blanks();
  const std::optional<std::uint64_t> min = number();
  blanks();
  if (at_end() || (text_[pos_] != ',' && text_[pos_] != '}')) {
    return bad(min ? "expected ',' or '}' after the number" : "expected a number");
  }
  if (text_[pos_] == '}') {
    if (!min) return bad("no count given");
    ++pos_;
    return std::pair{*min, std::optional<std::uint64_t>(*min)};
  }
  ++pos_;  // ','
  blanks();
  const std::optional<std::uint64_t> max = number();
  blanks();
  if (at_end() || text_[pos_] != '}') return bad("expected a number or '}'");
  ++pos_;
  if (!min && !max) return bad("no count given");
  if (min && max && *max < *min) {
    return bad(concat("the most, ", *max, ", is fewer than the least, ", *min));
  }
  return std::pair{min.value_or(0), max};
}

// The postfix operator at pos_ applied to `body`.
Result<Sequence> GbnfParser::quantify(Sequence body) {
  const std::size_t at = pos_;
  const char op = text_[at];
  std::uint64_t min = 0;
  std::optional<std::uint64_t> max;
  if (op == '{') {
    KVVM_ASSIGN_OR_RETURN(std::tie(min, max), parse_bounds());
  } else {
    ++pos_;
    min = op == '+' ? 1 : 0;
    if (op == '?') max = 1;
  }
  if (body.empty()) return body;  // nothing repeated is nothing
  // A body of several elements becomes one rule, so copies cost one element each and stacked
  // operators (x+)+ do not double the grammar at every level.
  if (body.size() > 1) body = builder_.ref(grammar_.add(helper("item", at), {std::move(body)}));
  switch (op) {
    case '*':
      return builder_.star(helper("star", at), body);
    case '+':
      return builder_.plus(helper("plus", at), body);
    case '?':
      return builder_.optional(helper("opt", at), body);
    default: {
      Result<Sequence> repeated = builder_.repeat(helper("repeat", at), body, min, max);
      if (!repeated.ok()) return repeated.status().with_context(concat("grammar at ", place(at)));
      return repeated;
    }
  }
}

}  // namespace

Result<Grammar> grammar_from_gbnf(std::string_view text, const GrammarLimits& limits) {
  return GbnfParser(text, limits).parse();
}

}  // namespace kvvm::grammar
