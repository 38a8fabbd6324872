// Builder: the combinators every front end (JSON Schema, regex, GBNF, choices) writes its
// grammar with. An expression is a Sequence; alternatives, options and repetitions become rules
// of their own named after the front end's place (a schema path, a pattern offset), so a
// refused grammar's message names where the trouble is.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/grammar/grammar.h"

namespace kvvm::grammar {

// An inclusive range of Unicode code points.
struct CodepointRange {
  std::uint32_t lo = 0;
  std::uint32_t hi = 0;
};

class Builder {
 public:
  explicit Builder(Grammar& grammar, GrammarLimits limits = {})
      : grammar_(grammar), limits_(limits) {}

  Grammar& grammar() { return grammar_; }

  // The bytes of `text`, one element each.
  Sequence literal(std::string_view text);
  Sequence bytes(const ByteSet& set);
  Sequence ref(RuleId rule) const { return {Element{Element::Kind::kRule, rule}}; }
  static Sequence cat(std::initializer_list<Sequence> parts);
  static void append(Sequence& to, const Sequence& part) {
    to.insert(to.end(), part.begin(), part.end());
  }

  // One of `options`: a rule named `name` (the option itself when there is one).
  Sequence any_of(std::string_view name, std::vector<Sequence> options);
  Sequence optional(std::string_view name, const Sequence& body);
  // body*, and body+.
  Sequence star(std::string_view name, const Sequence& body);
  Sequence plus(std::string_view name, const Sequence& body);
  // body{min,max} (max nullopt: unbounded) as `min` copies then nested options, so that no
  // string has two parses. ResourceExhausted naming `name` when the copies would pass the
  // limits' element bound.
  Result<Sequence> repeat(std::string_view name, const Sequence& body, std::uint64_t min,
                          std::optional<std::uint64_t> max);
  // body (separator body){min - 1, max - 1}: a list of at least `min` items (0 allowed).
  Result<Sequence> separated(std::string_view name, const Sequence& body, const Sequence& separator,
                             std::uint64_t min, std::optional<std::uint64_t> max);

  // One UTF-8 encoded code point in any of `ranges` (surrogates never: they are not UTF-8);
  // `negate`: one outside all of them. A rule named `name` whose alternatives are the
  // minimal byte-range sequences (as a UTF-8 decoder's automaton splits them).
  Sequence codepoints(std::string_view name, std::vector<CodepointRange> ranges,
                      bool negate = false);
  // Any one UTF-8 encoded code point.
  Sequence any_codepoint();

  // Elements so far against the limits: ResourceExhausted naming `where` when past.
  Status check_size(std::string_view where) const;

 private:
  Grammar& grammar_;
  GrammarLimits limits_;
  std::optional<RuleId> any_codepoint_;
};

// The ranges sorted and merged, surrogates (U+D800..U+DFFF) and anything past U+10FFFF removed;
// with `negate`, their complement within the code points instead.
std::vector<CodepointRange> normalize_ranges(std::vector<CodepointRange> ranges, bool negate);

}  // namespace kvvm::grammar
