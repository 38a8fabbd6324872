// The KV events' wire format and sockets (kv_events.h): the msgpack bytes of known batches
// against bytes written by hand from msgpack's specification and vLLM's struct declarations,
// in both layouts; --kv-events-config's parse and its errors; the PUB socket's three frames and
// sequence numbers, the replay socket's answer and end marker, the bounded replay buffer; and
// the cost of an event to the thread that reports it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kvvm/server/kv_events.h"

#if KVVM_KV_EVENTS
#include <zmq.hpp>

#include "server/kv_events_encoding.h"
#endif

namespace kvvm::server {
namespace {

TEST(ServerKvEventsConfig, VllmsFieldsAndKvvmsAreRead) {
  Result<KvEventsConfig> config = parse_kv_events_config(
      R"({"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:6000",
          "replay_endpoint": "tcp://*:6001", "buffer_steps": 5, "hwm": 7,
          "max_queue_size": 9, "topic": "kv", "encoding": "map", "block_size": 32})");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_TRUE(config->publishes());
  EXPECT_EQ(config->endpoint, "tcp://*:6000");
  EXPECT_EQ(config->replay_endpoint, "tcp://*:6001");
  EXPECT_EQ(config->buffer_steps, 5u);
  EXPECT_EQ(config->hwm, 7u);
  EXPECT_EQ(config->max_queue_size, 9u);
  EXPECT_EQ(config->topic, "kv");
  EXPECT_EQ(config->encoding, KvEventEncoding::kMap);
  EXPECT_EQ(config->block_size, 32u);
  // vLLM's defaults: the publisher follows enable_kv_cache_events.
  Result<KvEventsConfig> defaults = parse_kv_events_config(R"({"enable_kv_cache_events": true})");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->publisher, "zmq");
  EXPECT_EQ(defaults->endpoint, "tcp://*:5557");
  EXPECT_FALSE(defaults->replay_endpoint.has_value());
  EXPECT_EQ(defaults->encoding, KvEventEncoding::kArray);
  Result<KvEventsConfig> off = parse_kv_events_config(R"({"enable_kv_cache_events": false})");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->publishes());
  EXPECT_EQ(off->publisher, "null");
}

TEST(ServerKvEventsConfig, ABadFieldIsNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"enable_kv_cache_events": "yes"})", "enable_kv_cache_events"},
      {R"({"publisher": "kafka"})", "publisher"},
      {R"({"endpoint": 5557})", "endpoint"},
      {R"({"buffer_steps": 0})", "buffer_steps"},
      {R"({"hwm": -1})", "hwm"},
      {R"({"max_queue_size": 1.5})", "max_queue_size"},
      {R"({"encoding": "json"})", "encoding"},
      {R"({"block_sise": 16})", "block_sise"},
      {R"([1, 2])", "expected a JSON object"},
      {R"({"topic": )", "--kv-events-config"},
  };
  for (const auto& [json, named] : cases) {
    Result<KvEventsConfig> config = parse_kv_events_config(json);
    ASSERT_FALSE(config.ok()) << json;
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << json;
    EXPECT_NE(config.status().to_string().find(named), std::string::npos)
        << json << ": " << config.status().to_string();
  }
}

#if KVVM_KV_EVENTS

// Bytes from hex pairs and quoted text: "93 cb" "'GPU'".
std::string bytes(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view part : parts) {
    if (part.starts_with('\'')) {
      out.append(part.substr(1, part.size() - 2));
      continue;
    }
    for (std::size_t i = 0; i + 1 < part.size() + 1; i += 3) {
      out.push_back(static_cast<char>(std::stoi(std::string(part.substr(i, 2)), nullptr, 16)));
    }
  }
  return out;
}

std::vector<KvEvent> known_events() {
  KvEvent stored;
  stored.kind = KvEvent::Kind::kStored;
  stored.hashes = {1, 0xFFFFFFFFFFFFFFFFull};
  stored.ids = {1, 300, 70000, 5};
  stored.block_tokens = 2;
  KvEvent child = stored;
  child.hashes = {7};
  child.parent = 0x80;
  child.ids = {1, 2};
  KvEvent removed;
  removed.kind = KvEvent::Kind::kRemoved;
  removed.hashes = {5};
  return {stored, child, removed, KvEvent{}};
}

TEST(ServerKvEventsEncoding, ArrayLikeBatchIsVllmsPositionalLayout) {
  const std::string got =
      encode_kv_event_batch(1.5, known_events(), 0, "GPU", KvEventEncoding::kArray);
  const std::string want = bytes({
      "93 cb 3f f8 00 00 00 00 00 00 94",  // [ts 1.5 as float64, 4 events, ...
      // ["BlockStored", [1, 2^64-1], nil, [1, 300, 70000, 5], 2, nil, "GPU", nil]
      "98 ab", "'BlockStored'", "92 01 cf ff ff ff ff ff ff ff ff c0",
      "94 01 cd 01 2c ce 00 01 11 70 05 02 c0 a3", "'GPU'", "c0",
      // ["BlockStored", [7], 128, [1, 2], 2, nil, "GPU", nil]
      "98 ab", "'BlockStored'", "91 07 cc 80 92 01 02 02 c0 a3", "'GPU'", "c0",
      // ["BlockRemoved", [5], "GPU"]
      "93 ac", "'BlockRemoved'", "91 05 a3", "'GPU'",
      // ["AllBlocksCleared"]
      "91 b0", "'AllBlocksCleared'",
      "00",  // ..., rank 0]
  });
  EXPECT_EQ(got, want);
}

TEST(ServerKvEventsEncoding, MapBatchNamesEveryFieldAfterItsTypeTag) {
  const std::string got =
      encode_kv_event_batch(1.5, known_events(), std::nullopt, "CPU", KvEventEncoding::kMap);
  const std::string want = bytes({
      "93 cb 3f f8 00 00 00 00 00 00 94",
      "88 a4",
      "'type'",
      "ab",
      "'BlockStored'",
      "ac",
      "'block_hashes'",
      "92 01 cf ff ff ff ff ff ff ff ff b1",
      "'parent_block_hash'",
      "c0 a9",
      "'token_ids'",
      "94 01 cd 01 2c ce 00 01 11 70 05 aa",
      "'block_size'",
      "02 a7",
      "'lora_id'",
      "c0 a6",
      "'medium'",
      "a3",
      "'CPU'",
      "a9",
      "'lora_name'",
      "c0",
      "88 a4",
      "'type'",
      "ab",
      "'BlockStored'",
      "ac",
      "'block_hashes'",
      "91 07 b1",
      "'parent_block_hash'",
      "cc 80 a9",
      "'token_ids'",
      "92 01 02 aa",
      "'block_size'",
      "02 a7",
      "'lora_id'",
      "c0 a6",
      "'medium'",
      "a3",
      "'CPU'",
      "a9",
      "'lora_name'",
      "c0",
      "83 a4",
      "'type'",
      "ac",
      "'BlockRemoved'",
      "ac",
      "'block_hashes'",
      "91 05 a6",
      "'medium'",
      "a3",
      "'CPU'",
      "81 a4",
      "'type'",
      "b0",
      "'AllBlocksCleared'",
      "c0",  // no rank: nil
  });
  EXPECT_EQ(got, want);
}

std::string ipc_endpoint(const std::string& name) {
  return "ipc://" + (std::filesystem::temp_directory_path() /
                     ("kvvm-" + name + "-" + std::to_string(::getpid())))
                        .string();
}

// The 8 big-endian bytes of a frame as a signed number.
std::int64_t sequence_of(const zmq::message_t& frame) {
  EXPECT_EQ(frame.size(), 8u);
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < frame.size(); ++i) {
    n = n << 8 | static_cast<const unsigned char*>(frame.data())[i];
  }
  return static_cast<std::int64_t>(n);
}

std::vector<zmq::message_t> receive_all(zmq::socket_t& socket, int timeout_ms) {
  std::vector<zmq::message_t> frames;
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) <= 0) return frames;
  do {
    zmq::message_t frame;
    EXPECT_TRUE(socket.recv(frame, zmq::recv_flags::none).has_value());
    frames.push_back(std::move(frame));
  } while (frames.back().more());
  return frames;
}

TEST(ServerKvEventsPublisher, PublishesThreeFramesInSequenceAndReplaysWhatItBuffers) {
  KvEventsConfig config;
  config.enable_kv_cache_events = true;
  config.publisher = "zmq";
  config.endpoint = ipc_endpoint("pub");
  config.replay_endpoint = ipc_endpoint("replay");
  config.buffer_steps = 3;
  config.topic = "kv-events";
  auto made = make_kv_events_publisher(config, "CPU");
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  KvEventsPublisher& publisher = **made;

  zmq::context_t context;
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv-events");
  sub.connect(config.endpoint);
  // A subscription reaches a PUB socket a moment after connect: send until one arrives.
  std::vector<zmq::message_t> first;
  for (int i = 0; i < 100 && first.empty(); ++i) {
    publisher.cleared();
    first = receive_all(sub, 20);
  }
  ASSERT_EQ(first.size(), 3u);
  std::int64_t last = sequence_of(first[1]);
  while (!receive_all(sub, 50).empty()) ++last;  // the other tries' batches

  // Batch by batch, each seen before the next is reported.
  const std::vector<std::uint64_t> hashes = {42};
  for (int i = 0; i < 5; ++i) {
    StoredBlocks blocks;
    blocks.hashes = {static_cast<std::uint64_t>(100 + i)};
    blocks.ids = {1, 2};
    blocks.block_tokens = 2;
    publisher.stored(blocks);
    const std::vector<zmq::message_t> frames = receive_all(sub, 2000);
    ASSERT_EQ(frames.size(), 3u);
    EXPECT_EQ(frames[0].to_string(), "kv-events");
    EXPECT_EQ(sequence_of(frames[1]), ++last);
    KvEvent want;
    want.kind = KvEvent::Kind::kStored;
    want.hashes = blocks.hashes;
    want.ids = blocks.ids;
    want.block_tokens = 2;
    // The payload is the encoding of that one event at the batch's own time (bytes 2..9).
    const std::string payload = frames[2].to_string();
    ASSERT_GT(payload.size(), 10u);
    double ts = 0;
    std::uint64_t bits = 0;
    for (int b = 0; b < 8; ++b) bits = bits << 8 | static_cast<unsigned char>(payload[2 + b]);
    std::memcpy(&ts, &bits, sizeof ts);
    EXPECT_NEAR(
        ts,
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(),
        60.0);
    const std::vector<KvEvent> one = {want};
    EXPECT_EQ(payload, encode_kv_event_batch(ts, one, 0, "CPU", KvEventEncoding::kArray));
  }

  // A DEALER sending a REQ's empty delimiter (a REQ takes one reply only): from `last - 1`
  // on, of the 3 batches buffered, then vLLM's end marker.
  const auto replay_from = [&](std::int64_t from) {
    zmq::socket_t dealer(context, zmq::socket_type::dealer);
    dealer.connect(*config.replay_endpoint);
    std::string start(8, '\0');
    for (int b = 0; b < 8; ++b) start[7 - b] = static_cast<char>(from >> (8 * b));
    dealer.send(zmq::buffer(std::string()), zmq::send_flags::sndmore);
    dealer.send(zmq::buffer(start), zmq::send_flags::none);
    std::vector<std::int64_t> replayed;
    for (;;) {
      std::vector<zmq::message_t> frames = receive_all(dealer, 2000);
      EXPECT_EQ(frames.size(), 3u);
      if (frames.size() != 3) break;
      EXPECT_EQ(frames[0].size(), 0u);
      if (frames[2].size() == 0) {
        EXPECT_EQ(sequence_of(frames[1]), -1);
        break;
      }
      replayed.push_back(sequence_of(frames[1]));
    }
    return replayed;
  };
  EXPECT_EQ(replay_from(last - 1), (std::vector<std::int64_t>{last - 1, last}));
  // From 0: only what the buffer still holds (buffer_steps 3).
  EXPECT_EQ(replay_from(0), (std::vector<std::int64_t>{last - 2, last - 1, last}));
  const KvEventsPublisherStats stats = publisher.stats();
  EXPECT_EQ(stats.batches, static_cast<std::uint64_t>(last + 1));
  EXPECT_EQ(stats.replays, 2u);
  EXPECT_GT(stats.bytes, 0u);
  EXPECT_EQ(stats.dropped, 0u);
}

TEST(ServerKvEventsPublisher, AnEndpointZeroMqRefusesIsNamed) {
  KvEventsConfig config;
  config.enable_kv_cache_events = true;
  config.publisher = "zmq";
  config.endpoint = "tcp://*:notaport";
  auto made = make_kv_events_publisher(config, "GPU");
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().to_string().find("endpoint"), std::string::npos);
}

// What an event costs the thread that reports it (the engine's, under the cache's lock): a
// copy into a queue. A step at 256 running publishes a few blocks at most, so microseconds
// an event keep publishing far under 1 % of a step of tens of milliseconds.
TEST(ServerKvEventsPublisher, ReportingAnEventCostsMicrosecondsAtMost) {
  KvEventsConfig config;
  config.enable_kv_cache_events = true;
  config.publisher = "zmq";
  config.endpoint = ipc_endpoint("cost");
  auto made = make_kv_events_publisher(config, "CPU");
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  StoredBlocks blocks;
  blocks.hashes = {1};
  blocks.ids.assign(16, 7);
  blocks.block_tokens = 16;
  constexpr int kEvents = 100000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kEvents; ++i) {
    blocks.hashes[0] = static_cast<std::uint64_t>(i);
    (*made)->stored(blocks);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double per_event_ns = seconds / kEvents * 1e9;
  std::printf("kv events: %.0f ns an event reported (one 16-token block), %d events\n",
              per_event_ns, kEvents);
  EXPECT_LT(per_event_ns, 20000.0);
  made->reset();  // sends what is left
}

#else

TEST(ServerKvEventsPublisher, WithoutTheLibrariesAskingForEventsNamesWhatIsMissing) {
  KvEventsConfig config;
  config.enable_kv_cache_events = true;
  config.publisher = "zmq";
  auto made = make_kv_events_publisher(config, "CPU");
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kUnavailable);
}

#endif

}  // namespace
}  // namespace kvvm::server
