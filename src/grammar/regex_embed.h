// A regular expression's rules written into another front end's grammar: a JSON Schema
// "pattern" becomes part of the string it constrains. Implemented by the regular-expression
// front end (grammar_from_regex in kvvm/grammar/constraint.h), which shares its parser.
#pragma once

#include <string_view>

#include "grammar/builder.h"
#include "kvvm/base/status.h"

namespace kvvm::grammar {

// The language of `pattern` (the syntax grammar_from_regex reads, matched whole: ^ and $ at
// its ends are accepted and change nothing), as a Sequence over rules added through `builder`
// to its grammar. Refusals are InvalidArgument / ResourceExhausted messages that start with
// `where` (the caller's place, e.g. "schema at /properties/a: pattern") and name the offset.
Result<Sequence> embed_regex(Builder& builder, std::string_view pattern, std::string_view where);

}  // namespace kvvm::grammar
