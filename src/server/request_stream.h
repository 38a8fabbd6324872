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

#include "kvvm/base/mutex.h"
#include "kvvm/base/status.h"
#include "kvvm/engine/engine.h"

namespace kvvm::server {

// What arrived for one choice since the last take().
struct ChoiceUpdate {
  std::string text;               // new text, in order
  std::vector<std::int32_t> ids;  // new tokens
  // With log-probabilities asked: one per id; the prompt's once, in the choice's first update.
  std::vector<model::RowLogprobs> logprobs;
  std::vector<model::RowLogprobs> prompt_logprobs;
  bool finished = false;  // the choice ended (the fields below are set)
  engine::RequestEnd end = engine::RequestEnd::kLength;
  Status error;                    // end == kError
  double retry_after_seconds = 0;  // refused as overloaded in the queue
  engine::RequestStats stats;      // when finished
  bool empty() const { return text.empty() && ids.empty() && prompt_logprobs.empty() && !finished; }
};

// What arrived for every choice since the last take().
struct StreamUpdate {
  std::vector<ChoiceUpdate> choices;  // one per choice, by index
  bool finished = false;              // every choice has ended
  bool empty() const;
};

class RequestStream : public std::enable_shared_from_this<RequestStream> {
 public:
  // A stream of `choices` choices (every prompt's n) and the engine callbacks that feed it
  // (each holds the stream alive).
  static std::shared_ptr<RequestStream> make(std::uint32_t choices = 1);
  // The callback of one engine request, whose choice i is the stream's first + i.
  engine::RequestCallback callback(std::uint32_t first = 0);
  std::uint32_t choices() const { return choices_; }

  // Engine side: appends the event, for choice first + event.index. Never waits for the reader.
  void push(const engine::RequestEvent& event, std::uint32_t first = 0);

  // Handler side: waits until something arrived or `timeout` passed, then takes everything
  // that arrived since the last take (empty when the wait timed out). Once the finish has been
  // taken, later takes return at once with an empty update.
  StreamUpdate take(std::chrono::milliseconds timeout);
  // Whether every choice's finish has arrived (taken or not).
  bool finished() const;
  // The gaps between consecutive events of the first choice that brought tokens, seconds,
  // timed as the engine handed them over (one per step after the first token's: vLLM's
  // inter-token latency; the first token's wait is the time to first token, no gap).
  std::vector<double> inter_token_seconds() const;

 private:
  explicit RequestStream(std::uint32_t choices);
  const std::uint32_t choices_;
  mutable Mutex mutex_;
  std::condition_variable arrived_;
  StreamUpdate pending_ KVVM_GUARDED_BY(mutex_);
  std::vector<bool> ended_ KVVM_GUARDED_BY(mutex_);  // per choice: its finish arrived
  std::uint32_t finishes_seen_ KVVM_GUARDED_BY(mutex_) = 0;
  std::optional<std::chrono::steady_clock::time_point> last_token_at_ KVVM_GUARDED_BY(mutex_);
  std::vector<double> inter_token_seconds_ KVVM_GUARDED_BY(mutex_);
  bool finish_taken_ KVVM_GUARDED_BY(mutex_) = false;
};

}  // namespace kvvm::server
