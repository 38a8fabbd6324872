#include "tokenizer/token_table.h"

#include <functional>

namespace kvvm::tokenizer::detail {
namespace {

std::size_t hash_of(std::string_view text) { return std::hash<std::string_view>{}(text); }

std::uint64_t mix(std::uint64_t key) {
  // splitmix64's finalizer: consecutive ids spread over every slot.
  key ^= key >> 30;
  key *= 0xBF58476D1CE4E5B9ull;
  key ^= key >> 27;
  key *= 0x94D049BB133111EBull;
  return key ^ (key >> 31);
}

}  // namespace

void TokenTable::reserve(std::size_t tokens, std::size_t bytes) {
  pool_.reserve(bytes);
  entries_.reserve(tokens);
  std::size_t capacity = 16;
  while (capacity < tokens * 2) capacity *= 2;
  if (capacity > slots_.size()) {
    slots_.assign(capacity, 0);
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      std::size_t slot = entries_[i].hash & (capacity - 1);
      while (slots_[slot] != 0) slot = (slot + 1) & (capacity - 1);
      slots_[slot] = static_cast<std::uint32_t>(i + 1);
    }
  }
}

void TokenTable::grow() { reserve(entries_.size() + 1 > 8 ? entries_.size() * 2 : 16, 0); }

bool TokenTable::insert(std::string_view token, TokenId id) {
  if ((entries_.size() + 1) * 2 > slots_.size()) grow();
  const auto hash = static_cast<std::uint32_t>(hash_of(token));
  const std::size_t mask = slots_.size() - 1;
  std::size_t slot = hash & mask;
  for (; slots_[slot] != 0; slot = (slot + 1) & mask) {
    const Entry& entry = entries_[slots_[slot] - 1];
    if (entry.hash == hash && text(entry) == token) return false;
  }
  entries_.push_back({static_cast<std::uint32_t>(pool_.size()),
                      static_cast<std::uint32_t>(token.size()), hash, id});
  pool_.append(token);
  slots_[slot] = static_cast<std::uint32_t>(entries_.size());
  return true;
}

TokenId TokenTable::find(std::string_view token) const {
  if (slots_.empty()) return -1;
  const auto hash = static_cast<std::uint32_t>(hash_of(token));
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t slot = hash & mask; slots_[slot] != 0; slot = (slot + 1) & mask) {
    const Entry& entry = entries_[slots_[slot] - 1];
    if (entry.hash == hash && text(entry) == token) return entry.id;
  }
  return -1;
}

void MergeTable::reserve(std::size_t merges) {
  std::size_t capacity = 16;
  while (capacity < merges * 2) capacity *= 2;
  if (capacity > keys_.size()) rehash(capacity);
}

void MergeTable::rehash(std::size_t capacity) {
  std::vector<std::uint64_t> keys(capacity, kEmpty);
  std::vector<Merge> values(capacity);
  for (std::size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i] == kEmpty) continue;
    std::size_t slot = mix(keys_[i]) & (capacity - 1);
    while (keys[slot] != kEmpty) slot = (slot + 1) & (capacity - 1);
    keys[slot] = keys_[i];
    values[slot] = values_[i];
  }
  keys_ = std::move(keys);
  values_ = std::move(values);
}

void MergeTable::assign(TokenId left, TokenId right, Merge merge) {
  if ((size_ + 1) * 2 > keys_.size()) rehash(keys_.empty() ? 16 : keys_.size() * 2);
  const std::uint64_t k = key(left, right);
  const std::size_t mask = keys_.size() - 1;
  std::size_t slot = mix(k) & mask;
  while (keys_[slot] != kEmpty && keys_[slot] != k) slot = (slot + 1) & mask;
  if (keys_[slot] == kEmpty) {
    keys_[slot] = k;
    ++size_;
  }
  values_[slot] = merge;
}

const MergeTable::Merge* MergeTable::find(TokenId left, TokenId right) const {
  if (keys_.empty()) return nullptr;
  const std::uint64_t k = key(left, right);
  const std::size_t mask = keys_.size() - 1;
  for (std::size_t slot = mix(k) & mask; keys_[slot] != kEmpty; slot = (slot + 1) & mask) {
    if (keys_[slot] == k) return &values_[slot];
  }
  return nullptr;
}

}  // namespace kvvm::tokenizer::detail
