// encode_kv_event_batch: see kv_events_encoding.h.
#include "kv_events_encoding.h"

#include <msgpack.hpp>

namespace kvvm::server {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_string(Packer& packer, std::string_view text) {
  packer.pack_str(static_cast<std::uint32_t>(text.size()));
  packer.pack_str_body(text.data(), static_cast<std::uint32_t>(text.size()));
}

void pack_hashes(Packer& packer, const std::vector<std::uint64_t>& hashes) {
  packer.pack_array(static_cast<std::uint32_t>(hashes.size()));
  for (std::uint64_t hash : hashes) packer.pack_uint64(hash);
}

// One field: its name first in a map, nothing in an array.
void key(Packer& packer, KvEventEncoding encoding, std::string_view name) {
  if (encoding == KvEventEncoding::kMap) pack_string(packer, name);
}

void pack_event(Packer& packer, const KvEvent& event, std::string_view medium,
                KvEventEncoding encoding) {
  const bool map = encoding == KvEventEncoding::kMap;
  // msgspec's tag: the first element of an array, the "type" field of a map.
  const auto open = [&](std::string_view tag, std::uint32_t fields) {
    if (map) {
      packer.pack_map(fields + 1);
      pack_string(packer, "type");
    } else {
      packer.pack_array(fields + 1);
    }
    pack_string(packer, tag);
  };
  switch (event.kind) {
    case KvEvent::Kind::kStored:
      open("BlockStored", 7);
      key(packer, encoding, "block_hashes");
      pack_hashes(packer, event.hashes);
      key(packer, encoding, "parent_block_hash");
      if (event.parent.has_value()) {
        packer.pack_uint64(*event.parent);
      } else {
        packer.pack_nil();
      }
      key(packer, encoding, "token_ids");
      packer.pack_array(static_cast<std::uint32_t>(event.ids.size()));
      for (TokenId id : event.ids) packer.pack_uint32(id);
      key(packer, encoding, "block_size");
      packer.pack_uint64(event.block_tokens);
      key(packer, encoding, "lora_id");
      packer.pack_nil();
      key(packer, encoding, "medium");
      pack_string(packer, medium);
      key(packer, encoding, "lora_name");
      packer.pack_nil();
      return;
    case KvEvent::Kind::kRemoved:
      open("BlockRemoved", 2);
      key(packer, encoding, "block_hashes");
      pack_hashes(packer, event.hashes);
      key(packer, encoding, "medium");
      pack_string(packer, medium);
      return;
    case KvEvent::Kind::kCleared:
      open("AllBlocksCleared", 0);
      return;
  }
}

}  // namespace

std::string encode_kv_event_batch(double ts, std::span<const KvEvent> events,
                                  std::optional<std::int64_t> rank, std::string_view medium,
                                  KvEventEncoding encoding) {
  msgpack::sbuffer buffer;
  Packer packer(buffer);
  packer.pack_array(3);
  packer.pack_double(ts);
  packer.pack_array(static_cast<std::uint32_t>(events.size()));
  for (const KvEvent& event : events) pack_event(packer, event, medium, encoding);
  if (rank.has_value()) {
    packer.pack_int64(*rank);
  } else {
    packer.pack_nil();
  }
  return std::string(buffer.data(), buffer.size());
}

}  // namespace kvvm::server
