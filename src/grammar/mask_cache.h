// The masks a compiled grammar keeps: per partial stack (the top kKeyDepth frames of a stack, or
// all of it when shorter), the tokens accepted whatever lies below and the uncertain ones; per
// whole stack, which of its partial stack's uncertain tokens it accepts. Computed when first
// asked (or at compile time) and kept while the grammar's byte bound allows.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/pushdown.h"
#include "kvvm/grammar/vocabulary.h"

namespace kvvm::grammar::detail {

// Frames in a partial stack. Three hold a JSON string's character, its repetition and the
// string's closing quote, so the tokens inside a string are certain.
inline constexpr int kKeyDepth = 3;

struct PartialKey {
  std::array<std::uint32_t, kKeyDepth> pos{};  // top first
  std::uint8_t depth = 0;
  bool rooted = false;  // the stack ends within the key: below it is the grammar's caller
  bool operator==(const PartialKey&) const = default;
};
struct PartialKeyHash {
  std::size_t operator()(const PartialKey& k) const;
};

// The top frames of the stack whose top is `node`.
PartialKey partial_key(const Stacks& stacks, std::uint32_t node);
// The same from a whole stack's positions (top first).
PartialKey partial_key(std::span<const std::uint32_t> positions);
// Every frame's position, top first.
void whole_key(const Stacks& stacks, std::uint32_t node, std::vector<std::uint32_t>& out);

struct PartialMask {
  // The accepted tokens, a bit per token: every word (`accepted`), or, when at most a quarter of
  // the words have a bit set (a top that takes one UTF-8 lead byte, a digit, a quote), only
  // those words (`words` their indices, `accepted` their bits), so a mask ORs what is there.
  std::vector<std::uint32_t> accepted;
  std::vector<std::uint32_t> words;  // empty: `accepted` is every word
  std::vector<TokenId> uncertain;    // in the vocabulary's sorted order
  std::uint64_t bytes() const {
    return (accepted.size() + words.size() + uncertain.size()) * 4 + 64;
  }
  void or_into(std::span<std::uint32_t> out) const;
};

PartialMask compute_partial_mask(const Program& program, const Vocabulary& vocabulary,
                                 const PartialKey& key);

class MaskCache {
 public:
  MaskCache(const Program& program, const Vocabulary& vocabulary, std::uint64_t byte_bound)
      : program_(program), vocabulary_(vocabulary), bound_(byte_bound) {}

  std::shared_ptr<const PartialMask> partial(const PartialKey& key);
  // The uncertain tokens `positions` (a whole stack) accepts, when known.
  std::shared_ptr<const std::vector<TokenId>> whole(std::span<const std::uint32_t> positions) const;
  void remember_whole(std::span<const std::uint32_t> positions, std::vector<TokenId> accepted);
  std::uint64_t bytes() const;

 private:
  static std::string whole_text(std::span<const std::uint32_t> positions);
  const Program& program_;
  const Vocabulary& vocabulary_;
  const std::uint64_t bound_;
  mutable std::shared_mutex mutex_;
  std::unordered_map<PartialKey, std::shared_ptr<const PartialMask>, PartialKeyHash> partial_;
  std::unordered_map<std::string, std::shared_ptr<const std::vector<TokenId>>> whole_;
  std::uint64_t bytes_ = 0;
};

}  // namespace kvvm::grammar::detail
