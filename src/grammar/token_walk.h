// A walk over tokens sorted by their bytes, as over their trie: each token's bytes are run from
// a state, the states along the previous token's bytes reused for the prefix they share, and a
// prefix no stack survives skips every token that starts with it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "grammar/pushdown.h"
#include "kvvm/grammar/vocabulary.h"

namespace kvvm::grammar::detail {

struct WalkOut {
  // Accepted tokens: bits set in `accepted_words` when given, ids appended to `accepted` when
  // given. Tokens whose bytes ran off a partial stack's bottom (State::unknown) without being
  // accepted: appended to `uncertain` (never null when the start state's stacks are partial).
  std::vector<std::uint32_t>* accepted_words = nullptr;
  std::vector<TokenId>* accepted = nullptr;
  std::vector<TokenId>* uncertain = nullptr;
};

// `tokens` sorted by bytes; `shared[i]` the prefix token i shares with token i - 1 (empty:
// measured here).
void walk_tokens(Runner& runner, const State& start, const Vocabulary& vocabulary,
                 std::span<const TokenId> tokens, std::span<const std::uint16_t> shared,
                 const WalkOut& out);

}  // namespace kvvm::grammar::detail
