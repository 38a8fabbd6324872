// The rules of JSON text itself (RFC 8259): any value, strings with their escapes, numbers,
// integers, and the whitespace between tokens. Shared by the JSON Schema compiler and the
// json_object grammar, each built once per grammar and referenced wherever a schema leaves a
// place unconstrained.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "grammar/builder.h"
#include "kvvm/grammar/constraint.h"

namespace kvvm::grammar {

// Flexible whitespace runs longer than this are cut to it: a run of n costs n nested rules.
inline constexpr std::uint32_t kMaxWhitespaceRun = 256;

class JsonValues {
 public:
  JsonValues(Builder& builder, const JsonWhitespace& whitespace);

  // Whitespace between two tokens: nothing when compact, [ \t\n]{0,max_run} when flexible.
  Sequence ws();
  // Any JSON value (objects and arrays nest through this rule).
  Sequence value();
  // Any JSON object.
  Sequence object();
  // A whole JSON string, quotes included.
  Sequence string();
  // One character of a string's contents, as it decodes: a code point written as itself (not
  // '"', '\' or a control character), a two-character escape, \uXXXX of a code point outside
  // the surrogates, or a \uXXXX\uXXXX surrogate pair. Lone surrogates are not allowed: they
  // are no character, and many parsers refuse them.
  Sequence string_char();
  // One character that needs no escape, written as itself.
  Sequence plain_char();
  // Any JSON number, and any integer (-?(0|[1-9][0-9]*)).
  Sequence number();
  Sequence integer();
  // A digit, and a run of one or more digits.
  Sequence digit();
  Sequence digits();

  // "{" ... "}" and "[" ... "]" around a list of items, whitespace where JSON allows it:
  // `items` must end before the closing bracket's whitespace (the item rules put ws() after
  // each item, so `items` is built from item() and comma()).
  Sequence comma();  // "," then whitespace
  // (item ("," ws item)*)?: any number of items.
  Sequence list(std::string_view name, const Sequence& item);
  Builder& builder() { return b_; }

 private:
  RuleId lazy(std::optional<RuleId>& slot, std::string_view name);

  Builder& b_;
  JsonWhitespace whitespace_;
  std::optional<RuleId> ws_, value_, object_, array_, string_, char_, plain_, number_, integer_,
      digits_;
};

}  // namespace kvvm::grammar
