#include "grammar/mask_cache.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "grammar/token_walk.h"

namespace kvvm::grammar::detail {

std::size_t PartialKeyHash::operator()(const PartialKey& k) const {
  std::uint64_t h = k.depth * 0x9E3779B97F4A7C15ull + (k.rooted ? 1 : 0);
  for (int i = 0; i < k.depth; ++i) h = (h ^ k.pos[i]) * 0x100000001B3ull;
  return static_cast<std::size_t>(h ^ (h >> 29));
}

PartialKey partial_key(const Stacks& stacks, std::uint32_t node) {
  PartialKey key;
  std::uint32_t n = node;
  while (key.depth < kKeyDepth && n != kRoot) {
    key.pos[key.depth++] = stacks.pos(n);
    n = stacks.parent(n);
  }
  key.rooted = n == kRoot;
  return key;
}

PartialKey partial_key(std::span<const std::uint32_t> positions) {
  PartialKey key;
  while (key.depth < kKeyDepth && key.depth < positions.size()) {
    key.pos[key.depth] = positions[key.depth];
    ++key.depth;
  }
  key.rooted = positions.size() <= static_cast<std::size_t>(kKeyDepth);
  return key;
}

void PartialMask::or_into(std::span<std::uint32_t> out) const {
  if (words.empty()) {
    const std::size_t n = std::min(out.size(), accepted.size());
    for (std::size_t i = 0; i < n; ++i) out[i] |= accepted[i];
    return;
  }
  for (std::size_t i = 0; i < words.size(); ++i) out[words[i]] |= accepted[i];
}

void whole_key(const Stacks& stacks, std::uint32_t node, std::vector<std::uint32_t>& out) {
  out.clear();
  for (std::uint32_t n = node; n != kRoot; n = stacks.parent(n)) out.push_back(stacks.pos(n));
}

PartialMask compute_partial_mask(const Program& program, const Vocabulary& vocabulary,
                                 const PartialKey& key) {
  Stacks stacks;
  Runner runner(program, stacks);
  std::uint32_t node = key.rooted ? kRoot : kUnknown;
  for (int i = key.depth - 1; i >= 0; --i) node = stacks.node(key.pos[i], node);
  State start;
  start.tops.push_back(node);
  PartialMask mask;
  mask.accepted.assign(vocabulary.mask_words(), 0);
  WalkOut out;
  out.accepted_words = &mask.accepted;
  out.uncertain = &mask.uncertain;
  walk_tokens(runner, start, vocabulary, vocabulary.sorted(), vocabulary.shared_prefix(), out);
  std::size_t set = 0;
  for (const std::uint32_t w : mask.accepted) set += w != 0 ? 1 : 0;
  if (set * 4 <= mask.accepted.size()) {
    std::vector<std::uint32_t> bits;
    bits.reserve(set);
    mask.words.reserve(set);
    for (std::size_t i = 0; i < mask.accepted.size(); ++i) {
      if (mask.accepted[i] == 0) continue;
      mask.words.push_back(static_cast<std::uint32_t>(i));
      bits.push_back(mask.accepted[i]);
    }
    mask.accepted = std::move(bits);
    if (mask.words.empty()) mask.accepted.clear();
  }
  return mask;
}

std::shared_ptr<const PartialMask> MaskCache::partial(const PartialKey& key) {
  {
    std::shared_lock lock(mutex_);
    if (const auto found = partial_.find(key); found != partial_.end()) return found->second;
  }
  auto mask = std::make_shared<const PartialMask>(compute_partial_mask(program_, vocabulary_, key));
  std::unique_lock lock(mutex_);
  if (const auto found = partial_.find(key); found != partial_.end()) return found->second;
  if (bytes_ + mask->bytes() <= bound_) {
    bytes_ += mask->bytes();
    partial_.emplace(key, mask);
  }
  return mask;
}

std::string MaskCache::whole_text(std::span<const std::uint32_t> positions) {
  std::string text(positions.size() * sizeof(std::uint32_t), '\0');
  if (!positions.empty()) std::memcpy(text.data(), positions.data(), text.size());
  return text;
}

std::shared_ptr<const std::vector<TokenId>> MaskCache::whole(
    std::span<const std::uint32_t> positions) const {
  const std::string key = whole_text(positions);
  std::shared_lock lock(mutex_);
  const auto found = whole_.find(key);
  return found == whole_.end() ? nullptr : found->second;
}

void MaskCache::remember_whole(std::span<const std::uint32_t> positions,
                               std::vector<TokenId> accepted) {
  const std::uint64_t cost = positions.size() * 4 + accepted.size() * 4 + 96;
  std::string key = whole_text(positions);
  std::unique_lock lock(mutex_);
  if (bytes_ + cost > bound_ || whole_.contains(key)) return;
  bytes_ += cost;
  whole_.emplace(std::move(key), std::make_shared<const std::vector<TokenId>>(std::move(accepted)));
}

std::uint64_t MaskCache::bytes() const {
  std::shared_lock lock(mutex_);
  return bytes_;
}

}  // namespace kvvm::grammar::detail
