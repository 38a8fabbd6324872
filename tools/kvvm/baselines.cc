#include "baselines.h"

namespace kvvm::cli {
namespace {

Status unknown(const std::string& model, std::size_t seq) {
  return Status::Internal(model + ": sequence " + std::to_string(seq) + " is not running");
}

}  // namespace

std::uint64_t preallocate_capacity(std::uint64_t budget, std::uint64_t max_context,
                                   std::uint64_t bytes_per_token) {
  if (max_context == 0 || bytes_per_token == 0) return 0;
  // Divide twice rather than multiply: max context x bytes per token may pass 64 bits.
  return budget / bytes_per_token / max_context;
}

PreallocateModel::PreallocateModel(std::uint64_t budget, std::uint64_t max_context,
                                   std::uint64_t bytes_per_token)
    : budget_(budget), max_context_(max_context), bytes_per_token_(bytes_per_token) {}

Result<bool> PreallocateModel::admit(std::size_t seq, const TraceRequest& /*request*/,
                                     std::uint64_t tokens) {
  if (tokens_.size() + 1 > preallocate_capacity(budget_, max_context_, bytes_per_token_)) {
    return false;
  }
  tokens_[seq] = tokens;
  live_tokens_ += tokens;
  return true;
}

Result<bool> PreallocateModel::grow(std::size_t seq, std::uint64_t tokens) {
  auto it = tokens_.find(seq);
  if (it == tokens_.end()) return unknown(name(), seq);
  live_tokens_ += tokens - it->second;
  it->second = tokens;
  return true;  // the whole max context is already there
}

Status PreallocateModel::release(std::size_t seq) {
  auto it = tokens_.find(seq);
  if (it == tokens_.end()) return unknown(name(), seq);
  live_tokens_ -= it->second;
  tokens_.erase(it);
  return Status::Ok();
}

MemorySample PreallocateModel::sample() const {
  const std::uint64_t committed = tokens_.size() * max_context_ * bytes_per_token_;
  return {committed, live_tokens_ * bytes_per_token_, 0, committed};
}

PagedModel::PagedModel(std::uint64_t budget, std::uint64_t block_tokens,
                       std::uint64_t bytes_per_token)
    : budget_(budget), block_tokens_(block_tokens), bytes_per_token_(bytes_per_token) {}

Result<bool> PagedModel::admit(std::size_t seq, const TraceRequest& /*request*/,
                               std::uint64_t tokens) {
  const std::uint64_t blocks = blocks_for(tokens);
  if ((blocks_ + blocks) > budget_ / block_bytes()) return false;
  tokens_[seq] = tokens;
  blocks_ += blocks;
  live_tokens_ += tokens;
  return true;
}

Result<bool> PagedModel::grow(std::size_t seq, std::uint64_t tokens) {
  auto it = tokens_.find(seq);
  if (it == tokens_.end()) return unknown(name(), seq);
  const std::uint64_t more = blocks_for(tokens) - blocks_for(it->second);
  if (blocks_ + more > budget_ / block_bytes()) return false;
  blocks_ += more;
  live_tokens_ += tokens - it->second;
  it->second = tokens;
  return true;
}

Status PagedModel::release(std::size_t seq) {
  auto it = tokens_.find(seq);
  if (it == tokens_.end()) return unknown(name(), seq);
  blocks_ -= blocks_for(it->second);
  live_tokens_ -= it->second;
  tokens_.erase(it);
  return Status::Ok();
}

MemorySample PagedModel::sample() const {
  const std::uint64_t committed = blocks_ * block_bytes();
  return {committed, live_tokens_ * bytes_per_token_, 0, committed};
}

}  // namespace kvvm::cli
