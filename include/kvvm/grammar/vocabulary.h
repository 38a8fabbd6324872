// Vocabulary: what a grammar needs of a tokenizer, once per model: every token's bytes as it
// adds them to the output, which ids are special (never allowed inside a grammar: a chat
// template's markers are not text) and which end a sequence (allowed only where the grammar
// accepts). The tokens are kept sorted by their bytes with each one's shared prefix with the one
// before, so a walk over the whole vocabulary is a walk over its trie: a prefix the grammar
// refuses skips every token that starts with it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/tokenizer/tokenizer.h"

namespace kvvm::grammar {

using TokenId = tokenizer::TokenId;

class Vocabulary {
 public:
  // `ends`: the ids that end a sequence (a model's eos ids), each inside the vocabulary. Ids of
  // no token and special ids other than the ends are never allowed.
  static Result<std::shared_ptr<const Vocabulary>> from_tokenizer(
      const tokenizer::Tokenizer& tokenizer, std::span<const TokenId> ends);
  // From each id's bytes (tests, benchmarks). `special[i]`: id i is never allowed (its bytes are
  // ignored). InvalidArgument for an end outside the vocabulary or sizes that differ.
  static Result<std::shared_ptr<const Vocabulary>> from_bytes(std::vector<std::string> bytes,
                                                              std::vector<bool> special,
                                                              std::span<const TokenId> ends);

  std::size_t size() const { return bytes_.size(); }  // ids [0, size())
  std::size_t mask_words() const { return (size() + 31) / 32; }
  std::string_view bytes(TokenId id) const { return bytes_[static_cast<std::size_t>(id)]; }
  // Whether the id may ever be matched by a grammar (not special, not empty, not an end).
  bool is_text(TokenId id) const { return text_[static_cast<std::size_t>(id)]; }
  std::span<const TokenId> ends() const { return ends_; }
  bool is_end(TokenId id) const;

  // The text tokens sorted by bytes, and for each the length of the prefix it shares with the
  // one before it (0 for the first).
  std::span<const TokenId> sorted() const { return sorted_; }
  std::span<const std::uint16_t> shared_prefix() const { return shared_; }

 private:
  Vocabulary() = default;
  static Result<std::shared_ptr<const Vocabulary>> build(std::vector<std::string> bytes,
                                                         std::vector<bool> text,
                                                         std::span<const TokenId> ends);
  std::vector<std::string> bytes_;
  std::vector<bool> text_;
  std::vector<TokenId> ends_;
  std::vector<TokenId> sorted_;
  std::vector<std::uint16_t> shared_;
};

}  // namespace kvvm::grammar
