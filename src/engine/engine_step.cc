// One engine step: the inbox taken, then schedule() -> StepPlan, the runner's execute() ->
// StepOutputs, the scheduler's update(); then the step's events delivered.
#include <algorithm>
#include <chrono>
#include <string>

#include "engine_impl.h"
#include "kvvm/base/log.h"
#include "kvvm/vmm/driver.h"

namespace kvvm::engine {

Result<bool> Engine::Impl::step() {
  // The phases are timed on the host's steady clock, whatever clock the scheduler reads.
  using Steady = std::chrono::steady_clock;
  const auto since = [](Steady::time_point from) {
    return std::chrono::duration<double>(Steady::now() - from).count();
  };
  const Clock::time_point started = now();
  admission_.begin_step(started, take_inbox());
  if (context_lost_) {
    // Requests that reached the queue before the loss was seen end with it too.
    scheduler_.lose_context(lost());
    deliver(now());
    return lost();
  }
  Steady::time_point phase = Steady::now();
  const StepPlan plan = scheduler_.schedule(now());
  StepPhaseSeconds took;
  took.schedule = since(phase);
  if (!plan.empty()) {
    // The step's tokens are stamped with the time it was sent to the model: a first token's
    // time to first token leaves the step that computed it out (the figures measured so far
    // were taken so).
    const Clock::time_point sent = now();
    const double waited = model_.forward_waits().seconds;
    const StepOutputs& outputs = runner_.execute(plan, kv_->space().view());
    took.steps = 1;
    took.prepare = runner_.prepare_seconds();
    took.wait = model_.forward_waits().seconds - waited;
    took.launch = std::max(0.0, runner_.forward_seconds() - took.wait);
    phase = Steady::now();
    scheduler_.count_step(plan.tokens, plan.decode_only);
    // A failed step ends its own requests; a lost context takes every request with it.
    if (!outputs.status.ok() && context_lost(outputs.status)) {
      lose_context(outputs.status);
    } else {
      scheduler_.update(plan, outputs, sent);
    }
    took.update = since(phase);
  }
  phase = Steady::now();
  deliver(now());
  took.deliver = since(phase);
  if (context_lost_) return lost();  // this step lost it: a broken engine
  const bool work_left = !scheduler_.running().empty() || !scheduler_.waiting().empty();
  admission_.step_done(started, !plan.empty(), plan.tokens, now(), work_left);
  MutexLock lock(mutex_);
  if (took.steps > 0) phases_.add(took);
  return work_left_ || !inbox_.empty() || !cancels_.empty() || cancel_all_;
}

std::uint64_t Engine::Impl::take_inbox() {
  bool all = false;
  std::uint64_t queued = 0;
  cancels_taken_.clear();
  {
    MutexLock lock(mutex_);
    // Busy from here until deliver() says otherwise: drain() must not see the inbox empty
    // and the step's work not yet counted.
    work_left_ = work_left_ || !inbox_.empty() || !cancels_.empty() || cancel_all_;
    for (auto& r : inbox_) scheduler_.enqueue(std::move(r));
    inbox_.clear();
    cancels_taken_.swap(cancels_);
    all = cancel_all_;
    cancel_all_ = false;
    queued = queued_;
  }
  if (all) {
    scheduler_.cancel_all();
  } else if (!cancels_taken_.empty()) {
    scheduler_.cancel(cancels_taken_);
  }
  return queued;
}

void Engine::Impl::lose_context(const Status& cause) {
  const std::optional<DriverFailure>& failure = cause.driver_failure();
  const Status lost = cause.with_context(
      "the GPU context was lost (" + (failure ? failure->error_name + " in " + failure->call : "") +
      "): every request on it ended and the engine takes no more; the process must be restarted");
  {
    MutexLock lock(mutex_);
    if (!lost_.ok()) return;
    lost_ = lost;
  }
  context_lost_ = true;
  log(LogLevel::kError, "engine: " + lost.to_string());
  scheduler_.lose_context(lost);
}

Status Engine::Impl::lost() const {
  MutexLock lock(mutex_);
  return lost_;
}

void Engine::Impl::deliver(Clock::time_point now) {
  scheduler_.finish_step(now);
  admission_.end_step(now, scheduler_.running(), scheduler_.waiting());
  {
    MutexLock lock(mutex_);
    published_ = scheduler_.counters();
    running_count_ = static_cast<std::uint32_t>(scheduler_.running().size());
    queued_ = inbox_.size() + scheduler_.waiting().size();
    work_left_ = !scheduler_.running().empty() || !scheduler_.waiting().empty();
    graphs_ = model_.graph_stats();
    runner_.add_grammar_stats(grammar_);
  }
  for (RequestState* r : scheduler_.events()) {
    if (r->callback) {
      RequestEvent event;
      fill_event(*r, event);
      r->callback(event);
    }
  }
  scheduler_.delivered();
  idle_.notify_all();
}

void Engine::Impl::fill_event(const RequestState& r, RequestEvent& event) const {
  event.id = r.id;
  event.index = r.index;
  if (r.emit_tokens > 0) {
    event.tokens = std::span<const std::int32_t>(r.tokens).subspan(r.emit_from, r.emit_tokens);
    // Only a drawn token has log-probabilities; a request asking for them never jumps forward.
    if (r.request.logprobs) {
      event.logprobs = std::span<const model::RowLogprobs>(r.token_logprobs)
                           .first(std::min<std::size_t>(r.token_logprobs.size(), r.emit_tokens));
    }
  }
  if (r.request.prompt_logprobs && !r.prompt_logprobs_sent)
    event.prompt_logprobs = r.prompt_logprobs;
  event.text = r.text_out;
  event.finished = r.finished;
  if (r.finished) {
    event.end = r.end;
    event.error = r.error;
    event.retry_after_seconds = r.retry_after_seconds;
    event.stats = &r.stats;
    event.prompt_logits = r.prompt_logits;
  }
}

}  // namespace kvvm::engine
