// The msgpack bytes of a KVEventBatch as vLLM's msgspec encoder writes them (kv_events.h):
// the batch an array [ts as float64, [events], data-parallel rank or nil]; each event an
// array [tag, fields in declaration order] (KvEventEncoding::kArray) or a map {"type": tag,
// field: value} (kMap), integers in their smallest msgpack form, as msgspec writes them.
// BlockStored's fields: block_hashes, parent_block_hash, token_ids, block_size, lora_id,
// medium, lora_name; BlockRemoved's: block_hashes, medium; AllBlocksCleared has none.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/kv/prefix/prefix_cache_events.h"
#include "kvvm/server/kv_events.h"

namespace kvvm::server {

struct KvEvent {
  enum class Kind { kStored, kRemoved, kCleared };
  Kind kind = Kind::kCleared;
  std::vector<std::uint64_t> hashes;    // stored, removed
  std::optional<std::uint64_t> parent;  // stored
  std::vector<TokenId> ids;             // stored
  std::uint64_t block_tokens = 0;       // stored
};

std::string encode_kv_event_batch(double ts, std::span<const KvEvent> events,
                                  std::optional<std::int64_t> rank, std::string_view medium,
                                  KvEventEncoding encoding);

}  // namespace kvvm::server
