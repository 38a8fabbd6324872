#include "request_stream.h"

#include <utility>

namespace kvvm::server {

std::shared_ptr<RequestStream> RequestStream::make() {
  return std::shared_ptr<RequestStream>(new RequestStream());
}

engine::RequestCallback RequestStream::callback() {
  // The engine keeps the callback until the request's last event; the handler may have gone
  // (a client that left), so the callback owns a reference.
  std::shared_ptr<RequestStream> self = shared_from_this();
  return [self](const engine::RequestEvent& event) { self->push(event); };
}

void RequestStream::push(const engine::RequestEvent& event) {
  const auto now = std::chrono::steady_clock::now();
  {
    MutexLock lock(mutex_);
    if (finish_seen_) return;  // nothing follows a finish
    pending_.text.append(event.text);
    pending_.tokens += event.tokens.size();
    if (!event.tokens.empty()) {
      if (last_token_at_) {
        inter_token_seconds_.push_back(
            std::chrono::duration<double>(now - *last_token_at_).count());
      }
      last_token_at_ = now;
    }
    if (event.finished) {
      finish_seen_ = true;
      pending_.finished = true;
      pending_.end = event.end;
      pending_.error = event.error;
      pending_.retry_after_seconds = event.retry_after_seconds;
      if (event.stats != nullptr) pending_.stats = *event.stats;
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
  if (taken.finished) finish_taken_ = true;
  return taken;
}

bool RequestStream::finished() const {
  MutexLock lock(mutex_);
  return finish_seen_;
}

std::vector<double> RequestStream::inter_token_seconds() const {
  MutexLock lock(mutex_);
  return inter_token_seconds_;
}

}  // namespace kvvm::server
