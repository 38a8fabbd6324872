// The regular expressions of JSON Schema's `pattern` (ECMAScript syntax, as in unicode mode),
// read into a small tree of what they match. Reading first and building after keeps every
// syntax refusal ahead of any grammar work, and leaves regex_source.cc only the tree to compile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/builder.h"
#include "kvvm/base/status.h"

namespace kvvm::grammar {

struct RegexNode {
  enum class Kind : std::uint8_t {
    kLiteral,      // `text` (UTF-8), character for character
    kClass,        // one code point of `ranges`
    kSequence,     // `children` in order (none: the empty string)
    kAlternation,  // one of `children`
    kRepeat,       // children[0] from `min` to `max` times
  };
  Kind kind = Kind::kSequence;
  std::size_t offset = 0;  // the pattern's byte the construct starts at (a quantifier's own)
  std::string text;
  std::vector<CodepointRange> ranges;  // normalized (normalize_ranges), never empty
  std::vector<RegexNode> children;
  std::uint64_t min = 0;
  std::optional<std::uint64_t> max;  // nullopt: unbounded
};

// Groups nested deeper than this are refused (ResourceExhausted) rather than recursed into.
inline constexpr int kMaxRegexDepth = 256;

// `pattern` as a tree, a ^ at the start and a $ at the end of the whole (or of one of its top
// alternatives) dropped: the pattern is matched whole anyway. InvalidArgument
// "<label> at byte N: ..." for what ECMAScript refuses in unicode mode, for invalid UTF-8, and,
// by name, for what a grammar does not match (lookaround, backreferences, \b \B, anchors
// inside, property escapes, inline modifiers, a class or lone surrogate matching nothing).
Result<RegexNode> parse_regex(std::string_view pattern, std::string_view label = "regex");

}  // namespace kvvm::grammar
