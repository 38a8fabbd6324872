// The ZeroMQ publisher of kv_events.h.
//
// Why one thread owns both sockets: a ZeroMQ socket is not thread-safe, and the PUB socket's
// sends and the ROUTER's replays both read the replay buffer; one thread doing both needs no
// lock on either. The cache's calls only append to a queue under a leaf mutex and wake that
// thread when the queue was empty, so the stepping thread never waits on a socket or encodes.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "kv_events_encoding.h"
#include "kvvm/base/log.h"
#include "kvvm/base/mutex.h"
#include "kvvm/server/kv_events.h"

namespace kvvm::server {
namespace {

// How often the thread looks at the replay socket while no event comes.
constexpr std::chrono::milliseconds kReplayPoll{20};
// How long the PUB socket keeps trying to send what is left when it closes.
constexpr int kLingerMs = 1000;
// vLLM's end-of-replay sequence number: -1 as 8 big-endian bytes.
constexpr std::int64_t kEndOfReplay = -1;

std::string big_endian(std::uint64_t n) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[7 - i] = static_cast<char>(n >> (8 * i));
  return bytes;
}

// vLLM binds what names no peer (a wildcard, ipc://, inproc://) and dials the rest.
bool binds(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://");
}

class ZmqKvEventsPublisher final : public KvEventsPublisher {
 public:
  ZmqKvEventsPublisher(const KvEventsConfig& config, std::string medium)
      : config_(config), medium_(std::move(medium)), pub_(context_, zmq::socket_type::pub) {}

  Status open() {
    try {
      pub_.set(zmq::sockopt::sndhwm, static_cast<int>(config_.hwm));
      pub_.set(zmq::sockopt::linger, kLingerMs);
      if (binds(config_.endpoint)) {
        pub_.bind(config_.endpoint);
      } else {
        pub_.connect(config_.endpoint);
      }
    } catch (const zmq::error_t& e) {
      return Status::InvalidArgument("--kv-events-config: endpoint \"" + config_.endpoint +
                                     "\": " + e.what());
    }
    if (config_.replay_endpoint.has_value()) {
      try {
        replay_.emplace(context_, zmq::socket_type::router);
        replay_->set(zmq::sockopt::linger, 0);
        replay_->bind(*config_.replay_endpoint);
      } catch (const zmq::error_t& e) {
        return Status::InvalidArgument("--kv-events-config: replay_endpoint \"" +
                                       *config_.replay_endpoint + "\": " + e.what());
      }
    }
    thread_ = std::thread([this] { run(); });
    return Status::Ok();
  }

  ~ZmqKvEventsPublisher() override {
    {
      MutexLock lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  void stored(const StoredBlocks& blocks) override {
    KvEvent event;
    event.kind = KvEvent::Kind::kStored;
    event.hashes = blocks.hashes;
    event.parent = blocks.parent;
    event.ids = blocks.ids;
    event.block_tokens = blocks.block_tokens;
    push(std::move(event));
  }

  void removed(std::span<const std::uint64_t> hashes) override {
    KvEvent event;
    event.kind = KvEvent::Kind::kRemoved;
    event.hashes.assign(hashes.begin(), hashes.end());
    push(std::move(event));
  }

  void cleared() override { push(KvEvent{}); }

  KvEventsPublisherStats stats() const override {
    KvEventsPublisherStats s;
    {
      MutexLock lock(mutex_);
      s.events = events_;
      s.dropped = dropped_;
    }
    s.batches = batches_.load();
    s.bytes = bytes_.load();
    s.replays = replays_.load();
    return s;
  }

 private:
  void push(KvEvent event) {
    bool was_empty = false;
    {
      MutexLock lock(mutex_);
      ++events_;
      if (queue_.size() >= config_.max_queue_size) {
        // Forgetting is safe for a router, believing a block that went is not.
        dropped_ += queue_.size();
        queue_.clear();
        queue_.push_back(KvEvent{});
      }
      was_empty = queue_.empty();
      queue_.push_back(std::move(event));
    }
    if (was_empty) wake_.notify_one();
  }

  void run() {
    for (;;) {
      std::vector<KvEvent> batch;
      bool stopping = false;
      {
        MutexLock lock(mutex_);
        const auto ready = [this]()
                               KVVM_NO_THREAD_SAFETY_ANALYSIS { return stop_ || !queue_.empty(); };
        if (replay_.has_value()) {
          wake_.wait_for(lock.native(), kReplayPoll, ready);
        } else {
          wake_.wait(lock.native(), ready);
        }
        batch.swap(queue_);
        stopping = stop_;
      }
      if (!batch.empty()) publish(batch);
      if (replay_.has_value()) serve_replays();
      if (stopping) return;
    }
  }

  void publish(const std::vector<KvEvent>& events) {
    const double ts =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::string payload = encode_kv_event_batch(ts, events, 0, medium_, config_.encoding);
    const std::uint64_t seq = next_seq_++;
    try {
      pub_.send(zmq::buffer(config_.topic), zmq::send_flags::sndmore);
      pub_.send(zmq::buffer(big_endian(seq)), zmq::send_flags::sndmore);
      pub_.send(zmq::buffer(payload), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      log(LogLevel::kWarning, std::string("kv events: publish failed: ") + e.what());
    }
    ++batches_;
    bytes_ += payload.size();
    buffer_.emplace_back(seq, std::move(payload));
    while (buffer_.size() > config_.buffer_steps) buffer_.pop_front();
  }

  // Answers every replay request waiting: [identity, "", start seq] from a REQ client (vLLM's
  // subscriber) or [identity, start seq] from a DEALER.
  void serve_replays() {
    for (;;) {
      std::vector<zmq::message_t> frames;
      try {
        zmq::message_t frame;
        if (!replay_->recv(frame, zmq::recv_flags::dontwait)) return;
        frames.push_back(std::move(frame));
        while (frames.back().more()) {
          zmq::message_t more;
          (void)replay_->recv(more, zmq::recv_flags::none);
          frames.push_back(std::move(more));
        }
      } catch (const zmq::error_t& e) {
        log(LogLevel::kWarning, std::string("kv events: replay receive failed: ") + e.what());
        return;
      }
      const bool delimited = frames.size() == 3 && frames[1].size() == 0;
      if ((frames.size() != 2 && !delimited) || frames.back().size() != 8) {
        log(LogLevel::kWarning, "kv events: a malformed replay request ignored (" +
                                    std::to_string(frames.size()) + " frames)");
        continue;
      }
      const auto* start_bytes = static_cast<const unsigned char*>(frames.back().data());
      std::uint64_t start = 0;
      for (int i = 0; i < 8; ++i) start = start << 8 | start_bytes[i];
      const std::string identity = frames[0].to_string();
      const auto reply = [&](const std::string& seq, const std::string& payload) {
        replay_->send(zmq::buffer(identity), zmq::send_flags::sndmore);
        if (delimited) replay_->send(zmq::buffer(std::string()), zmq::send_flags::sndmore);
        replay_->send(zmq::buffer(seq), zmq::send_flags::sndmore);
        replay_->send(zmq::buffer(payload), zmq::send_flags::none);
      };
      try {
        for (const auto& [seq, payload] : buffer_) {
          if (seq >= start) reply(big_endian(seq), payload);
        }
        // Counted before the end marker goes out, so a client that has read the marker
        // sees its replay in stats().
        ++replays_;
        reply(big_endian(static_cast<std::uint64_t>(kEndOfReplay)), std::string());
      } catch (const zmq::error_t& e) {
        log(LogLevel::kWarning, std::string("kv events: replay send failed: ") + e.what());
      }
    }
  }

  const KvEventsConfig config_;
  const std::string medium_;
  zmq::context_t context_;
  zmq::socket_t pub_;                                         // the thread's once it runs
  std::optional<zmq::socket_t> replay_;                       // likewise
  std::deque<std::pair<std::uint64_t, std::string>> buffer_;  // the thread's
  std::uint64_t next_seq_ = 0;                                // the thread's

  // A leaf: nothing else is locked while it is held (the cache's lock is held around it).
  mutable Mutex mutex_;
  std::condition_variable wake_;
  std::vector<KvEvent> queue_ KVVM_GUARDED_BY(mutex_);
  bool stop_ KVVM_GUARDED_BY(mutex_) = false;
  std::uint64_t events_ KVVM_GUARDED_BY(mutex_) = 0;
  std::uint64_t dropped_ KVVM_GUARDED_BY(mutex_) = 0;
  std::atomic<std::uint64_t> batches_{0};
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::uint64_t> replays_{0};
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<KvEventsPublisher>> make_kv_events_publisher(const KvEventsConfig& config,
                                                                    std::string medium) {
  auto publisher = std::make_unique<ZmqKvEventsPublisher>(config, std::move(medium));
  KVVM_RETURN_IF_ERROR(publisher->open());
  return std::unique_ptr<KvEventsPublisher>(std::move(publisher));
}

}  // namespace kvvm::server
