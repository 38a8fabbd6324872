// The baselines `kvvm simulate` replays beside kvvm, as pure accounting (no driver):
//
//   preallocate  what a plain allocator does: every admitted request gets max context x bytes
//                per token at once, whatever its length; growth never needs memory. Its
//                capacity is floor(budget / (max context x bytes per token)) sequences.
//   paged-16     vLLM's block accounting: blocks of 16 tokens, ceil(tokens / 16) blocks per
//                sequence, allocated as it grows, no prefix sharing (prefix caching off).
//   paged-16+cache  paged-16 with vLLM's automatic prefix caching, which vLLM turns on by
//                default (so this, not paged-16, is what a vLLM user runs), v1 BlockPool semantics:
//                each full block of a sequence (prompt or generated) gets a chained hash
//                (parent hash, its 16 ids; the tenant salt in the root) and enters a hash ->
//                blocks table; admission reuses the longest chain of cached blocks that leaves
//                at least the last token to compute (ref count + 1; a free one leaves the
//                free queue); new blocks come from the head of the free queue, evicting the
//                hash of a cached one; a released sequence's blocks go to the tail, last block
//                first (so its tail is evicted first): the free queue is least recently used
//                first, and only unreferenced blocks are in it. Cached-but-free blocks are free
//                capacity. The salt keys the cache per tenant: a tenant's system prompt blocks
//                are shared by its own requests only.
//                Hashes are XXH3-128 chains (vLLM uses SHA-256 or its builtin hash; the
//                accounting does not depend on which).
//
// Each answers "no room" exactly when the budget is short, so the scheduler queues, preempts
// and rejects them by the same rules as kvvm's arena.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvvm/kv/prefix/prefix_cache.h"
#include "sim/replay_scheduler.h"

namespace kvvm::cli {

inline constexpr std::uint64_t kPagedBlockTokens = 16;

// floor(budget / (max_context x bytes_per_token)); 0 when either factor is 0.
std::uint64_t preallocate_capacity(std::uint64_t budget, std::uint64_t max_context,
                                   std::uint64_t bytes_per_token);

class PreallocateModel final : public MemoryModel {
 public:
  PreallocateModel(std::uint64_t budget, std::uint64_t max_context, std::uint64_t bytes_per_token);
  std::string name() const override { return "preallocate"; }
  Result<bool> admit(std::size_t seq, const TraceRequest& request, std::uint64_t tokens) override;
  Result<bool> grow(std::size_t seq, std::uint64_t tokens) override;
  Status release(std::size_t seq) override;
  MemorySample sample() const override;

 private:
  const std::uint64_t budget_;
  const std::uint64_t max_context_;
  const std::uint64_t bytes_per_token_;
  std::unordered_map<std::size_t, std::uint64_t> tokens_;  // by sequence
  std::uint64_t live_tokens_ = 0;
};

class PagedModel final : public MemoryModel {
 public:
  PagedModel(std::uint64_t budget, std::uint64_t block_tokens, std::uint64_t bytes_per_token);
  std::string name() const override { return "paged-" + std::to_string(block_tokens_); }
  Result<bool> admit(std::size_t seq, const TraceRequest& request, std::uint64_t tokens) override;
  Result<bool> grow(std::size_t seq, std::uint64_t tokens) override;
  Status release(std::size_t seq) override;
  MemorySample sample() const override;

  std::uint64_t blocks_for(std::uint64_t tokens) const {
    return (tokens + block_tokens_ - 1) / block_tokens_;
  }
  std::uint64_t block_bytes() const { return block_tokens_ * bytes_per_token_; }

 private:
  const std::uint64_t budget_;
  const std::uint64_t block_tokens_;
  const std::uint64_t bytes_per_token_;
  std::unordered_map<std::size_t, std::uint64_t> tokens_;  // by sequence
  std::uint64_t blocks_ = 0;
  std::uint64_t live_tokens_ = 0;
};

class PagedCacheModel final : public MemoryModel {
 public:
  PagedCacheModel(std::uint64_t budget, std::uint64_t block_tokens, std::uint64_t bytes_per_token);
  std::string name() const override { return "paged-" + std::to_string(block_tokens_) + "+cache"; }
  Result<bool> admit(std::size_t seq, const TraceRequest& request, std::uint64_t tokens) override;
  Result<bool> grow(std::size_t seq, std::uint64_t tokens) override;
  Status release(std::size_t seq) override;
  MemorySample sample() const override;
  CacheFigures cache() const override;

 private:
  struct Block {
    bool hashed = false;
    CacheKey hash;
    std::uint32_t refs = 0;
    bool free = true;
    std::list<std::uint32_t>::iterator in_free;  // valid while free
  };
  struct Sequence {
    const TraceRequest* request = nullptr;
    std::uint64_t tokens = 0;
    std::vector<std::uint32_t> blocks;
    std::vector<CacheKey> hashes;  // of its full blocks, in order
  };
  struct KeyHash {
    std::size_t operator()(const CacheKey& key) const { return key.low ^ (key.high * 31); }
  };
  // Pops the free queue's head, evicting its hash; REQUIRES a free block.
  std::uint32_t allocate();
  // Hashes the sequence's newly full blocks and enters them in the table.
  void cache_full_blocks(Sequence& sequence);

  const std::uint64_t block_tokens_;
  const std::uint64_t bytes_per_token_;
  std::vector<Block> blocks_;
  std::list<std::uint32_t> free_;  // head: evicted first
  std::unordered_map<CacheKey, std::vector<std::uint32_t>, KeyHash> table_;
  std::unordered_map<std::size_t, Sequence> sequences_;
  std::uint64_t committed_blocks_ = 0;  // sum over sequences (a shared block once per sharer)
  std::uint64_t live_tokens_ = 0;
  CacheFigures figures_;
};

}  // namespace kvvm::cli
