// What a pre-tokenizer's split does with the stretches its pattern matches (Hugging Face's
// SplitDelimiterBehavior), shared by Split (a regex) and the character-class pre-tokenizers
// (Digits, Punctuation, Whitespace, WhitespaceSplit, Metaspace).
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace kvvm::tokenizer::detail {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Segment {
  std::size_t begin;
  std::size_t end;
  bool is_match;
};

// The "behavior" member of `json`: Removed, Isolated, MergedWithPrevious, MergedWithNext or
// Contiguous; `fallback` when absent (nullopt: required).
Result<Behavior> parse_behavior(const Json& json, std::string_view where,
                                std::optional<Behavior> fallback = std::nullopt);

// Folds alternating matched / unmatched segments into pieces as `behavior` says, the way
// Hugging Face's NormalizedString::split does (a Removed match is dropped).
std::vector<Segment> apply_behavior(std::vector<Segment> in, Behavior behavior);

// Segments a character predicate makes: each matching character alone, the runs between them
// whole, as Hugging Face's Pattern for Fn(char) -> bool does. A byte that is not well-formed
// UTF-8 is one character that matches nothing.
template <typename Predicate>
std::vector<Segment> char_segments(std::string_view text, Predicate matches) {
  std::vector<Segment> out;
  std::size_t run = 0;  // where the current unmatched run began
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = utf8_length(text, i);
    const bool hit = length != 0 && matches(utf8_decode(text, i, length));
    const std::size_t next = i + (length == 0 ? 1 : length);
    if (hit) {
      if (run < i) out.push_back({run, i, false});
      out.push_back({i, next, true});
      run = next;
    }
    i = next;
  }
  if (run < text.size()) out.push_back({run, text.size(), false});
  return out;
}

// Replaces every piece by the pieces `segment` and `behavior` make of it (empty ones dropped);
// a piece keeps `at_start` only when it begins its parent at byte 0 of one that had it.
template <typename Segmenter>
void split_pieces(std::vector<PreToken>& pieces, Behavior behavior, Segmenter segment) {
  std::vector<PreToken> out;
  out.reserve(pieces.size());
  for (const PreToken& piece : pieces) {
    for (const Segment& s : apply_behavior(segment(std::string_view(piece.text)), behavior)) {
      if (s.end > s.begin) {
        out.push_back(
            {piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
      }
    }
  }
  pieces = std::move(out);
}

}  // namespace kvvm::tokenizer::detail
