// fill_token_mask: a grammar's allowed tokens with the request's own ends.
#include "token_mask.h"

#include <algorithm>

namespace kvvm::engine {

void fill_token_mask(RequestState& r, std::span<std::uint32_t> row) {
  grammar::Matcher& m = *r.matcher;
  const std::size_t words = m.grammar().vocabulary().mask_words();
  std::fill(row.begin() + static_cast<std::ptrdiff_t>(words), row.end(), 0u);
  m.fill_mask(row.first(words));
  const auto set = [&row](std::int32_t t, bool on) {
    const std::size_t w = static_cast<std::size_t>(t) >> 5;
    if (w >= row.size()) return;
    if (on) {
      row[w] |= 1u << (t & 31);
    } else {
      row[w] &= ~(1u << (t & 31));
    }
  };
  for (const std::int32_t end : m.grammar().vocabulary().ends()) set(end, false);
  if (m.can_end()) {
    for (const std::int32_t end : r.ends) set(end, true);
  }
  for (const std::uint32_t word : row) {
    if (word != 0) return;
  }
  if (!r.ends.empty()) {
    set(r.ends.front(), true);
  } else {
    set(0, true);
  }
}

}  // namespace kvvm::engine
