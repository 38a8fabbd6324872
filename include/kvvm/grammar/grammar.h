// Grammar: a context-free grammar over bytes, the one form every constraint compiles to (JSON
// Schema, regular expressions, GBNF text, choice lists; kvvm/grammar/constraint.h) before the
// matcher walks it as a pushdown automaton (kvvm/grammar/matcher.h).
//
// A rule is a list of alternatives; an alternative a sequence of elements; an element a set of
// bytes (one byte of input) or a reference to a rule. Repetition is a rule that refers to itself
// at its end (R ::= x R | ""), which the matcher runs without growing its stack (a reference
// in last place replaces its caller's frame). Left recursion (a rule reaching itself before
// consuming a byte, other than in last place) has no pushdown run and is refused by check().
//
// Bytes, not characters: a character class over Unicode is its UTF-8 sequences (builder.h's
// codepoints()), so the matcher never decodes, and a token's bytes are fed as they are.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "kvvm/base/status.h"

namespace kvvm::grammar {

using RuleId = std::uint32_t;

// 256 bits: the bytes one element accepts.
struct ByteSet {
  std::array<std::uint64_t, 4> words{};

  static ByteSet of(std::uint8_t byte) {
    ByteSet set;
    set.add(byte);
    return set;
  }
  static ByteSet of_bytes(std::string_view bytes) {
    ByteSet set;
    for (const char c : bytes) set.add(static_cast<std::uint8_t>(c));
    return set;
  }
  static ByteSet range(std::uint8_t lo, std::uint8_t hi) {
    ByteSet set;
    set.add_range(lo, hi);
    return set;
  }
  void add(std::uint8_t byte) { words[byte >> 6] |= std::uint64_t{1} << (byte & 63); }
  void add_range(std::uint8_t lo, std::uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) add(static_cast<std::uint8_t>(b));
  }
  void add(const ByteSet& other) {
    for (int i = 0; i < 4; ++i) words[i] |= other.words[i];
  }
  bool has(std::uint8_t byte) const { return (words[byte >> 6] >> (byte & 63)) & 1; }
  bool empty() const { return (words[0] | words[1] | words[2] | words[3]) == 0; }
  int count() const;
  ByteSet complement() const;
  bool operator==(const ByteSet&) const = default;
};

struct Element {
  enum class Kind : std::uint8_t { kBytes, kRule };
  Kind kind = Kind::kBytes;
  std::uint32_t index = 0;  // a byte set of the grammar (kBytes) or a rule (kRule)
  bool operator==(const Element&) const = default;
};
using Sequence = std::vector<Element>;

struct Rule {
  std::string name;  // in messages and in to_string(); unique within a grammar
  std::vector<Sequence> alternatives;
  bool defined = false;
};

// What one grammar may grow to: a schema, a pattern or a grammar text past these is refused
// (ResourceExhausted naming the bound) instead of compiling for minutes or without memory.
struct GrammarLimits {
  std::uint32_t max_rules = 1u << 16;
  std::uint32_t max_elements = 1u << 20;  // every alternative's elements, summed
};

class Grammar {
 public:
  // A rule to be defined later (a reference before its definition: recursion, GBNF's order).
  // The name is made unique with a numeric suffix when taken.
  RuleId declare(std::string_view name);
  // Sets a declared rule's alternatives (once). An empty alternative matches the empty string.
  void define(RuleId rule, std::vector<Sequence> alternatives);
  RuleId add(std::string_view name, std::vector<Sequence> alternatives) {
    const RuleId rule = declare(name);
    define(rule, std::move(alternatives));
    return rule;
  }
  // The index of `set` among the grammar's byte sets (each distinct set stored once).
  std::uint32_t intern(const ByteSet& set);
  void set_root(RuleId rule) { root_ = rule; }

  // OK, or InvalidArgument naming the rule: no root, a rule referenced but never defined, an
  // element naming no set or rule, a rule that matches no string at all (the grammar's
  // language would be empty where it is used), left recursion. ResourceExhausted past
  // `limits`. The matcher requires a grammar that passed.
  Status check(const GrammarLimits& limits = {}) const;

  RuleId root() const { return root_; }
  const std::vector<Rule>& rules() const { return rules_; }
  const std::vector<ByteSet>& byte_sets() const { return byte_sets_; }
  const Rule& rule(RuleId id) const { return rules_[id]; }
  std::size_t element_count() const;
  std::string_view name(RuleId id) const { return rules_[id].name; }
  // Which rules can match the empty string.
  std::vector<bool> nullable() const;

  // GBNF-like text for messages and tests: one rule a line, the root named root, byte sets as
  // [...] of bytes (\xNN past ASCII: bytes, where GBNF's classes are code points).
  std::string to_string() const;
  // A hash of the rules as written (names excluded), for caches keyed by content.
  std::uint64_t fingerprint() const;

 private:
  std::vector<Rule> rules_;
  std::vector<ByteSet> byte_sets_;
  // What declare(), intern() and element_count() look up, so that none is a scan: a grammar
  // text of tens of thousands of rules or classes would cost seconds to quadratic scans.
  std::unordered_set<std::string> names_;
  std::map<std::array<std::uint64_t, 4>, std::uint32_t> set_index_;
  std::size_t elements_ = 0;  // kept as rules are defined
  RuleId root_ = ~RuleId{0};
};

}  // namespace kvvm::grammar
