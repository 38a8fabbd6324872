// A router's index of one replica's KV events, as llm-d's KV-cache indexer keeps one: the
// blocks stored and not since removed, each by its hash, and the longest chain of a prompt's
// blocks it holds. It recomputes every stored block's hash from its parent and token ids
// (prefix_cache_events.h), so a scheme that drifts from the documented one fails here.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "kvvm/kv/prefix/prefix_cache_events.h"

namespace kvvm::testing {

class KvEventsIndex : public PrefixCacheObserver {
 public:
  // The salts a block 0 may be hashed under (a router knows its tenants).
  explicit KvEventsIndex(std::set<std::uint64_t> salts) : salts_(std::move(salts)) {}

  void stored(const StoredBlocks& blocks) override {
    std::lock_guard lock(mutex_);
    ++stored_events_;
    block_tokens_ = blocks.block_tokens;
    EXPECT_EQ(blocks.ids.size(), blocks.hashes.size() * blocks.block_tokens);
    std::optional<std::uint64_t> parent = blocks.parent;
    for (std::size_t i = 0; i < blocks.hashes.size(); ++i) {
      const std::span<const TokenId> ids(blocks.ids.data() + i * blocks.block_tokens,
                                         blocks.block_tokens);
      if (parent.has_value()) {
        EXPECT_TRUE(blocks_.contains(*parent)) << "a block stored under a parent not held";
        EXPECT_EQ(blocks.hashes[i], block_hash(*parent, ids));
      } else {
        bool some_salt = false;
        for (std::uint64_t salt : salts_) {
          some_salt = some_salt || blocks.hashes[i] == block_hash(block_hash_root(salt), ids);
        }
        EXPECT_TRUE(some_salt) << "block 0's hash is no known salt's";
      }
      EXPECT_FALSE(blocks_.contains(blocks.hashes[i])) << "a block stored twice";
      blocks_.insert(blocks.hashes[i]);
      parent = blocks.hashes[i];
    }
  }

  void removed(std::span<const std::uint64_t> hashes) override {
    std::lock_guard lock(mutex_);
    for (std::uint64_t hash : hashes) {
      EXPECT_TRUE(blocks_.contains(hash)) << "a block removed that was not stored";
      blocks_.erase(hash);
      ++removed_blocks_;
    }
  }

  void cleared() override {
    std::lock_guard lock(mutex_);
    blocks_.clear();
    ++cleared_;
  }

  // The prompt tokens a router expects the replica to find cached: the longest chain of the
  // prompt's whole blocks held, leaving the last token to compute (as vLLM's scheduler).
  std::uint64_t predicted_hit(std::span<const TokenId> prompt, std::uint64_t salt) const {
    std::lock_guard lock(mutex_);
    if (block_tokens_ == 0 || prompt.empty()) return 0;
    std::uint64_t hash = block_hash_root(salt);
    std::uint64_t hit = 0;
    while (hit + block_tokens_ <= prompt.size() - 1) {
      hash = block_hash(hash, prompt.subspan(hit, block_tokens_));
      if (!blocks_.contains(hash)) break;
      hit += block_tokens_;
    }
    return hit;
  }

  bool holds(std::uint64_t hash) const {
    std::lock_guard lock(mutex_);
    return blocks_.contains(hash);
  }
  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return blocks_.size();
  }
  std::uint64_t block_tokens() const {
    std::lock_guard lock(mutex_);
    return block_tokens_;
  }
  std::uint64_t stored_events() const {
    std::lock_guard lock(mutex_);
    return stored_events_;
  }
  std::uint64_t removed_blocks() const {
    std::lock_guard lock(mutex_);
    return removed_blocks_;
  }
  std::uint64_t cleared_count() const {
    std::lock_guard lock(mutex_);
    return cleared_;
  }

 private:
  const std::set<std::uint64_t> salts_;
  mutable std::mutex mutex_;
  std::set<std::uint64_t> blocks_;
  std::uint64_t block_tokens_ = 0;
  std::uint64_t stored_events_ = 0;
  std::uint64_t removed_blocks_ = 0;
  std::uint64_t cleared_ = 0;
};

}  // namespace kvvm::testing
