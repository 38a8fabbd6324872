// The step's plan: who runs, which chunk of which prompt, whose KV grows, who is admitted,
// preempted or refused.
#include "scheduler.h"

#include <algorithm>
#include <optional>
#include <string>

#include "logit_transforms.h"

namespace kvvm::engine {
namespace {

// Moves the finished requests of `from` into `done`, keeping the order of the rest.
template <typename Container>
void sweep_finished(Container& from, std::vector<std::unique_ptr<RequestState>>& done) {
  auto keep = from.begin();
  for (auto it = from.begin(); it != from.end(); ++it) {
    if ((*it)->finished) {
      done.push_back(std::move(*it));
    } else {
      if (keep != it) *keep = std::move(*it);
      ++keep;
    }
  }
  from.erase(keep, from.end());
}

}  // namespace

Scheduler::Scheduler(const model::Model& model, KvManager& kv, const EngineOptions& options,
                     AdmissionControl& admission)
    : model_(model), kv_(kv), options_(options), admission_(admission) {
  running_.reserve(options_.max_running);
  touched_.reserve(model.limits().max_chunks);
}

void Scheduler::enqueue(std::unique_ptr<RequestState> r) { waiting_.push_back(std::move(r)); }

void Scheduler::cancel(std::span<const RequestId> ids) {
  // Every choice of the request: running, waiting, or waiting on the first to fork.
  for (const RequestId id : ids) {
    for (auto& r : running_) {
      if (r->id == id) end_request(*r, RequestEnd::kCancelled);
    }
    for (auto& r : waiting_) {
      if (r->id == id) end_request(*r, RequestEnd::kCancelled);
    }
  }
  if (!touched_.empty()) {  // only ends so far: the cancelled
    sweep_finished(running_, done_);
    sweep_finished(waiting_, done_);
  }
}

void Scheduler::cancel_all() {
  for (auto& r : running_) end_request(*r, RequestEnd::kCancelled);
  for (auto& r : waiting_) end_request(*r, RequestEnd::kCancelled);
  sweep_finished(running_, done_);
  sweep_finished(waiting_, done_);
}

void Scheduler::lose_context(const Status& lost) {
  context_lost_ = true;
  for (auto& r : running_) end_request(*r, RequestEnd::kError, lost);
  for (auto& r : waiting_) end_request(*r, RequestEnd::kError, lost);
  unreleased_.clear();
}

StepPlan Scheduler::schedule(Clock::time_point now) {
  StepPlan plan;
  plan.chunks.reserve(model_.limits().max_chunks);
  Room room{.tokens = options_.step_tokens,
            .transforms = model_.limits().max_logit_adjustments,
            .prefill = options_.max_prefill_tokens_while_decoding != 0
                           ? options_.max_prefill_tokens_while_decoding
                           : options_.step_tokens};
  // Decode tokens first: a running answer never waits behind a new prompt. With speculative
  // decoding each is followed by its proposals' rows, while the step has room for them.
  const bool speculate = speculates_this_step();
  for (auto& r : running_) {
    if (room.tokens == 0 || plan.chunks.size() == model_.limits().max_chunks) break;
    if (r->finished || r->missing() != 1) continue;
    const bool planned = plan_chunk(plan, room, *r, 1);
    room.decoding = planned || room.decoding;
    if (planned && speculate) plan_drafts(plan, room, *r);
  }
  // The share a time-per-token target leaves after this step's decode tokens, raised to what
  // the prompts without a first token need to meet a time-to-first-token target (never past
  // the bound the step had without either).
  if (room.decoding) {
    const auto decodes = static_cast<std::uint32_t>(plan.chunks.size());
    const std::optional<std::uint32_t> share = admission_.prefill_share(decodes);
    if (share && *share < room.prefill) {
      const std::optional<std::uint32_t> due = admission_.deadline_share(
          decodes, std::min(room.prefill, room.tokens), running_, waiting_, now);
      room.prefill = std::max(*share, due.value_or(0));
    }
  }
  // Then the prompts already running, within what decodes leave of the prefill share.
  for (auto& r : running_) {
    if (!room_for_prefill(plan, room)) break;
    if (r->finished || r->missing() <= 1) continue;
    plan_chunk(plan, room, *r, chunk_tokens(*r, room));
  }
  commit_planned(plan);
  if (draft_ != nullptr && speculate) propose_with_draft(plan);
  // New requests only into what the running ones left, after their growth is committed: one
  // admitted now is computed in this step, never preempted by it. A step that had to preempt
  // admits nothing: the room it took back belongs to the sequences already running.
  if (plan.preempted.empty()) admit_waiting(plan, room, now);
  // After admission, so that a request the step could admit is served however late it came.
  refuse_overdue(plan, now);
  plan.tokens = 0;
  plan.decode_only = true;
  for (const ScheduledChunk& c : plan.chunks) {
    plan.tokens += c.tokens;
    plan.decode_only = plan.decode_only && c.tokens == 1;
  }
  if (plan.decode_only && !plan.chunks.empty()) {
    const auto bucket = std::lower_bound(buckets_.begin(), buckets_.end(), plan.chunks.size());
    if (bucket != buckets_.end()) plan.graph_bucket = *bucket;
  }
  return plan;
}

bool Scheduler::room_for_prefill(const StepPlan& plan, const Room& room) const {
  return room.tokens > 0 && plan.chunks.size() < model_.limits().max_chunks &&
         (!room.decoding || room.prefill > 0);
}

std::uint32_t Scheduler::chunk_tokens(const RequestState& r, const Room& room) const {
  if (r.missing() <= 1) return r.missing();  // a decode token (or a prompt cached but its last)
  std::uint32_t n = std::min({r.missing(), options_.prefill_chunk, room.tokens});
  if (room.decoding) n = std::min(n, room.prefill);
  return n;
}

bool Scheduler::plan_chunk(StepPlan& plan, Room& room, RequestState& r, std::uint32_t n) {
  if (n == 0 || n > room.tokens || plan.chunks.size() == model_.limits().max_chunks) return false;
  // The draws' logit transforms share the model's bound; a chunk whose transforms do not fit
  // waits a step (one alone always fits: the bound holds a vocabulary). A mid-prompt draw is
  // moot.
  if (r.computed + n == r.tokens.size()) {
    const std::size_t bound = logit_transform_bound(r, model_.config().vocab_size);
    if (bound > room.transforms) return false;
    room.transforms -= bound;
  }
  plan.chunks.push_back(ScheduledChunk{.request = &r, .start = r.computed, .tokens = n});
  room.tokens -= n;
  if (n > 1 || r.missing() > 1) room.prefill -= std::min(room.prefill, n);
  return true;
}

void Scheduler::commit_planned(StepPlan& plan) {
  // Growth refused after reclaim preempts the newest sequence (possibly this one) and tries
  // again; one that cannot fit alone fails. (Preallocated slots grow through nothing: the KV
  // manager answers OK at once.)
  for (ScheduledChunk& c : plan.chunks) {
    if (c.draft > 0 && c.request != nullptr) {
      commit_draft(plan, c);
      continue;
    }
    while (c.request != nullptr) {
      RequestState& r = *c.request;
      Status grown = kv_.ensure(*r.slot, std::uint64_t{c.start} + c.tokens);
      if (grown.ok()) break;
      if (grown.code() != StatusCode::kResourceExhausted) {
        end_request(r, RequestEnd::kError,
                    grown.with_context("committing KV through token " +
                                       std::to_string(c.start + c.tokens)));
        c.request = nullptr;
        break;
      }
      RequestState* victim = newest_running();
      if (victim == &r && active_running() == 1) {
        if (retry_releases()) continue;  // the room was held by a slot not yet released
        end_request(r, RequestEnd::kError,
                    grown.with_context("the sequence alone cannot grow to " +
                                       std::to_string(c.start + c.tokens) + " tokens"));
        c.request = nullptr;
        break;
      }
      for (ScheduledChunk& other : plan.chunks) {
        if (other.request == victim) other.request = nullptr;
      }
      plan.preempted.push_back(victim);
      preempt(*victim);
    }
  }
  std::erase_if(plan.chunks, [](const ScheduledChunk& c) {
    return c.request == nullptr || c.request->finished;
  });
}

void Scheduler::admit_waiting(StepPlan& plan, Room& room, Clock::time_point now) {
  while (!waiting_.empty() && running_.size() < options_.max_running &&
         room_for_prefill(plan, room)) {
    RequestState& r = *waiting_.front();
    // A prompt whose log-probabilities are wanted is computed whole: cached tokens have no
    // logits.
    Result<KvAdmission> admitted =
        kv_.admit(r.tokens, r.request.tenant, !r.wants_prompt_logprobs());
    Status refused = admitted.ok() ? Status::Ok() : admitted.status();
    if (admitted.ok()) {
      r.slot = admitted->slot;
      r.computed = static_cast<std::uint32_t>(admitted->cached_tokens);
      // The first chunk's KV is committed with the admission, or the admission is undone: a
      // sequence admitted without it would be the newest, the first preempted, its work lost.
      const std::uint32_t n = chunk_tokens(r, room);
      refused = kv_.ensure(*r.slot, std::uint64_t{r.computed} + n);
      if (!refused.ok()) {
        release_slot(r);
        r.computed = 0;
      }
    }
    if (!refused.ok()) {
      const bool later = refused.code() == StatusCode::kResourceExhausted ||
                         refused.code() == StatusCode::kUnavailable;
      // Refused for now: it stays first in line, unless nothing running could ever make room.
      if (later && active_running() > 0) break;
      // A slot whose release failed earlier may hold the room: free it and try again.
      if (later && retry_releases()) continue;
      end_request(r, RequestEnd::kError,
                  refused.with_context("admitting " + std::to_string(r.tokens.size()) + " tokens"));
      plan.refused.push_back(&r);
      done_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      continue;
    }
    const std::uint64_t cached = admitted->cached_tokens;
    r.cache_known = static_cast<std::uint32_t>(r.tokens.size());
    r.admission = ++admissions_;
    r.stats.cached_tokens = static_cast<std::uint32_t>(cached);
    const bool first = !r.ever_admitted;
    if (first) {
      r.ever_admitted = true;
      r.admitted = now;
      r.stats.queue_seconds = std::chrono::duration<double>(now - r.submitted).count();
    }
    admission_.note_admission(r, first);
    plan_chunk(plan, room, r, chunk_tokens(r, room));
    plan.admitted.push_back(&r);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  counters_.peak_running =
      std::max(counters_.peak_running, static_cast<std::uint32_t>(running_.size()));
}

// After admission, so that a request the step could admit is served however late the step
// came (a busy or descheduled engine thread is not the queue being full).
void Scheduler::refuse_overdue(StepPlan& plan, Clock::time_point now) {
  // A request that already ran (preempted since) is not refused: its answer has started.
  // The others wait in submit order, so the first still in time ends the scan.
  for (auto& r : waiting_) {
    if (r->finished || r->ever_admitted) continue;
    Status overdue = admission_.overdue(*r, now);
    if (overdue.ok()) break;
    r->retry_after_seconds = admission_.retry_now();
    ++counters_.refused_in_queue;
    plan.refused.push_back(r.get());
    end_request(*r, RequestEnd::kError, std::move(overdue));
  }
  if (!touched_.empty()) sweep_finished(waiting_, done_);
}

void Scheduler::count_step(std::uint32_t tokens, bool decode_only) {
  ++counters_.steps;
  if (decode_only) ++counters_.decode_only_steps;
  counters_.step_tokens.add(tokens);
}

void Scheduler::finish_step(Clock::time_point now) {
  if (!unreleased_.empty()) retry_releases();
  // Every finished request was touched: without one, the sets need no sweep.
  bool any_finished = false;
  for (RequestState* r : touched_) {
    if (!r->finished) continue;
    any_finished = true;
    finish_stats(*r, now);
  }
  if (any_finished) {
    sweep_finished(running_, done_);
    sweep_finished(waiting_, done_);
  }
}

void Scheduler::delivered() {
  for (RequestState* r : touched_) {
    r->touched = false;
    r->prompt_logprobs_sent = r->prompt_logprobs_sent || r->request.prompt_logprobs;
    r->emit_tokens = 0;
    r->token_logprobs.clear();
    r->text_out.clear();
  }
  touched_.clear();
  done_.clear();
}

}  // namespace kvvm::engine
