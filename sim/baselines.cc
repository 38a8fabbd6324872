#include "sim/baselines.h"

#include <algorithm>

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

PagedCacheModel::PagedCacheModel(std::uint64_t budget, std::uint64_t block_tokens,
                                 std::uint64_t bytes_per_token)
    : block_tokens_(block_tokens),
      bytes_per_token_(bytes_per_token),
      blocks_(budget / (block_tokens * bytes_per_token)) {
  for (std::uint32_t b = 0; b < blocks_.size(); ++b) {
    blocks_[b].in_free = free_.insert(free_.end(), b);
  }
  figures_.enabled = true;
  figures_.bytes_per_token = bytes_per_token;
}

std::uint32_t PagedCacheModel::allocate() {
  const std::uint32_t b = free_.front();
  free_.pop_front();
  Block& block = blocks_[b];
  if (block.hashed) {
    std::vector<std::uint32_t>& holders = table_[block.hash];
    std::erase(holders, b);
    if (holders.empty()) table_.erase(block.hash);
    block.hashed = false;
    ++figures_.evictions;
  }
  block.free = false;
  block.refs = 1;
  return b;
}

void PagedCacheModel::cache_full_blocks(Sequence& sequence) {
  const std::vector<TokenId>& ids = *sequence.request->ids;
  const std::uint64_t full =
      std::min<std::uint64_t>(sequence.tokens / block_tokens_, sequence.blocks.size());
  while (sequence.hashes.size() < full) {
    const std::size_t i = sequence.hashes.size();
    const CacheKey parent = i == 0 ? CacheKey{sequence.request->salt, 0x7061676564ull /* paged */}
                                   : sequence.hashes.back();
    const CacheKey key = xxh3_chain_hash(
        parent, std::span<const TokenId>(ids.data() + i * block_tokens_, block_tokens_));
    sequence.hashes.push_back(key);
    Block& block = blocks_[sequence.blocks[i]];
    if (!block.hashed) {
      block.hashed = true;
      block.hash = key;
      table_[key].push_back(sequence.blocks[i]);
      ++figures_.published;
    }
  }
}

Result<bool> PagedCacheModel::admit(std::size_t seq, const TraceRequest& request,
                                    std::uint64_t tokens) {
  if (!request.ids || request.ids->size() < tokens) {
    return Status::Internal(name() + ": request " + std::to_string(seq) + " has no token ids");
  }
  Sequence sequence;
  sequence.request = &request;
  sequence.tokens = tokens;
  // The longest cached chain of full blocks that leaves the last token to compute.
  std::vector<std::uint32_t> hits;
  std::uint64_t evictable_hits = 0;
  for (std::uint64_t i = 0; (i + 1) * block_tokens_ <= tokens - 1; ++i) {
    const CacheKey parent =
        i == 0 ? CacheKey{request.salt, 0x7061676564ull} : sequence.hashes.back();
    const CacheKey key = xxh3_chain_hash(
        parent, std::span<const TokenId>(request.ids->data() + i * block_tokens_, block_tokens_));
    auto it = table_.find(key);
    if (it == table_.end()) break;
    sequence.hashes.push_back(key);
    hits.push_back(it->second.front());
    if (blocks_[hits.back()].refs == 0) ++evictable_hits;
  }
  const std::uint64_t needed = (tokens + block_tokens_ - 1) / block_tokens_ - hits.size();
  // vLLM's check: the new blocks plus the free cached blocks it is about to take.
  if (needed + evictable_hits > free_.size()) return false;
  for (std::uint32_t b : hits) {
    Block& block = blocks_[b];
    if (block.refs++ == 0) {
      free_.erase(block.in_free);
      block.free = false;
    }
    sequence.blocks.push_back(b);
  }
  for (std::uint64_t i = 0; i < needed; ++i) sequence.blocks.push_back(allocate());
  committed_blocks_ += sequence.blocks.size();
  live_tokens_ += tokens;
  figures_.queries += tokens;
  figures_.hits += hits.size() * block_tokens_;
  cache_full_blocks(sequence);
  sequences_[seq] = std::move(sequence);
  return true;
}

Result<bool> PagedCacheModel::grow(std::size_t seq, std::uint64_t tokens) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return unknown(name(), seq);
  Sequence& sequence = it->second;
  if (sequence.request->ids->size() < tokens) {
    return Status::Internal(name() + ": request " + std::to_string(seq) + " has no token ids");
  }
  const std::uint64_t want = (tokens + block_tokens_ - 1) / block_tokens_;
  const std::uint64_t more = want > sequence.blocks.size() ? want - sequence.blocks.size() : 0;
  if (more > free_.size()) return false;
  for (std::uint64_t i = 0; i < more; ++i) sequence.blocks.push_back(allocate());
  committed_blocks_ += more;
  live_tokens_ += tokens - sequence.tokens;
  sequence.tokens = tokens;
  cache_full_blocks(sequence);
  return true;
}

Status PagedCacheModel::release(std::size_t seq) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return unknown(name(), seq);
  Sequence& sequence = it->second;
  // Last block first, so a sequence's tail is evicted before its (more shareable) head.
  for (auto b = sequence.blocks.rbegin(); b != sequence.blocks.rend(); ++b) {
    Block& block = blocks_[*b];
    if (--block.refs == 0) {
      block.free = true;
      block.in_free = free_.insert(free_.end(), *b);
    }
  }
  committed_blocks_ -= sequence.blocks.size();
  live_tokens_ -= sequence.tokens;
  sequences_.erase(it);
  return Status::Ok();
}

MemorySample PagedCacheModel::sample() const {
  const std::uint64_t block_bytes = block_tokens_ * bytes_per_token_;
  const std::uint64_t physical = (blocks_.size() - free_.size()) * block_bytes;
  const std::uint64_t committed = committed_blocks_ * block_bytes;
  return {committed, live_tokens_ * bytes_per_token_, committed - physical, physical};
}

CacheFigures PagedCacheModel::cache() const {
  CacheFigures figures = figures_;
  std::uint64_t hashed = 0;
  for (const Block& block : blocks_) hashed += block.hashed ? 1 : 0;
  figures.cached_bytes = hashed * block_tokens_ * bytes_per_token_;
  return figures;
}

}  // namespace kvvm::cli
