// The BPE model: a vocabulary and ranked merges. A pre-token (byte-level characters) starts as
// one symbol per character and the adjacent pair of lowest rank is merged until none remains;
// a heap of candidate pairs keeps a long pre-token at O(n log n) rather than a rescan per merge.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvvm/mutex.h"
#include "kvvm/status.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "tokenizer/json_fields.h"

namespace kvvm::tokenizer::detail {

// Hash and equality that let a std::string-keyed map be searched with a string_view.
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view text) const {
    return std::hash<std::string_view>{}(text);
  }
};
using Vocab = std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>>;

// The largest token id accepted: ten times the largest vocabularies shipped (about 262k), and
// small enough that the id -> token tables of a hostile file stay bounded.
inline constexpr std::int64_t kMaxTokenId = (std::int64_t{1} << 21) - 1;

class Bpe {
 public:
  // From tokenizer.json's "model" object. InvalidArgument naming the field for anything this
  // class does not implement (dropout, unk_token, byte_fallback, subword prefixes / suffixes)
  // and for a merge or vocabulary entry that does not hold together.
  static Result<std::unique_ptr<Bpe>> parse(const Json& model, std::string_view where);

  // Appends the ids of one pre-token. Characters missing from the vocabulary are dropped, as
  // Hugging Face's BPE does without an unk_token.
  void encode(std::string_view word, std::vector<TokenId>& out) const;

  const Vocab& vocab() const { return vocab_; }

 private:
  struct Merge {
    std::uint32_t rank;
    TokenId result;
  };
  static std::uint64_t pair_key(TokenId left, TokenId right) {
    return (std::uint64_t{static_cast<std::uint32_t>(left)} << 32) |
           static_cast<std::uint32_t>(right);
  }
  void merge(std::string_view word, std::vector<TokenId>& out) const;

  Vocab vocab_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  bool ignore_merges_ = false;

  // Pre-tokens recur (" the", " and"): their ids are kept, up to a bound in count and length.
  static constexpr std::size_t kCacheEntries = 1 << 16;
  static constexpr std::size_t kCacheWordBytes = 256;
  mutable Mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>> cache_
      KVVM_GUARDED_BY(cache_mutex_);
};

}  // namespace kvvm::tokenizer::detail
