// How a request leaves the running set: ended (its slot released at once, its event delivered
// after the step) or preempted (its KV released, first in line to be recomputed).
#include <algorithm>

#include "kvvm/base/log.h"
#include "scheduler.h"

namespace kvvm::engine {

void Scheduler::touch(RequestState& r) {
  if (r.touched) return;
  r.touched = true;
  touched_.push_back(&r);
}

void Scheduler::end_request(RequestState& r, RequestEnd end, Status error) {
  if (r.finished) return;
  // The choices still waiting to fork from this one end as it does.
  for (auto& fork : r.forks) {
    fork->retry_after_seconds = r.retry_after_seconds;
    end_request(*fork, end, error);
  }
  r.finished = true;
  r.end = end;
  r.error = std::move(error);
  release_slot(r);
  touch(r);
}

void Scheduler::release_slot(RequestState& r) {
  if (draft_ != nullptr) draft_->release(r, /*driver_usable=*/!context_lost_);
  if (!r.slot) return;
  if (context_lost_) {
    r.slot.reset();  // every driver call fails on a lost context: its memory goes with it
    return;
  }
  const Status released = kv_.release(*r.slot);
  // The request's own outcome stands. A failed release changed nothing (a fence that could
  // not be recorded leaves the slot active, holding its bytes): it is tried again after the
  // step rather than forgotten, or the slot and its budget would be lost to every later request.
  if (!released.ok()) {
    log(LogLevel::kWarning, "engine: releasing slot " + std::to_string(*r.slot) + " of request " +
                                std::to_string(r.id) + ": " + released.to_string());
    unreleased_.push_back(*r.slot);
  }
  r.slot.reset();
}

bool Scheduler::retry_releases() {
  return std::erase_if(unreleased_, [&](SlotId slot) {
           const Status released = kv_.release(slot);
           // FailedPrecondition: no active sequence there any more (quarantined): nothing to do.
           return released.ok() || released.code() == StatusCode::kFailedPrecondition;
         }) > 0;
}

RequestState* Scheduler::newest_running() {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (!(*it)->finished) return it->get();
  }
  return nullptr;
}

std::size_t Scheduler::active_running() const {
  return static_cast<std::size_t>(
      std::count_if(running_.begin(), running_.end(), [](const auto& r) { return !r->finished; }));
}

void Scheduler::preempt(RequestState& victim) {
  release_slot(victim);
  victim.drafts.clear();
  victim.computed = 0;
  victim.cache_known = 0;
  ++victim.stats.preemptions;
  ++counters_.preemptions;
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const auto& r) { return r.get() == &victim; });
  if (it == running_.end()) return;
  // First in line: it was admitted before everything still waiting.
  waiting_.push_front(std::move(*it));
  running_.erase(it);
}

void Scheduler::finish_stats(RequestState& r, Clock::time_point now) {
  RequestStats& s = r.stats;
  s.generated_tokens = r.generated;
  s.total_seconds = std::chrono::duration<double>(now - r.submitted).count();
  if (!r.ever_admitted) s.queue_seconds = s.total_seconds;
  if (r.generated > 0) {
    s.time_to_first_token = std::chrono::duration<double>(r.first_token - r.submitted).count();
  }
  if (r.generated > 1) {
    s.time_per_output_token = std::chrono::duration<double>(r.last_token - r.first_token).count() /
                              static_cast<double>(r.generated - 1);
  }
  counters_.generated_tokens += r.generated;
  counters_.forced_tokens += r.stats.forced_tokens;
  admission_.note_ended(r);
  // A request of n choices counts once, by its first choice, and its prompt once.
  if (r.index != 0) return;
  switch (r.end) {
    case RequestEnd::kStop:
    case RequestEnd::kLength:
      ++counters_.finished;
      break;
    case RequestEnd::kCancelled:
      ++counters_.cancelled;
      break;
    case RequestEnd::kError:
      ++counters_.failed;
      break;
  }
  counters_.prompt_tokens += r.prompt_size;
  counters_.cached_tokens += s.cached_tokens;
}

}  // namespace kvvm::engine
