// The BPE model: a vocabulary and ranked merges. A pre-token starts as one symbol per
// character and the adjacent pair of lowest rank is merged until none remains; a heap of
// candidate pairs keeps a long pre-token at O(n log n) rather than a rescan per merge.
// A character missing from the vocabulary becomes its bytes' <0xNN> tokens (byte_fallback),
// else the unk_token (runs of them fused into one when fuse_unk), else nothing, as Hugging
// Face's BPE does.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvvm/base/mutex.h"
#include "kvvm/base/status.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/token_table.h"

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

// The vocabulary and merges as the reader streams them out of tokenizer.json. A merge is
// resolved into `merge_table` as it is read when the vocabulary came first (as files write
// it); one read before the vocabulary waits in `pending` (views that live as long as the text
// read, or `decoded`). The first refusal of each list is kept and the reading goes on, so that
// a syntax error further on is the one reported, as when the whole document was parsed first.
struct BpeLists {
  bool has_vocab = false;   // model.vocab was an object, read into `vocab`
  bool has_merges = false;  // model.merges was an array, read into `merge_table` / `pending`
  TokenTable vocab;
  Status vocab_error;  // an id out of range, another token's, not a number
  MergeTable merge_table;
  std::size_t merge_count = 0;
  Status merges_error;  // a merge naming a token outside the vocabulary, malformed, ...
  struct PendingMerge {
    std::string_view left;
    std::string_view right;
    const Json* malformed = nullptr;
  };
  std::vector<PendingMerge> pending;
  std::deque<std::string> decoded;  // pending merges' strings that held escapes
  std::deque<Json> malformed;       // what PendingMerge::malformed points at

  // The next merge (rank merge_count), "left right" or [left, right] once split.
  void add_merge(std::string_view left, std::string_view right);
  // A merge entry that is neither form (the message shows `entry`).
  void add_malformed_merge(const Json& entry);
  // Resolves the pending merges (once the vocabulary is complete).
  void resolve_pending();

 private:
  void resolve(const PendingMerge& merge, std::size_t rank);
  std::string joined_;
};

class Bpe {
 public:
  // From tokenizer.json's "model" object (without its vocab and merges, which `lists`
  // holds). InvalidArgument naming the field for anything this class does not implement
  // (dropout, subword prefixes / suffixes) and for a merge, a vocabulary entry or an unk_token
  // that does not hold together.
  static Result<std::unique_ptr<Bpe>> build(const Json& model, BpeLists lists,
                                            std::string_view where);

  // Appends the ids of one pre-token.
  void encode(std::string_view word, std::vector<TokenId>& out) const;

  const TokenTable& vocab() const { return vocab_; }

 private:
  void merge(std::string_view word, std::vector<TokenId>& out) const;
  // The initial symbols of `word`: a token per character, byte fallback, unk.
  void symbols_of(std::string_view word, std::vector<TokenId>& ids) const;

  TokenTable vocab_;
  MergeTable merges_;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  TokenId unk_ = -1;                     // -1: no unk_token
  std::array<TokenId, 256> byte_ids_{};  // <0xNN> tokens, -1 when absent

  // Pre-tokens recur (" the", " and"): their ids are kept, up to a bound in count and length.
  static constexpr std::size_t kCacheEntries = 1 << 16;
  static constexpr std::size_t kCacheWordBytes = 256;
  mutable Mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>> cache_
      KVVM_GUARDED_BY(cache_mutex_);
};

}  // namespace kvvm::tokenizer::detail
