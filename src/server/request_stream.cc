#include "request_stream.h"

#include <algorithm>
#include <utility>

namespace kvvm::server {

bool StreamUpdate::empty() const {
  return !finished && std::all_of(choices.begin(), choices.end(),
                                  [](const ChoiceUpdate& c) { return c.empty(); });
}

RequestStream::RequestStream(std::uint32_t choices)
    : choices_(std::max<std::uint32_t>(choices, 1)) {
  MutexLock lock(mutex_);
  pending_.choices.resize(choices_);
  ended_.resize(choices_);
}

std::shared_ptr<RequestStream> RequestStream::make(std::uint32_t choices) {
  return std::shared_ptr<RequestStream>(new RequestStream(choices));
}

engine::RequestCallback RequestStream::callback(std::uint32_t first) {
  // The engine keeps the callback until the request's last event; the handler may have gone
  // (a client that left), so the callback owns a reference.
  std::shared_ptr<RequestStream> self = shared_from_this();
  return [self, first](const engine::RequestEvent& event) { self->push(event, first); };
}

void RequestStream::push(const engine::RequestEvent& event, std::uint32_t first) {
  const auto now = std::chrono::steady_clock::now();
  const std::uint32_t index = first + event.index;
  if (index >= choices_) return;  // no such choice: the caller's mistake, never a crash
  {
    MutexLock lock(mutex_);
    if (ended_[index]) return;  // nothing follows a finish
    ChoiceUpdate& choice = pending_.choices[index];
    choice.text.append(event.text);
    choice.ids.insert(choice.ids.end(), event.tokens.begin(), event.tokens.end());
    choice.logprobs.insert(choice.logprobs.end(), event.logprobs.begin(), event.logprobs.end());
    // The prompt's come once, in the choice's first event: a later event must not clear them.
    if (!event.prompt_logprobs.empty()) {
      choice.prompt_logprobs.assign(event.prompt_logprobs.begin(), event.prompt_logprobs.end());
    }
    if (!event.tokens.empty() && index == 0) {
      if (last_token_at_) {
        inter_token_seconds_.push_back(
            std::chrono::duration<double>(now - *last_token_at_).count());
      }
      last_token_at_ = now;
    }
    if (event.finished) {
      choice.finished = true;
      choice.end = event.end;
      choice.error = event.error;
      choice.retry_after_seconds = event.retry_after_seconds;
      if (event.stats != nullptr) choice.stats = *event.stats;
      ended_[index] = true;
      if (++finishes_seen_ == choices_) pending_.finished = true;
    }
  }
  arrived_.notify_all();
}

StreamUpdate RequestStream::take(std::chrono::milliseconds timeout) {
  MutexLock lock(mutex_);
  if (finish_taken_) return {};
  arrived_.wait_for(lock.native(), timeout,
                    [this]() KVVM_REQUIRES(mutex_) { return !pending_.empty(); });
  StreamUpdate taken = std::move(pending_);
  pending_ = StreamUpdate{};
  pending_.choices.resize(choices_);
  if (taken.finished) finish_taken_ = true;
  return taken;
}

bool RequestStream::finished() const {
  MutexLock lock(mutex_);
  return finishes_seen_ == choices_;
}

std::vector<double> RequestStream::inter_token_seconds() const {
  MutexLock lock(mutex_);
  return inter_token_seconds_;
}

}  // namespace kvvm::server
