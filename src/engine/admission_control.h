// AdmissionControl: when a request may enter the queue, when one waiting is refused, what a
// refused client is told to wait, and how much prefill a decoding step may take.
//
// At arrival (any thread) a request is refused as overloaded when the queue is full past the
// running places still free, or when its predicted wait, times the margin by which recent
// predictions fell short, exceeds max_queue_wait: the larger of the admission rate's
// prediction (RetryEstimate) and a forecast played out from the work the running answers and
// the queue have left (WaitForecast, OutputLengths). In the queue, a request never admitted is
// refused once it waited past max_queue_wait (the backstop). A step that decodes takes at most
// the prefill tokens a time-per-token target leaves (StepTimeModel), raised to what the prompts
// waiting for their first token need to meet a time-to-first-token target.
//
// Threads: the stepping thread alone calls the step's half (begin_step ... end_step) and
// reads what it learns; submit() on any thread reads what the last step published, under this
// room's own lock. Lock order: the engine's lock, then this one.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "kvvm/base/mutex.h"
#include "kvvm/engine/engine.h"
#include "output_lengths.h"
#include "request_state.h"
#include "retry_estimate.h"
#include "step_time_model.h"
#include "wait_forecast.h"

namespace kvvm::engine {

class AdmissionControl {
 public:
  // REQUIRES: options resolved (resolve_options): max_running and the step's shares set.
  explicit AdmissionControl(const EngineOptions& options);

  // --- Any thread -------------------------------------------------------------------------
  // Whether `r`, just submitted (r.submitted set), may enter a queue of `queued` requests
  // (inbox and line) while `running` sequences hold places: ResourceExhausted "overloaded"
  // naming the cause and a retry time, else OK with r.predicted_wait recorded.
  Status check_arrival(RequestState& r, std::uint64_t queued, std::uint32_t running)
      KVVM_EXCLUDES(mutex_);
  // Seconds a client refused now should wait before retrying, [1, 3600].
  double retry_after(std::uint64_t queued, Clock::time_point now) const KVVM_EXCLUDES(mutex_);
  struct Counts {
    std::uint64_t refused_at_arrival = 0;  // every refusal at submit
    std::uint64_t refused_predicted = 0;   // of those: for the predicted wait
    double wait_margin = 1;                // RetryEstimate::margin()
  };
  Counts counts() const KVVM_EXCLUDES(mutex_);

  // --- The stepping thread ----------------------------------------------------------------
  // A step starts at `started` with `queued` requests in the queue: the step period is
  // measured and the retry time fixed for the step's refusals.
  void begin_step(Clock::time_point started, std::uint64_t queued) KVVM_EXCLUDES(mutex_);
  // The retry time the current step's refusals carry.
  double retry_now() const { return retry_now_; }
  // The refusal of `r`, waiting since its submit and never admitted, at `now`: OK while it is
  // within max_queue_wait (or there is no bound).
  Status overdue(const RequestState& r, Clock::time_point now) const;
  // The most prefill tokens a step holding `decodes` decode tokens may add under the
  // time-per-token target; nullopt without a target or before the step time is fitted.
  std::optional<std::uint32_t> prefill_share(std::uint32_t decodes) const;
  // The prefill tokens, at most `most`, a step holding `decodes` decode tokens needs for the
  // prompts still without their first token to meet the time-to-first-token target at `now`
  // (StepTimeModel::deadline_share): the running ones (in `running`'s order), then the line
  // (its whole prompts, the front first), the first kDeadlinePrompts of them; an answer
  // preempted and recomputed counts its tokens only, for those behind it. 0 when no prompt
  // needs any; nullopt without a target or before the step time is fitted.
  std::optional<std::uint32_t> deadline_share(std::uint32_t decodes, std::uint32_t most,
                                              const RunningSet& running,
                                              const WaitingQueue& waiting, Clock::time_point now);
  // The prompts deadline_share looks at, at most: a step's planning stays O(step).
  static constexpr std::size_t kDeadlinePrompts = 64;
  // `r` was admitted at `now` (after any preemption: `first` when never admitted before).
  void note_admission(const RequestState& r, bool first);
  // `r` ended: a stopped or capped answer teaches the forecast its length.
  void note_ended(const RequestState& r);
  // After the step's delivery: the forecast rebuilt from what runs and waits, and the step's
  // admissions and waits published to arrivals.
  void end_step(Clock::time_point now, const RunningSet& running, const WaitingQueue& waiting)
      KVVM_EXCLUDES(mutex_);
  // The step that started at `started` ran the model on `tokens` tokens until `ended` (ran:
  // false when nothing ran) and left work for the next (`work_left`).
  void step_done(Clock::time_point started, bool ran, std::uint32_t tokens, Clock::time_point ended,
                 bool work_left);

 private:
  // Steps `r` has left once running: its prompt's chunks of `chunk` tokens and the tokens it is
  // expected to generate still.
  double steps_left(const RequestState& r, std::uint32_t chunk) const;
  // Plays out when each position in line gets a running place into forecast_next_ (cleared
  // while forecasting is off or nothing is learned yet).
  void build_forecast(Clock::time_point now, const RunningSet& running,
                      const WaitingQueue& waiting);
  Status refuse_predicted_locked(RequestState& r, std::uint64_t queued) KVVM_REQUIRES(mutex_);

  const std::uint32_t max_running_;
  const std::uint32_t max_queue_;
  const std::chrono::milliseconds max_queue_wait_;
  const std::chrono::microseconds tpot_target_;
  const std::chrono::microseconds ttft_target_;
  const bool refuse_predicted_;
  const bool forecast_on_;
  // The prompt tokens a step full of decodes leaves for a chunk (the forecast's prompt pace).
  const std::uint32_t forecast_chunk_;

  // The stepping thread's own.
  double retry_now_ = 1;        // the estimate when the step began
  bool backlogged_ = false;     // the last step left requests waiting (RetryEstimate::note_step)
  std::uint32_t admitted_ = 0;  // this step's admissions
  // The step's first admissions that had a prediction: {predicted, waited} seconds.
  std::vector<std::pair<double, double>> admitted_waits_;
  OutputLengths lengths_;
  StepTimeModel step_time_;  // the steps' times by their tokens (tpot_target, ttft_target)
  std::vector<StepTimeModel::PromptDue> dues_;  // deadline_share's list, kept for its capacity
  double step_seconds_ = 0;                     // the step period, a moving mean
  Clock::time_point last_step_started_{};
  bool last_step_ran_ = false;  // it ran a step and left work for the next
  WaitForecast forecast_next_;
  std::vector<double> busy_, holds_;

  // Published to arrivals.
  mutable Mutex mutex_;
  RetryEstimate retry_ KVVM_GUARDED_BY(mutex_);
  WaitForecast forecast_ KVVM_GUARDED_BY(mutex_);
  std::uint64_t refused_at_arrival_ KVVM_GUARDED_BY(mutex_) = 0;
  std::uint64_t refused_predicted_ KVVM_GUARDED_BY(mutex_) = 0;
};

}  // namespace kvvm::engine
