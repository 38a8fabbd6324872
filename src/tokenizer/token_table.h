// The vocabulary's string -> id index and the merges' (left, right) -> rank index, built once
// at load. Both are open-addressing tables over flat arrays: 150,000 tokens and as many merges
// (a Qwen2-sized file) cost a handful of allocations instead of one node per entry, which is
// most of what a hash map of std::string spent at load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"

namespace kvvm::tokenizer::detail {

class TokenTable {
 public:
  void reserve(std::size_t tokens, std::size_t bytes);
  // Adds `token` with `id`; false (nothing added) when the token is already there.
  bool insert(std::string_view token, TokenId id);
  TokenId find(std::string_view token) const;  // -1 when absent
  std::size_t size() const { return entries_.size(); }
  std::size_t bytes() const { return pool_.size(); }  // every token's length, summed
  // The token and id added index-th (0 for the first).
  std::string_view token_at(std::size_t index) const { return text(entries_[index]); }
  TokenId id_at(std::size_t index) const { return entries_[index].id; }

  // Calls f(token, id) for every token in insertion order; the views live as long as the
  // table is not changed.
  template <typename F>
  void for_each(F f) const {
    for (const Entry& entry : entries_) f(text(entry), entry.id);
  }

 private:
  struct Entry {
    std::uint32_t offset;
    std::uint32_t length;
    std::uint32_t hash;  // the low bits of the full hash: a cheap first comparison
    TokenId id;
  };
  std::string_view text(const Entry& entry) const {
    return std::string_view(pool_).substr(entry.offset, entry.length);
  }
  void grow();

  std::string pool_;                  // every token's bytes, back to back
  std::vector<Entry> entries_;        // in insertion order
  std::vector<std::uint32_t> slots_;  // entry index + 1, 0 when empty; a power of two long
};

// (left id, right id) -> the merge's rank and the token it makes.
class MergeTable {
 public:
  struct Merge {
    std::uint32_t rank;
    TokenId result;
  };
  void reserve(std::size_t merges);
  // Sets the pair's merge, replacing an earlier one (a pair listed twice takes its later
  // rank, as Hugging Face's map filled in order does).
  void assign(TokenId left, TokenId right, Merge merge);
  const Merge* find(TokenId left, TokenId right) const;
  std::size_t size() const { return size_; }

 private:
  static std::uint64_t key(TokenId left, TokenId right) {
    return (std::uint64_t{static_cast<std::uint32_t>(left)} << 32) |
           static_cast<std::uint32_t>(right);
  }
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};  // ids are never negative
  void rehash(std::size_t capacity);

  std::vector<std::uint64_t> keys_;
  std::vector<Merge> values_;
  std::size_t size_ = 0;
};

}  // namespace kvvm::tokenizer::detail
