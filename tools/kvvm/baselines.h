// The two baselines `kvvm simulate` replays beside kvvm, as pure accounting (no driver):
//
//   preallocate  what a plain allocator does: every admitted request gets max context x bytes
//                per token at once, whatever its length; growth never needs memory. Its
//                capacity is floor(budget / (max context x bytes per token)) sequences.
//   paged-16     vLLM's default accounting: blocks of 16 tokens, ceil(tokens / 16) blocks per
//                sequence, allocated as it grows, no prefix sharing (no prefix caching).
//
// Both answer "no room" exactly when the budget is short, so the scheduler queues, preempts
// and rejects them by the same rules as kvvm's arena.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "sim_scheduler.h"

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

}  // namespace kvvm::cli
