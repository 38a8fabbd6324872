// A request of n choices: the first computes the prompt, the others fork its KV at the prompt's
// last token (which each then computes itself, drawing its first token with its own seed), so
// the prompt's KV is one copy and every choice samples through the ordinary decode path.
#include <string>

#include "kvvm/base/log.h"
#include "scheduler.h"

namespace kvvm::engine {

void Scheduler::fork_choices(RequestState& parent, Clock::time_point now) {
  std::vector<std::unique_ptr<RequestState>> forks = std::move(parent.forks);
  parent.forks.clear();
  // The fork ends one token short: the child computes the prompt's last token itself, so its
  // first draw comes from its own step (no logits row shared between choices).
  const std::uint32_t at = parent.prompt_size - 1;
  auto in_line = waiting_.begin();
  for (auto& child : forks) {
    child->prompt_logprobs = parent.prompt_logprobs;
    child->ever_admitted = true;
    child->admitted = now;
    child->stats.queue_seconds = std::chrono::duration<double>(now - child->submitted).count();
    // A one-token prompt leaves nothing before its last token to share: the child computes
    // its prompt itself, as a fork would have it compute that last token.
    if (at > 0 && running_.size() < options_.max_running && parent.slot) {
      Result<SlotId> slot = kv_.fork(*parent.slot, at);
      if (slot.ok()) {
        child->slot = *slot;
        child->computed = at;
        child->cache_known = child->prompt_size;  // a fork publishes nothing
        child->admission = ++admissions_;
        child->stats.cached_tokens = at;
        running_.push_back(std::move(child));
        continue;
      }
      const StatusCode code = slot.status().code();
      if (code != StatusCode::kResourceExhausted && code != StatusCode::kUnavailable) {
        log(LogLevel::kWarning,
            "engine: request " + std::to_string(parent.id) + ": forking choice " +
                std::to_string(child->index) +
                " failed, it computes its prompt itself: " + slot.status().to_string());
      }
    }
    // First in line, after the choices already placed: it has started (never refused as
    // overdue), and admission recomputes the prompt (or shares it through the prefix cache).
    in_line = std::next(waiting_.insert(in_line, std::move(child)));
  }
  counters_.peak_running =
      std::max(counters_.peak_running, static_cast<std::uint32_t>(running_.size()));
}

}  // namespace kvvm::engine
