// The bridge from the engine's callbacks (its stepping thread, which must never wait on a
// client) to the HTTP handler thread that answers the request: a per-request channel of text
// pieces, token counts and the finish, under a mutex and a condition variable.
//
// The callback copies what the event holds (its spans and views are valid during the callback
// only) and returns at once; the handler takes what arrived with a bounded wait.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/mutex.h"
#include "kvvm/status.h"

namespace kvvm::server {

// What arrived since the last take().
struct StreamUpdate {
  std::string text;          // new text, in order
  std::uint64_t tokens = 0;  // new tokens
  bool finished = false;     // the request ended (the fields below are set)
  engine::RequestEnd end = engine::RequestEnd::kLength;
  Status error;                    // end == kError
  double retry_after_seconds = 0;  // refused as overloaded in the queue
  engine::RequestStats stats;      // when finished
  bool empty() const { return text.empty() && tokens == 0 && !finished; }
};

class RequestStream : public std::enable_shared_from_this<RequestStream> {
 public:
  // A stream and the engine callback that feeds it (the callback holds the stream alive).
  static std::shared_ptr<RequestStream> make();
  engine::RequestCallback callback();

  // Engine side: appends the event. Never waits for the reader.
  void push(const engine::RequestEvent& event);

  // Handler side: waits until something arrived or `timeout` passed, then takes everything
  // that arrived since the last take (empty when the wait timed out). Once the finish has been
  // taken, later takes return at once with an empty update.
  StreamUpdate take(std::chrono::milliseconds timeout);
  // Whether the finish has arrived (taken or not).
  bool finished() const;
  // The gaps between consecutive events that brought tokens, seconds, timed as the engine
  // handed them over (one per step after the first token's: vLLM's inter-token latency; the
  // first token's wait is the time to first token, no gap).
  std::vector<double> inter_token_seconds() const;

 private:
  RequestStream() = default;
  mutable Mutex mutex_;
  std::condition_variable arrived_;
  StreamUpdate pending_ KVVM_GUARDED_BY(mutex_);
  std::optional<std::chrono::steady_clock::time_point> last_token_at_ KVVM_GUARDED_BY(mutex_);
  std::vector<double> inter_token_seconds_ KVVM_GUARDED_BY(mutex_);
  bool finish_seen_ KVVM_GUARDED_BY(mutex_) = false;
  bool finish_taken_ KVVM_GUARDED_BY(mutex_) = false;
};

}  // namespace kvvm::server
