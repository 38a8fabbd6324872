#include "grammar/token_walk.h"

#include <algorithm>
#include <string_view>

namespace kvvm::grammar::detail {

namespace {

std::size_t common_prefix(std::string_view a, std::string_view b) {
  const std::size_t n = std::min(a.size(), b.size());
  std::size_t k = 0;
  while (k < n && a[k] == b[k]) ++k;
  return k;
}

}  // namespace

void walk_tokens(Runner& runner, const State& start, const Vocabulary& vocabulary,
                 std::span<const TokenId> tokens, std::span<const std::uint16_t> shared,
                 const WalkOut& out) {
  // levels[k]: the state after the first k bytes of the current prefix; unknown[k]: some level
  // up to k ran off the bottom.
  thread_local std::vector<State> levels;
  thread_local std::vector<std::uint8_t> unknown;
  if (levels.empty()) levels.resize(1);
  levels[0] = start;
  unknown.assign(1, start.unknown ? 1 : 0);
  std::size_t valid = 0;  // levels[0..valid] hold the previous token's prefix
  std::string_view previous;
  const auto record = [&out](TokenId t, bool accepted, bool uncertain) {
    if (accepted) {
      if (out.accepted_words) {
        (*out.accepted_words)[static_cast<std::size_t>(t) >> 5] |= 1u << (t & 31);
      }
      if (out.accepted) out.accepted->push_back(t);
    } else if (uncertain && out.uncertain) {
      out.uncertain->push_back(t);
    }
  };
  for (std::size_t i = 0; i < tokens.size();) {
    const TokenId t = tokens[i];
    const std::string_view bytes = vocabulary.bytes(t);
    const std::size_t share =
        i == 0 ? 0 : (shared.empty() ? common_prefix(previous, bytes) : shared[i]);
    std::size_t depth = std::min(share, valid);
    previous = bytes;
    bool dead = false;
    while (depth < bytes.size()) {
      if (levels.size() < depth + 2) levels.resize(depth + 2);
      if (unknown.size() < depth + 2) unknown.resize(depth + 2);
      runner.advance(levels[depth], static_cast<std::uint8_t>(bytes[depth]), levels[depth + 1]);
      unknown[depth + 1] = unknown[depth] | (levels[depth + 1].unknown ? 1 : 0);
      ++depth;
      if (levels[depth].tops.empty()) {
        dead = true;
        break;
      }
    }
    valid = depth;
    if (!dead) {
      record(t, levels[depth].alive(), false);
      ++i;
      continue;
    }
    // No stack survives the first `depth` bytes: the same for every token after this one that
    // starts with them. Accepted only when they are the token's whole bytes and the grammar
    // matched at their end.
    const bool whole = depth == bytes.size();
    record(t, whole && levels[depth].accepting, unknown[depth] != 0);
    const bool uncertain = unknown[depth] != 0;
    ++i;
    while (i < tokens.size()) {
      const std::string_view next = vocabulary.bytes(tokens[i]);
      const std::size_t s = shared.empty() ? common_prefix(previous, next) : shared[i];
      if (s < depth) break;
      // A token of the same bytes (ids can share them) gets the same verdict.
      record(tokens[i], next.size() == depth && whole && levels[depth].accepting, uncertain);
      previous = next;
      ++i;
    }
    valid = depth - 1;  // levels[depth] is dead: a later token recomputes from depth - 1
  }
}

}  // namespace kvvm::grammar::detail
