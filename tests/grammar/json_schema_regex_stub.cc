// A small stand-in for embed_regex (grammar/regex_embed.h) in the JSON Schema tests' build
// only, until the regular-expression front end provides it: literals, escapes (\d \w \s and
// escaped punctuation), ., [...] classes over ASCII and their negations, groups ((...),
// (?:...)), | and the quantifiers ? * + {m} {m,} {m,n}. Nothing here ships.
#include <string>

#include "grammar/regex_embed.h"
#include "grammar/text.h"

namespace kvvm::grammar {

namespace {

class StubRegex {
 public:
  StubRegex(Builder& b, std::string_view p, std::string_view where) : b_(b), p_(p), where_(where) {}

  Result<Sequence> parse() {
    KVVM_ASSIGN_OR_RETURN(Sequence out, alternation());
    if (pos_ != p_.size()) return error("unexpected character");
    return out;
  }

 private:
  Status error(std::string_view what) {
    return Status::InvalidArgument(concat(where_, " at offset ", pos_, ": ", what));
  }
  bool more() const { return pos_ < p_.size(); }

  Result<Sequence> alternation() {
    std::vector<Sequence> options;
    KVVM_ASSIGN_OR_RETURN(Sequence first, concatenation());
    options.push_back(std::move(first));
    while (more() && p_[pos_] == '|') {
      ++pos_;
      KVVM_ASSIGN_OR_RETURN(Sequence next, concatenation());
      options.push_back(std::move(next));
    }
    return b_.any_of("regex-alt", std::move(options));
  }

  Result<Sequence> concatenation() {
    Sequence out;
    while (more() && p_[pos_] != '|' && p_[pos_] != ')') {
      KVVM_ASSIGN_OR_RETURN(Sequence atom_seq, atom());
      KVVM_ASSIGN_OR_RETURN(Sequence quantified, quantifier(atom_seq));
      Builder::append(out, quantified);
    }
    return out;
  }

  Result<Sequence> quantifier(const Sequence& atom) {
    if (!more()) return atom;
    const char c = p_[pos_];
    if (c == '?') return ++pos_, b_.optional("regex-opt", atom);
    if (c == '*') return ++pos_, b_.star("regex-star", atom);
    if (c == '+') return ++pos_, b_.plus("regex-plus", atom);
    if (c != '{') return atom;
    ++pos_;
    const std::uint64_t min = number();
    std::optional<std::uint64_t> max = min;
    if (more() && p_[pos_] == ',') {
      ++pos_;
      max = more() && p_[pos_] != '}' ? std::optional<std::uint64_t>(number()) : std::nullopt;
    }
    if (!more() || p_[pos_] != '}') return error("bad {}");
    ++pos_;
    return b_.repeat("regex-repeat", atom, min, max);
  }

  std::uint64_t number() {
    std::uint64_t n = 0;
    while (more() && p_[pos_] >= '0' && p_[pos_] <= '9') n = n * 10 + (p_[pos_++] - '0');
    return n;
  }

  static ByteSet class_escape(char c, bool& ok) {
    ok = true;
    ByteSet set;
    if (c == 'd') {
      set.add_range('0', '9');
    } else if (c == 'w') {
      set.add_range('0', '9');
      set.add_range('a', 'z');
      set.add_range('A', 'Z');
      set.add('_');
    } else if (c == 's') {
      for (char s : std::string(" \t\n\r\f\v")) set.add(s);
    } else if (c == 'n') {
      set.add('\n');
    } else if (c == 't') {
      set.add('\t');
    } else if (!std::isalnum(static_cast<unsigned char>(c))) {
      set.add(c);
    } else {
      ok = false;
    }
    return set;
  }

  Result<Sequence> atom() {
    const char c = p_[pos_++];
    if (c == '(') {
      if (p_.substr(pos_, 2) == "?:") pos_ += 2;
      KVVM_ASSIGN_OR_RETURN(Sequence inner, alternation());
      if (!more() || p_[pos_] != ')') return error("unclosed group");
      ++pos_;
      return inner;
    }
    if (c == '.') return b_.codepoints("regex-dot", {{'\n', '\n'}}, true);
    if (c == '\\') {
      if (!more()) return error("trailing backslash");
      bool ok = false;
      const ByteSet set = class_escape(p_[pos_++], ok);
      if (!ok) return error("escape not in the stub");
      return b_.bytes(set);
    }
    if (c == '[') {
      bool negate = more() && p_[pos_] == '^';
      if (negate) ++pos_;
      std::vector<CodepointRange> ranges;
      while (more() && p_[pos_] != ']') {
        char lo = p_[pos_++];
        if (lo == '\\') {
          bool ok = false;
          const ByteSet set = class_escape(p_[pos_++], ok);
          if (!ok) return error("escape not in the stub");
          for (unsigned b = 0; b < 128; ++b) {
            if (set.has(b)) ranges.push_back({b, b});
          }
          continue;
        }
        char hi = lo;
        if (pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
          hi = p_[pos_ + 1];
          pos_ += 2;
        }
        ranges.push_back({static_cast<unsigned char>(lo), static_cast<unsigned char>(hi)});
      }
      if (!more()) return error("unclosed class");
      ++pos_;
      return b_.codepoints("regex-class", ranges, negate);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{' || c == ')' || c == '^' || c == '$') {
      --pos_;
      return error("not in the stub");
    }
    return b_.literal(std::string(1, c));
  }

  Builder& b_;
  std::string_view p_;
  std::string where_;
  std::size_t pos_ = 0;
};

}  // namespace

Result<Sequence> embed_regex(Builder& builder, std::string_view pattern, std::string_view where) {
  return StubRegex(builder, pattern, where).parse();
}

}  // namespace kvvm::grammar
