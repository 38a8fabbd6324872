// tokenizer.json's "added_tokens": matched in the text before anything else splits it, the
// longest at the leftmost position. Those with normalized=false are matched in the raw text,
// the others in the normalised text (their content normalised the same way), as Hugging Face
// does. lstrip / rstrip absorb the white space beside a match; single_word refuses a match
// with a word character beside it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"

namespace kvvm::tokenizer::detail {

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// A stretch of text: an added token's match (token >= 0, an index into the matcher's
// tokens) or plain text between matches (token < 0).
struct TextPiece {
  std::size_t begin = 0;
  std::size_t end = 0;
  int token = -1;
};

// A byte trie over the contents of some added tokens.
class AddedTokenMatcher {
 public:
  // `content` is what is searched for (the normalised content for a normalized token).
  void add(const AddedToken& token, std::string content);
  bool empty() const { return tokens_.empty(); }
  const AddedToken& token(int index) const { return tokens_[static_cast<std::size_t>(index)]; }

  // The pieces covering all of `text`, in order; no piece is empty.
  std::vector<TextPiece> split(std::string_view text) const;

 private:
  // The index of the longest token whose content starts at text[i], or -1.
  int longest_at(std::string_view text, std::size_t i, std::size_t& end) const;
  bool accepts(const AddedToken& token, std::string_view text, std::size_t begin,
               std::size_t end) const;

  struct Node {
    int token = -1;  // the token whose content ends here
  };
  std::vector<Node> nodes_{Node{}};
  std::unordered_map<std::uint64_t, int> edges_;  // (node << 8 | byte) -> child node
  std::vector<AddedToken> tokens_;
};

}  // namespace kvvm::tokenizer::detail
