#include "admission_control.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>

namespace kvvm::engine {
namespace {

// The prompt tokens a step full of decodes leaves for a chunk: what the forecast paces a
// prompt at.
std::uint32_t forecast_chunk(const EngineOptions& o) {
  std::uint32_t chunk = o.prefill_chunk;
  if (o.step_tokens > o.max_running) chunk = std::min(chunk, o.step_tokens - o.max_running);
  if (o.max_prefill_tokens_while_decoding > 0) {
    chunk = std::min(chunk, o.max_prefill_tokens_while_decoding);
  }
  return std::max<std::uint32_t>(chunk, 1);
}

}  // namespace

AdmissionControl::AdmissionControl(const EngineOptions& options)
    : max_running_(options.max_running),
      max_queue_(options.max_queue),
      max_queue_wait_(options.max_queue_wait),
      tpot_target_(options.tpot_target),
      ttft_target_(options.ttft_target),
      refuse_predicted_(options.refuse_predicted_wait && options.max_queue_wait.count() > 0),
      forecast_on_(options.wait_forecast && options.refuse_predicted_wait &&
                   options.max_queue_wait.count() > 0),
      forecast_chunk_(forecast_chunk(options)) {
  dues_.reserve(kDeadlinePrompts);
}

Status AdmissionControl::check_arrival(RequestState& r, std::uint64_t queued,
                                       std::uint32_t running) {
  MutexLock lock(mutex_);
  // The running places still free take requests at the next step: they are room too, so a
  // burst on an idle engine is refused only past max_queue beyond them.
  const std::uint64_t free = max_running_ > running ? max_running_ - running : 0;
  const std::uint64_t in_line = queued > free ? queued - free : 0;
  if (in_line >= max_queue_) {
    ++refused_at_arrival_;
    const double retry = retry_.seconds(queued, max_running_, r.submitted);
    return Status::ResourceExhausted(
        "overloaded: " + std::to_string(in_line) + " requests waiting (max_queue " +
            std::to_string(max_queue_) + ") behind " + std::to_string(running) +
            " running; retry in about " + std::to_string(static_cast<int>(retry)) + " s",
        Exhaustion{});
  }
  Status refused = refuse_predicted_locked(r, queued);
  if (!refused.ok()) {
    ++refused_at_arrival_;
    ++refused_predicted_;
  }
  return refused;
}

Status AdmissionControl::refuse_predicted_locked(RequestState& r, std::uint64_t queued) {
  if (!refuse_predicted_) return Status::Ok();
  const Clock::time_point now = r.submitted;
  // Each sees a cause of waiting the other misses: the rate, admissions held back by the KV
  // budget or the prefill share; the work left, a wave of long answers holding every place.
  const std::optional<double> by_rate = retry_.predicted_wait(queued, now);
  const std::optional<double> by_work = forecast_.wait(queued, now);
  if (!by_rate && !by_work) return Status::Ok();
  const double wait = std::max(by_rate.value_or(0), by_work.value_or(0));
  // Recent waits outlasted their predictions by up to this factor: a request accepted on the
  // bare prediction could still be refused late, after the whole wait.
  const double margin = retry_.margin();
  if (wait * margin <= std::chrono::duration<double>(max_queue_wait_).count()) {
    r.predicted_wait = wait;
    return Status::Ok();
  }
  // The backstop would refuse it after the whole wait: refusing now spends no one's time.
  const double retry = retry_.seconds(queued, max_running_, now);
  std::string shortfall;
  if (by_work && *by_work > by_rate.value_or(0))
    shortfall = " (the work the running answers and the queue have left)";
  if (margin > 1) {
    char text[96];
    std::snprintf(text, sizeof(text), ", recent waits up to %.1fx their prediction", margin);
    shortfall += text;
  }
  return Status::ResourceExhausted(
      "overloaded: " + std::to_string(queued) + " requests waiting would take about " +
          std::to_string(static_cast<int>(wait + 0.5)) + " s to admit" + shortfall +
          " (max_queue_wait " + std::to_string(max_queue_wait_.count()) + " ms); retry in about " +
          std::to_string(static_cast<int>(retry)) + " s",
      Exhaustion{});
}

double AdmissionControl::retry_after(std::uint64_t queued, Clock::time_point now) const {
  MutexLock lock(mutex_);
  return retry_.seconds(queued, max_running_, now);
}

AdmissionControl::Counts AdmissionControl::counts() const {
  MutexLock lock(mutex_);
  return Counts{.refused_at_arrival = refused_at_arrival_,
                .refused_predicted = refused_predicted_,
                .wait_margin = retry_.margin()};
}

void AdmissionControl::begin_step(Clock::time_point started, std::uint64_t queued) {
  // The forecast's step period: start to start of two steps with work between them, so what
  // lies between steps (the thread's wake-up, a descheduled engine thread) counts as the queue
  // sees it; a moving mean over the last fifty steps or so, prefill and decode steps in the
  // mix the load brings.
  if (last_step_ran_) {
    const double seconds = std::chrono::duration<double>(started - last_step_started_).count();
    step_seconds_ = step_seconds_ == 0 ? seconds : 0.98 * step_seconds_ + 0.02 * seconds;
  }
  admitted_ = 0;
  admitted_waits_.clear();
  MutexLock lock(mutex_);
  retry_now_ = retry_.seconds(queued, max_running_, started);
}

Status AdmissionControl::overdue(const RequestState& r, Clock::time_point now) const {
  if (max_queue_wait_.count() == 0 || now - r.submitted <= max_queue_wait_) return Status::Ok();
  const double waited = std::chrono::duration<double>(now - r.submitted).count();
  char text[160];
  std::snprintf(text, sizeof(text),
                "overloaded: waited %.3f s in the queue (max_queue_wait %lld ms)", waited,
                static_cast<long long>(max_queue_wait_.count()));
  return Status::ResourceExhausted(text, Exhaustion{});
}

std::optional<std::uint32_t> AdmissionControl::prefill_share(std::uint32_t decodes) const {
  if (tpot_target_.count() == 0) return std::nullopt;
  return step_time_.prefill_share(tpot_target_, decodes, kTpotPrefillFloor);
}

std::optional<std::uint32_t> AdmissionControl::deadline_share(std::uint32_t decodes,
                                                              std::uint32_t most,
                                                              const RunningSet& running,
                                                              const WaitingQueue& waiting,
                                                              Clock::time_point now) {
  if (ttft_target_.count() == 0) return std::nullopt;
  dues_.clear();
  // A prompt whose answer has started (a preempted one recomputed) has no deadline, but the
  // scheduler serves its tokens ahead of those behind it.
  constexpr double kNoDeadline = std::numeric_limits<double>::infinity();
  const auto add = [&](const RequestState& r) {
    const double left =
        r.generated > 0 ? kNoDeadline
                        : std::chrono::duration<double>(r.submitted + ttft_target_ - now).count();
    dues_.push_back(StepTimeModel::PromptDue{.tokens_left = r.missing(), .seconds_left = left});
  };
  for (const auto& r : running) {
    if (dues_.size() == kDeadlinePrompts) break;
    if (!r->finished && r->missing() > 1) add(*r);
  }
  for (const auto& r : waiting) {
    if (dues_.size() == kDeadlinePrompts) break;
    if (!r->finished) add(*r);
  }
  return step_time_.deadline_share(decodes, dues_, most);
}

void AdmissionControl::note_admission(const RequestState& r, bool first) {
  ++admitted_;
  if (first && r.predicted_wait >= 0) {
    admitted_waits_.emplace_back(r.predicted_wait, r.stats.queue_seconds);
  }
}

void AdmissionControl::note_ended(const RequestState& r) {
  // What the wait forecast learns answers' lengths from: those that ended on their own or at
  // their max_tokens (a cancelled or failed one says neither).
  if (r.end == RequestEnd::kStop || r.end == RequestEnd::kLength) {
    lengths_.note(r.generated, r.end == RequestEnd::kLength);
  }
}

void AdmissionControl::end_step(Clock::time_point now, const RunningSet& running,
                                const WaitingQueue& waiting) {
  build_forecast(now, running, waiting);
  MutexLock lock(mutex_);
  std::swap(forecast_, forecast_next_);
  for (std::uint32_t i = 0; i < admitted_; ++i) retry_.note_admission(now);
  retry_.note_step(now, backlogged_, admitted_);
  backlogged_ = !waiting.empty();
  // A quarter of the bound: the scale of waits the bound is compared with.
  const double floor = std::chrono::duration<double>(max_queue_wait_).count() / 4;
  for (const auto& [predicted, waited] : admitted_waits_)
    retry_.note_wait(predicted, waited, floor);
  admitted_ = 0;
  admitted_waits_.clear();
}

void AdmissionControl::step_done(Clock::time_point started, bool ran, std::uint32_t tokens,
                                 Clock::time_point ended, bool work_left) {
  last_step_started_ = started;
  last_step_ran_ = ran && work_left;
  // What a running answer waits between two tokens: the whole step, plan to delivery.
  if (ran) step_time_.observe(tokens, ended - started);
}

void AdmissionControl::build_forecast(Clock::time_point now, const RunningSet& running,
                                      const WaitingQueue& waiting) {
  if (!forecast_on_ || !lengths_.known() || !(step_seconds_ > 0)) {
    forecast_next_.clear();
    return;
  }
  lengths_.refresh();
  busy_.clear();
  for (const auto& r : running) busy_.push_back(steps_left(*r, forecast_chunk_));
  holds_.clear();
  for (const auto& r : waiting) holds_.push_back(steps_left(*r, forecast_chunk_));
  // A request not yet in line: the mean answer, its prompt in one chunk.
  const double typical = lengths_.mean();
  forecast_next_.build(max_running_, busy_, holds_, typical, step_seconds_, now);
}

double AdmissionControl::steps_left(const RequestState& r, std::uint32_t chunk) const {
  const double remaining = lengths_.remaining(r.generated, r.request.max_tokens);
  const std::uint32_t missing = r.missing();
  if (missing <= 1) return remaining;  // decoding: a token a step
  // A prompt (or a preempted answer recomputed) takes its chunks, the last of which samples
  // the next token.
  const double chunks = static_cast<double>((missing + chunk - 1) / chunk);
  return chunks + std::max(remaining - 1, 0.0);
}

}  // namespace kvvm::engine
