// What the answer parsers (tool calls, reasoning) share when they read a model's text as it
// streams: JSON's blanks, text that may still open a tag, and a character's incomplete UTF-8
// held until its last byte comes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

#include "tokenizer/utf8.h"

namespace kvvm::server::detail {

// The blanks JSON allows between tokens.
inline bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
inline bool all_blank(std::string_view text) {
  return std::all_of(text.begin(), text.end(), is_blank);
}
inline std::size_t leading_blanks(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size() && is_blank(text[i])) ++i;
  return i;
}

// The longest end of `text` that is a proper prefix of `tag`: text that may still open it.
inline std::size_t tag_prefix_at_end(std::string_view text, std::string_view tag) {
  for (std::size_t k = std::min(text.size(), tag.size() - 1); k > 0; --k) {
    if (text.substr(text.size() - k) == tag.substr(0, k)) return k;
  }
  return 0;
}

// Puts what `held` kept back in front of `text`, then, unless `at_end`, moves `text`'s
// incomplete last character into `held`: a delta is whole characters only.
inline void hold_partial_utf8(std::string& text, std::string& held, bool at_end) {
  if (held.empty() && text.empty()) return;
  text.insert(0, held);
  held.clear();
  if (at_end) return;
  const std::size_t whole = tokenizer::detail::utf8_complete_prefix(text);
  held = text.substr(whole);
  text.resize(whole);
}

}  // namespace kvvm::server::detail
