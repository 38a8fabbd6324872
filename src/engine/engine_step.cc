// One engine step: take the inbox, admit, plan and commit, run the model once, deliver.
#include <algorithm>
#include <optional>
#include <string>

#include "engine_impl.h"
#include "kvvm/driver.h"
#include "kvvm/log.h"
#include "logit_transforms.h"

namespace kvvm::engine {
namespace {

// Generated tokens a sequence gathers before their ids go to the prefix cache.
constexpr std::uint32_t kPublishEvery = 16;

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

// Whether the chunk of `r` ending at token `end` is the one whose logits it keeps: the end of
// its prompt, before any output (a recomputation after preemption keeps the first).
bool wants_prompt_logits(const RequestState& r, std::uint32_t end) {
  return r.request.keep_prompt_logits && r.generated == 0 && r.prompt_logits.empty() &&
         end == r.prompt_size;
}

// Which rows of the chunk [start, end) of `r` have their log-probabilities computed: every row
// while the prompt's are wanted; the last when its draw is a new token and the request asks.
model::LogprobRows logprob_rows(const RequestState& r, std::uint32_t end) {
  if (r.wants_prompt_logprobs()) return model::LogprobRows::kAll;
  if (r.request.logprobs && end == r.tokens.size()) return model::LogprobRows::kLast;
  return model::LogprobRows::kNone;
}

std::size_t rows_of(model::LogprobRows rows, std::uint32_t tokens) {
  switch (rows) {
    case model::LogprobRows::kNone:
      return 0;
    case model::LogprobRows::kLast:
      return 1;
    case model::LogprobRows::kAll:
      return tokens;
  }
  return 0;
}

}  // namespace

Result<bool> Engine::Impl::step() {
  const Clock::time_point started = now();
  // The forecast's step period: start to start of two steps with work between them, so what
  // lies between steps (the thread's wake-up, a descheduled engine thread) counts as the queue
  // sees it; a moving mean over the last fifty steps or so, prefill and decode steps in the
  // mix the load brings.
  if (last_step_ran_) {
    const double seconds = std::chrono::duration<double>(started - last_step_started_).count();
    step_seconds_ = step_seconds_ == 0 ? seconds : 0.98 * step_seconds_ + 0.02 * seconds;
  }
  take_inbox(started);
  if (context_lost_) {
    // Requests that reached the queue before the loss was seen end with it too.
    const Status lost = this->lost();
    for (auto& r : waiting_) end_request(*r, RequestEnd::kError, lost);
    deliver(now());
    return lost;
  }
  const std::uint64_t steps_before = step_counters_.steps;
  if (plan_step(now())) run_step(now());
  deliver(now());
  if (context_lost_) return lost();  // this step lost it: a broken engine
  last_step_started_ = started;
  last_step_ran_ = step_counters_.steps != steps_before && (!running_.empty() || !waiting_.empty());
  // What a running answer waits between two tokens: the whole step, plan to delivery.
  if (step_counters_.steps != steps_before) {
    step_time_.observe(static_cast<std::uint32_t>(ids_.size()), now() - started);
  }
  MutexLock lock(mutex_);
  return work_left_ || !inbox_.empty() || !cancels_.empty() || cancel_all_;
}

void Engine::Impl::take_inbox(Clock::time_point now) {
  bool all = false;
  cancels_taken_.clear();
  {
    MutexLock lock(mutex_);
    // Busy from here until deliver() says otherwise: drain() must not see the inbox empty
    // and the step's work not yet counted.
    work_left_ = work_left_ || !inbox_.empty() || !cancels_.empty() || cancel_all_;
    for (auto& r : inbox_) waiting_.push_back(std::move(r));
    inbox_.clear();
    cancels_taken_.swap(cancels_);
    all = cancel_all_;
    cancel_all_ = false;
    retry_now_ = retry_.seconds(queued_, options_.max_running, now);
  }
  if (all) {
    for (auto& r : running_) end_request(*r, RequestEnd::kCancelled);
    for (auto& r : waiting_) end_request(*r, RequestEnd::kCancelled);
  } else {
    // Every choice of the request: running, waiting, or waiting on the first to fork.
    for (const RequestId id : cancels_taken_) {
      for (auto& r : running_) {
        if (r->id == id) end_request(*r, RequestEnd::kCancelled);
      }
      for (auto& r : waiting_) {
        if (r->id == id) end_request(*r, RequestEnd::kCancelled);
      }
    }
  }
  if (!touched_.empty()) {  // only ends so far: the cancelled
    sweep_finished(running_, done_);
    sweep_finished(waiting_, done_);
  }
}

void Engine::Impl::admit_waiting(Clock::time_point now) {
  admitted_this_step_ = 0;
  admitted_waits_.clear();
  while (!waiting_.empty() && running_.size() < options_.max_running && room_for_prefill()) {
    RequestState& r = *waiting_.front();
    // A prompt whose log-probabilities are wanted is computed whole: cached tokens have no
    // logits.
    Result<KvAdmission> admitted =
        kv_->admit(r.tokens, r.request.tenant, !r.wants_prompt_logprobs());
    Status refused = admitted.ok() ? Status::Ok() : admitted.status();
    if (admitted.ok()) {
      r.slot = admitted->slot;
      r.computed = static_cast<std::uint32_t>(admitted->cached_tokens);
      // The first chunk's KV is committed with the admission, or the admission is undone: a
      // sequence admitted without it would be the newest, the first preempted, its work lost.
      const std::uint32_t n = chunk_tokens(r);
      refused = kv_->ensure(*r.slot, std::uint64_t{r.computed} + n);
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
      done_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      continue;
    }
    const std::uint64_t cached = admitted->cached_tokens;
    r.cache_known = static_cast<std::uint32_t>(r.tokens.size());
    r.admission = ++admissions_;
    r.stats.cached_tokens = static_cast<std::uint32_t>(cached);
    if (!r.ever_admitted) {
      r.ever_admitted = true;
      r.admitted = now;
      r.stats.queue_seconds = std::chrono::duration<double>(now - r.submitted).count();
      if (r.predicted_wait >= 0)
        admitted_waits_.emplace_back(r.predicted_wait, r.stats.queue_seconds);
    }
    plan_chunk(r, chunk_tokens(r));
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    ++admitted_this_step_;
  }
  step_counters_.peak_running =
      std::max(step_counters_.peak_running, static_cast<std::uint32_t>(running_.size()));
}

// After admission, so that a request the step could admit is served however late the step
// came (a busy or descheduled engine thread is not the queue being full).
void Engine::Impl::refuse_overdue(Clock::time_point now) {
  if (options_.max_queue_wait.count() == 0) return;
  // A request that already ran (preempted since) is not refused: its answer has started.
  // The others wait in submit order, so the first still in time ends the scan.
  for (auto& r : waiting_) {
    if (r->finished || r->ever_admitted) continue;
    if (now - r->submitted <= options_.max_queue_wait) break;
    const double waited = std::chrono::duration<double>(now - r->submitted).count();
    r->retry_after_seconds = retry_now_;
    ++step_counters_.refused_in_queue;
    end_request(
        *r, RequestEnd::kError,
        Status::ResourceExhausted("overloaded: waited " + std::to_string(waited) +
                                      " s in the queue (max_queue_wait " +
                                      std::to_string(options_.max_queue_wait.count()) + " ms)",
                                  Exhaustion{}));
  }
  if (!touched_.empty()) sweep_finished(waiting_, done_);
}

bool Engine::Impl::room_for_prefill() const {
  return budget_ > 0 && plan_.size() < model_.limits().max_chunks &&
         (!decoding_ || prefill_left_ > 0);
}

std::uint32_t Engine::Impl::chunk_tokens(const RequestState& r) const {
  if (r.missing() <= 1) return r.missing();  // a decode token (or a prompt cached but its last)
  std::uint32_t n = std::min({r.missing(), options_.prefill_chunk, budget_});
  if (decoding_) n = std::min(n, prefill_left_);
  return n;
}

bool Engine::Impl::plan_chunk(RequestState& r, std::uint32_t n) {
  if (n == 0 || n > budget_ || plan_.size() == model_.limits().max_chunks) return false;
  // The draws' logit transforms share the model's bound; a chunk whose transforms do not fit
  // waits a step (one alone always fits: the bound holds a vocabulary). A mid-prompt draw is
  // moot.
  if (r.computed + n == r.tokens.size()) {
    const std::size_t bound = logit_transform_bound(r, model_.config().vocab_size);
    if (bound > transforms_left_) return false;
    transforms_left_ -= bound;
  }
  plan_.push_back(Planned{.request = &r, .start = r.computed, .tokens = n});
  budget_ -= n;
  if (n > 1 || r.missing() > 1) prefill_left_ -= std::min(prefill_left_, n);
  return true;
}

bool Engine::Impl::plan_step(Clock::time_point now) {
  plan_.clear();
  budget_ = options_.step_tokens;
  transforms_left_ = model_.limits().max_logit_adjustments;
  decoding_ = false;
  prefill_left_ = options_.max_prefill_tokens_while_decoding != 0
                      ? options_.max_prefill_tokens_while_decoding
                      : options_.step_tokens;
  // Decode tokens first: a running answer never waits behind a new prompt.
  for (auto& r : running_) {
    if (budget_ == 0 || plan_.size() == model_.limits().max_chunks) break;
    if (r->finished || r->missing() != 1) continue;
    decoding_ = plan_chunk(*r, 1) || decoding_;
  }
  // The share a time-per-token target leaves after this step's decode tokens.
  if (decoding_ && options_.tpot_target.count() > 0) {
    const std::optional<std::uint32_t> share = step_time_.prefill_share(
        options_.tpot_target, static_cast<std::uint32_t>(plan_.size()), kTpotPrefillFloor);
    if (share) prefill_left_ = std::min(prefill_left_, *share);
  }
  // Then the prompts already running, within what decodes leave of the prefill share.
  for (auto& r : running_) {
    if (!room_for_prefill()) break;
    if (r->finished || r->missing() <= 1) continue;
    plan_chunk(*r, chunk_tokens(*r));
  }
  // Commit what each chunk writes. Growth refused after reclaim preempts the newest sequence
  // (possibly this one) and tries again; one that cannot fit alone fails.
  // (Preallocated slots grow through nothing: the KV manager answers OK at once.)
  const std::uint64_t preempted_before = step_counters_.preemptions;
  for (Planned& p : plan_) {
    while (p.request != nullptr) {
      RequestState& r = *p.request;
      Status grown = kv_->ensure(*r.slot, std::uint64_t{p.start} + p.tokens);
      if (grown.ok()) break;
      if (grown.code() != StatusCode::kResourceExhausted) {
        end_request(r, RequestEnd::kError,
                    grown.with_context("committing KV through token " +
                                       std::to_string(p.start + p.tokens)));
        p.request = nullptr;
        break;
      }
      RequestState* victim = newest_running();
      if (victim == &r && active_running() == 1) {
        if (retry_releases()) continue;  // the room was held by a slot not yet released
        end_request(r, RequestEnd::kError,
                    grown.with_context("the sequence alone cannot grow to " +
                                       std::to_string(p.start + p.tokens) + " tokens"));
        p.request = nullptr;
        break;
      }
      for (Planned& q : plan_) {
        if (q.request == victim) q.request = nullptr;
      }
      preempt(*victim);
    }
  }
  // New requests only into what the running ones left, after their growth is committed: one
  // admitted now is computed in this step, never preempted by it. A step that had to preempt
  // admits nothing: the room it took back belongs to the sequences already running.
  if (step_counters_.preemptions == preempted_before) admit_waiting(now);
  // After admission, so that a request the step could admit is served however late it came.
  refuse_overdue(now);
  return std::any_of(plan_.begin(), plan_.end(),
                     [](const Planned& p) { return p.request != nullptr; });
}

void Engine::Impl::run_step(Clock::time_point now) {
  ids_.clear();
  chunks_.clear();
  sampling_.clear();
  adjustments_.clear();
  owners_.clear();
  bool decode_only = true;
  bool want_logits = false;
  std::size_t logprob_rows_wanted = 0;
  for (const Planned& p : plan_) {
    if (p.request == nullptr || p.request->finished) continue;
    RequestState& r = *p.request;
    const std::uint32_t end = p.start + p.tokens;
    ids_.insert(ids_.end(), r.tokens.begin() + p.start, r.tokens.begin() + end);
    chunks_.push_back(model::Chunk{.slot = *r.slot, .start = p.start, .tokens = p.tokens});
    model::ChunkSampling sampling{.params = r.request.sampling, .counter = r.generated};
    sampling.logprob_rows = logprob_rows(r, end);
    if (sampling.logprob_rows != model::LogprobRows::kNone) {
      sampling.top_logprobs = r.request.logprobs.value_or(0);
      // Mid-prompt, the last row scores the next prompt token, not the (moot) draw.
      if (end < r.tokens.size()) sampling.last_target = r.tokens[end];
      logprob_rows_wanted += rows_of(sampling.logprob_rows, p.tokens);
    }
    if (end == r.tokens.size() && has_logit_transforms(r)) {
      sampling.adjust_begin = static_cast<std::uint32_t>(adjustments_.size());
      append_logit_transforms(r, adjustments_, adjust_scratch_);
      sampling.adjust_count =
          static_cast<std::uint32_t>(adjustments_.size()) - sampling.adjust_begin;
    }
    sampling_.push_back(sampling);
    owners_.push_back(&r);
    decode_only = decode_only && p.tokens == 1;
    want_logits = want_logits || wants_prompt_logits(r, p.start + p.tokens);
  }
  if (chunks_.empty()) return;
  const model::StepBatch batch{.token_ids = ids_,
                               .chunks = chunks_,
                               .kv = kv_->space().view(),
                               .sampling = sampling_,
                               .adjustments = adjustments_};
  model::StepOutput out;
  out.sampled = sampled_.data();
  // Rare (a request asking for its prompt's logits): the step's rows only then.
  const std::size_t vocab = model_.config().vocab_size;
  std::vector<float> logits;
  if (want_logits) {
    logits.resize(chunks_.size() * vocab);
    out.logits = logits.data();
  }
  if (logprob_rows_wanted > 0) {
    if (logprob_rows_.size() < logprob_rows_wanted) logprob_rows_.resize(logprob_rows_wanted);
    out.logprobs = logprob_rows_.data();
  }
  const Status ran = model_.forward(batch, out);
  ++step_counters_.steps;
  if (decode_only) ++step_counters_.decode_only_steps;
  step_counters_.step_tokens.add(ids_.size());
  if (!ran.ok()) {
    // The step's KV is in an unknown state: its requests end, the others carry on; unless the
    // context itself is gone, which takes every request with it.
    const Status failed = ran.with_context("model step of " + std::to_string(chunks_.size()) +
                                           " chunks, " + std::to_string(ids_.size()) + " tokens");
    if (context_lost(ran)) {
      lose_context(failed);
      return;
    }
    for (RequestState* r : owners_) end_request(*r, RequestEnd::kError, failed);
    return;
  }
  std::size_t row = 0;  // the chunk's first log-probability row
  for (std::size_t i = 0; i < owners_.size(); ++i) {
    RequestState& r = *owners_[i];
    const std::uint32_t start = r.computed;
    r.computed += chunks_[i].tokens;
    const model::LogprobRows rows = sampling_[i].logprob_rows;
    const model::RowLogprobs* chunk_rows = logprob_rows_.data() + row;
    row += rows_of(rows, chunks_[i].tokens);
    if (rows == model::LogprobRows::kAll) {
      // Row j scores token start + j + 1: the prompt's rows up to its last token (a recomputed
      // chunk replaces what an earlier, preempted computation gathered).
      const std::uint32_t prompt_end = std::min(r.computed, r.prompt_size - 1);
      const std::uint32_t prompt_rows = prompt_end > start ? prompt_end - start : 0;
      r.prompt_logprobs.resize(std::min<std::size_t>(r.prompt_logprobs.size(), start));
      r.prompt_logprobs.insert(r.prompt_logprobs.end(), chunk_rows, chunk_rows + prompt_rows);
    }
    if (rows != model::LogprobRows::kNone) {
      r.token_logprobs = chunk_rows[rows_of(rows, chunks_[i].tokens) - 1];  // the draw's
    }
    if (!r.forks.empty() && r.computed >= r.prompt_size) fork_choices(r, now);
    // Prompt chunks publish at once; generated tokens a few at a time, which keeps the
    // cache's lock and key hashing off most decode steps (a window holds several tokens).
    if (chunks_[i].tokens > 1 || r.computed <= r.cache_known ||
        r.computed - r.cache_known >= kPublishEvery) {
      publish_written(r);
    }
    if (want_logits && wants_prompt_logits(r, r.computed)) {
      r.prompt_logits.assign(logits.begin() + static_cast<std::ptrdiff_t>(i * vocab),
                             logits.begin() + static_cast<std::ptrdiff_t>((i + 1) * vocab));
    }
    if (r.missing() != 0) continue;  // a mid-prompt chunk's draw is moot
    if (r.request.max_tokens == 0) {
      end_request(r, RequestEnd::kLength);  // prefill only: the logits are the answer
    } else {
      on_sampled(r, sampled_[i], now);
    }
  }
}

void Engine::Impl::publish_written(RequestState& r) {
  // Generated tokens fed this step become known ids, so their windows can publish too.
  if (r.computed > r.cache_known) {
    const Status extended = kv_->extend(*r.slot, std::span<const std::int32_t>(r.tokens).subspan(
                                                     r.cache_known, r.computed - r.cache_known));
    if (!extended.ok()) {
      log(LogLevel::kWarning, "engine: prefix cache extend: " + extended.to_string());
      return;
    }
    r.cache_known = r.computed;
  }
  // Publishing is an optimisation for later requests, never this one's failure.
  const Status published = kv_->written(*r.slot, r.computed);
  if (!published.ok()) {
    log(LogLevel::kWarning, "engine: prefix cache publish: " + published.to_string());
  }
}

void Engine::Impl::on_sampled(RequestState& r, std::int32_t token, Clock::time_point now) {
  if (std::find(r.ends.begin(), r.ends.end(), token) != r.ends.end()) {
    if (r.text) r.text->finish(r.text_out);
    end_request(r, RequestEnd::kStop);
    return;
  }
  r.tokens.push_back(token);
  ++r.generated;
  if (r.generated == 1) r.first_token = now;
  r.last_token = now;
  r.emit_token = true;
  touch(r);
  if (r.text && r.text->push(token, r.text_out)) {
    r.emit_token = false;  // the token that completed a stop string is not emitted
    end_request(r, RequestEnd::kStop);
    return;
  }
  if (r.generated >= r.request.max_tokens) {
    const bool stopped = r.text && r.text->finish(r.text_out);
    end_request(r, stopped ? RequestEnd::kStop : RequestEnd::kLength);
  }
}

void Engine::Impl::deliver(Clock::time_point now) {
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
  build_forecast(now);
  {
    MutexLock lock(mutex_);
    std::swap(forecast_, forecast_next_);
    published_ = step_counters_;
    running_count_ = static_cast<std::uint32_t>(running_.size());
    queued_ = inbox_.size() + waiting_.size();
    work_left_ = !running_.empty() || !waiting_.empty();
    graphs_ = model_.graph_stats();
    for (std::uint32_t i = 0; i < admitted_this_step_; ++i) retry_.note_admission(now);
    retry_.note_step(now, backlogged_, admitted_this_step_);
    backlogged_ = !waiting_.empty();
    // A quarter of the bound: the scale of waits the bound is compared with.
    const double floor = std::chrono::duration<double>(options_.max_queue_wait).count() / 4;
    for (const auto& [predicted, waited] : admitted_waits_) {
      retry_.note_wait(predicted, waited, floor);
    }
  }
  for (RequestState* r : touched_) {
    if (r->callback) {
      RequestEvent event;
      fill_event(*r, event);
      r->callback(event);
    }
    r->touched = false;
    r->prompt_logprobs_sent = r->prompt_logprobs_sent || r->request.prompt_logprobs;
    r->emit_token = false;
    r->text_out.clear();
  }
  touched_.clear();
  done_.clear();
  idle_.notify_all();
}

void Engine::Impl::build_forecast(Clock::time_point now) {
  const bool on = options_.wait_forecast && options_.refuse_predicted_wait &&
                  options_.max_queue_wait.count() > 0;
  if (!on || !lengths_.known() || !(step_seconds_ > 0)) {
    forecast_next_.clear();
    return;
  }
  lengths_.refresh();
  // The prompt tokens a step full of decodes leaves for a chunk.
  std::uint32_t chunk = options_.prefill_chunk;
  if (options_.step_tokens > options_.max_running) {
    chunk = std::min(chunk, options_.step_tokens - options_.max_running);
  }
  if (options_.max_prefill_tokens_while_decoding > 0) {
    chunk = std::min(chunk, options_.max_prefill_tokens_while_decoding);
  }
  chunk = std::max<std::uint32_t>(chunk, 1);
  busy_.clear();
  for (const auto& r : running_) busy_.push_back(steps_left(*r, chunk));
  holds_.clear();
  for (const auto& r : waiting_) holds_.push_back(steps_left(*r, chunk));
  // A request not yet in line: the mean answer, its prompt in one chunk.
  const double typical = lengths_.mean();
  forecast_next_.build(options_.max_running, busy_, holds_, typical, step_seconds_, now);
}

double Engine::Impl::steps_left(const RequestState& r, std::uint32_t chunk) const {
  const double remaining = lengths_.remaining(r.generated, r.request.max_tokens);
  const std::uint32_t missing = r.missing();
  if (missing <= 1) return remaining;  // decoding: a token a step
  // A prompt (or a preempted answer recomputed) takes its chunks, the last of which samples
  // the next token.
  const double chunks = static_cast<double>((missing + chunk - 1) / chunk);
  return chunks + std::max(remaining - 1, 0.0);
}

}  // namespace kvvm::engine
