// A second, independent reading of a Grammar for tests: an Earley recognizer (whole strings and
// viable prefixes, any context-free grammar, nothing shared with the matcher's pushdown run)
// and a random sampler of the grammar's strings.
#pragma once

#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "kvvm/grammar/grammar.h"

namespace kvvm::grammar::testing {

// Whether `text` is in the grammar's language.
bool oracle_accepts(const Grammar& grammar, std::string_view text);
// Whether some string of the language starts with `text`.
bool oracle_viable(const Grammar& grammar, std::string_view text);
// A random string of the language: alternatives drawn uniformly until `depth` nested rules,
// the shortest way out after; nullopt only when the sample passes `max_bytes`.
std::optional<std::string> oracle_sample(const Grammar& grammar, std::mt19937_64& rng,
                                         int depth = 12, std::size_t max_bytes = 1 << 16);

}  // namespace kvvm::grammar::testing
