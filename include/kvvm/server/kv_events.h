// KV-cache events as vLLM publishes them (docs/ARCHITECTURE.md "KV events"), so a router
// built for vLLM (llm-d's KV-cache indexer, the Gateway API Inference Extension) indexes
// kvvm's prefix cache unchanged: a ZeroMQ PUB socket sends [topic, 8-byte big-endian sequence
// number, msgpack KVEventBatch] for every batch of BlockStored / BlockRemoved /
// AllBlocksCleared facts, and a ROUTER socket answers a replay request (a starting sequence
// number) with the batches it still buffers, then an end marker.
//
// The publisher is the prefix cache's observer (kvvm/kv/prefix/prefix_cache_events.h): the
// cache's calls only queue events (no socket, no encoding, no waiting); a thread of its own
// encodes, sends and serves replays. When the queue is full the events queued are replaced by
// one AllBlocksCleared, so a router that missed facts forgets rather than believes: it may
// then underestimate kvvm's hits, never overestimate them.
//
// Built only with ZeroMQ (cppzmq) and msgpack-cxx; without them make_kv_events_publisher says
// which library is missing.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kvvm/base/status.h"
#include "kvvm/kv/prefix/prefix_cache_events.h"

namespace kvvm::server {

// How events are laid out. vLLM's structs are msgspec tagged structs: up to PR #42892
// (vLLM 0.25 and before) `array_like`, each event an array [tag, fields...]; from vLLM 0.26,
// a map {"type": tag, field: value, ...}. The batch is an array [ts, events, rank] in both.
enum class KvEventEncoding { kArray, kMap };

// `--kv-events-config`: vLLM's KVEventsConfig JSON, plus two fields of kvvm's own.
struct KvEventsConfig {
  bool enable_kv_cache_events = false;
  std::string publisher;                  // "zmq" or "null"; empty: "zmq" when enabled, else "null"
  std::string endpoint = "tcp://*:5557";  // bound with '*', '::', ipc:// or inproc://, else dialled
  std::optional<std::string> replay_endpoint;  // always bound
  std::uint64_t buffer_steps = 10000;          // batches kept for replay
  std::uint64_t hwm = 100000;                  // the PUB socket's send high-water mark
  std::uint64_t max_queue_size = 100000;       // events queued for the publisher thread
  std::string topic;
  // kvvm's own: the layout ("array" or "map") and the tokens of a block (0: the cache's
  // default, see PrefixCacheOptions::event_block_tokens).
  KvEventEncoding encoding = KvEventEncoding::kArray;
  std::uint64_t block_size = 0;

  bool publishes() const { return enable_kv_cache_events && publisher == "zmq"; }
};

// Parses the JSON; InvalidArgument naming the field for a wrong type, an unknown field or a
// bad value.
Result<KvEventsConfig> parse_kv_events_config(std::string_view json);

struct KvEventsPublisherStats {
  std::uint64_t events = 0;   // events queued by the cache
  std::uint64_t batches = 0;  // batches sent
  std::uint64_t bytes = 0;    // payload bytes sent (msgpack)
  std::uint64_t dropped = 0;  // events dropped for a full queue (replaced by AllBlocksCleared)
  std::uint64_t replays = 0;  // replay requests answered
};

class KvEventsPublisher : public PrefixCacheObserver {
 public:
  // Sends what is still queued (for up to a second), then closes its sockets.
  ~KvEventsPublisher() override = default;
  virtual KvEventsPublisherStats stats() const = 0;
};

// A publisher bound to config's endpoints; `medium` is "GPU" or "CPU", where the KV lives.
// Unavailable when kvvm was built without ZeroMQ or msgpack-cxx (naming which); InvalidArgument
// for an endpoint ZeroMQ refuses (naming the field).
Result<std::unique_ptr<KvEventsPublisher>> make_kv_events_publisher(const KvEventsConfig& config,
                                                                    std::string medium);

}  // namespace kvvm::server
