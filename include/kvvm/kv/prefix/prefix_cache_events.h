// What the prefix cache tells the world about its content, as blocks a router can match
// (docs/ARCHITECTURE.md "KV events"): an external router (llm-d, the Gateway API Inference
// Extension) keeps its own index of which replica holds which prompt prefix, fed by facts (a
// block stored, a block removed, all cleared), and scores a prompt by the longest chain of its
// blocks that a replica holds. The cache's own unit, the window, is a granule of bytes whose
// token count depends on the model and the layout; routers count in fixed blocks of tokens.
// So the cache reports blocks of `block_tokens` tokens, each only once every window up to the
// block's end is cached and that end is where a hit can end, and withdraws a block as soon as
// one of those windows goes: a router that finds a block stored can count on a hit that long.
//
// Block hashes are chained and deterministic, so a router may recompute them from token ids:
//   root(salt)       = XXH3_64bits(the salt as 8 little-endian bytes)
//   hash_i           = XXH3_64bits(hash_{i-1} as 8 little-endian bytes, then block i's token
//                      ids as 4 little-endian bytes each), hash_{-1} = root(salt)
// The salt is the tenant (EngineRequest::tenant), so tenants never share a hash.
//
// No transport here: the server's publisher implements the observer (layers point down).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace kvvm {

using TokenId = std::uint32_t;

// The hash chain above.
std::uint64_t block_hash_root(std::uint64_t salt);
std::uint64_t block_hash(std::uint64_t parent, std::span<const TokenId> ids);

// Consecutive blocks of one sequence that became hittable together.
struct StoredBlocks {
  std::optional<std::uint64_t> parent;  // the hash of the block before the first; none at 0
  std::vector<std::uint64_t> hashes;
  std::vector<TokenId> ids;  // hashes.size() * block_tokens ids, the blocks' tokens in order
  std::uint64_t block_tokens = 0;
};

// Receives the cache's facts in the order they happen. Called with the cache's lock held,
// from the scheduling thread (stored) or whichever thread asks the governor for memory
// (removed): an implementation must not block and must not call back into the cache.
class PrefixCacheObserver {
 public:
  virtual ~PrefixCacheObserver() = default;
  virtual void stored(const StoredBlocks& blocks) = 0;
  virtual void removed(std::span<const std::uint64_t> hashes) = 0;
  // Nothing is cached any more (a cache created or destroyed).
  virtual void cleared() = 0;
};

// The token counts a hit can have are the multiples of this: a hit ends where a window ends
// on a token boundary, every lcm(granule, bytes_per_token) bytes.
std::uint64_t hit_unit_tokens(std::uint64_t granule, std::uint64_t bytes_per_token);

}  // namespace kvvm
