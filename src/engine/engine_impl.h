// Engine::Impl: the engine's state, split by who touches it.
//
// The stepping thread alone owns the queue it admits from, the running sequences and the
// step's buffers; other threads meet it only through mutex_: submit() and cancel() leave
// requests and ids in an inbox the next step takes in one lock, and each step publishes its
// counters back in one lock. Callbacks run after the step with no lock held, so they may
// submit or cancel.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/engine/kv_manager.h"
#include "kvvm/mutex.h"
#include "output_lengths.h"
#include "request_state.h"
#include "retry_estimate.h"
#include "step_time_model.h"
#include "wait_forecast.h"

namespace kvvm::engine {

class Engine::Impl {
 public:
  Impl(model::Model& model, std::unique_ptr<KvManager> kv, EngineOptions options,
       std::uint64_t context);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // The decode graphs, over the KV manager's padding slot when it has one (engine.cc).
  Status init();

  Result<RequestId> submit(EngineRequest request, RequestCallback callback);
  void cancel(RequestId id);
  double retry_after() const;
  // Engine::health(): OK, or the status the lost context ended every request with.
  Status lost() const;
  Result<bool> step();
  Status run_until_idle();
  Status start();
  bool drain(std::chrono::milliseconds timeout);
  EngineStats stats() const;
  const EngineOptions& options() const { return options_; }
  const model::Model& model() const { return model_; }

 private:
  // One sequence's share of the step being built.
  struct Planned {
    RequestState* request = nullptr;
    std::uint32_t start = 0;
    std::uint32_t tokens = 0;
  };
  // What the stepping thread counts; copied into the shared counters at the end of a step.
  struct StepCounters {
    std::uint64_t finished = 0, cancelled = 0, failed = 0, refused_in_queue = 0;
    std::uint64_t preemptions = 0, steps = 0, decode_only_steps = 0;
    StepTokenCounts step_tokens;
    std::uint64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
    std::uint32_t peak_running = 0;
  };

  Status validate(const EngineRequest& request) const;  // engine.cc
  // The scheduler's time: EngineOptions::clock, else the steady clock (engine.cc).
  Clock::time_point now() const;
  // ResourceExhausted when r, just submitted, is predicted to wait past max_queue_wait behind
  // the queue (the larger of the admission rate's prediction and the wait forecast's), its
  // prediction times the measured margin; else records the prediction in r (engine.cc).
  Status refuse_predicted_locked(RequestState& r) KVVM_REQUIRES(mutex_);
  // Choice `index` of `request`, not yet submitted (engine.cc).
  std::unique_ptr<RequestState> make_state(EngineRequest request, std::uint32_t index) const;
  void worker();  // engine.cc

  // The step's phases (engine_step.cc).
  // Takes the inbox and the cancellations.
  void take_inbox(Clock::time_point now);
  // Plans the running sequences' chunks and commits what they write (preempting when growth
  // is refused), then admits waiting requests into the room left, each with its first chunk
  // planned and committed, then refuses the overdue; false when there is nothing to run.
  bool plan_step(Clock::time_point now);
  // Admits from the front of the queue while a running place, the step's token budget and its
  // prefill share leave room for a chunk.
  void admit_waiting(Clock::time_point now);
  // Refuses the requests still waiting, never admitted, past max_queue_wait.
  void refuse_overdue(Clock::time_point now);
  // Whether the step being planned has room for another prefill chunk.
  bool room_for_prefill() const;
  // The tokens of r's next chunk in the step being planned (its decode token: 1).
  std::uint32_t chunk_tokens(const RequestState& r) const;
  // Adds r's next `n` tokens to the plan; false when they do not fit it.
  bool plan_chunk(RequestState& r, std::uint32_t n);
  void run_step(Clock::time_point now);
  // The token sampled after the request's last missing one.
  void on_sampled(RequestState& r, std::int32_t token, Clock::time_point now);
  // Tells the KV manager the ids and the written tokens, so later requests may share them.
  void publish_written(RequestState& r);
  // The choices waiting on `parent`, whose prompt is now computed, fork its KV (engine_fork.cc):
  // each becomes a running sequence missing the prompt's last token, or, without room or a
  // running place, a request first in line.
  void fork_choices(RequestState& parent, Clock::time_point now);
  // Moves finished requests out of the queue and the running set, runs the callbacks.
  void deliver(Clock::time_point now);
  // Plays out when each position in line gets a running place into forecast_next_ (cleared
  // while forecasting is off or nothing is learned yet).
  void build_forecast(Clock::time_point now);
  // Steps r has left once running: its prompt's chunks of `chunk` tokens and the tokens it is
  // expected to generate still.
  double steps_left(const RequestState& r, std::uint32_t chunk) const;

  // Request outcomes (engine_request.cc).
  void touch(RequestState& r);
  void end_request(RequestState& r, RequestEnd end, Status error = Status::Ok());
  // The GPU context is gone (context_lost(cause)): every running and waiting request ends with
  // the error, and from now on submit() refuses and health() says why.
  void lose_context(const Status& cause);
  void release_slot(RequestState& r);
  bool retry_releases();  // the slots whose release failed; whether any was released
  void preempt(RequestState& victim);
  // The newest running request not finished; null when none.
  RequestState* newest_running();
  std::size_t active_running() const;  // running and not finished
  void finish_stats(RequestState& r, Clock::time_point now);
  void fill_event(const RequestState& r, RequestEvent& event) const;

  model::Model& model_;
  // Every sequence's KV goes through it, caching on or off (docs/ARCHITECTURE.md, "The KV seam").
  const std::unique_ptr<KvManager> kv_;
  EngineOptions options_;
  const std::uint64_t context_;  // prompt + max_tokens limit
  bool graphs_captured_ = false;

  // The stepping thread's own.
  std::deque<std::unique_ptr<RequestState>> waiting_;
  std::vector<std::unique_ptr<RequestState>> running_;  // in admission order: newest last
  std::vector<std::unique_ptr<RequestState>> done_;     // finished this step
  std::vector<RequestState*> touched_;                  // with an event this step
  std::vector<RequestId> cancels_taken_;
  std::vector<Planned> plan_;
  // What is left of the step being planned: tokens, logit transforms, and the prefill share
  // (max_prefill_tokens_while_decoding) that binds once a decode token is in it.
  std::uint32_t budget_ = 0;
  std::size_t transforms_left_ = 0;
  std::uint32_t prefill_left_ = 0;
  bool decoding_ = false;
  StepTimeModel step_time_;         // the steps' times by their tokens (EngineOptions::tpot_target)
  std::vector<SlotId> unreleased_;  // released by no request any more; retried after each step
  std::vector<std::int32_t> ids_;
  std::vector<model::Chunk> chunks_;
  std::vector<model::ChunkSampling> sampling_;
  std::vector<std::int32_t> sampled_;
  std::vector<model::RowLogprobs> logprob_rows_;     // grown when a step first needs more
  std::vector<model::LogitAdjustment> adjustments_;  // the step's draws' logit transforms
  std::vector<model::LogitAdjustment> adjust_scratch_;
  std::vector<RequestState*> owners_;
  std::uint64_t admissions_ = 0;
  std::uint32_t admitted_this_step_ = 0;
  // The step's first admissions that had a prediction: {predicted, waited} seconds, given to
  // retry_ with the admissions.
  std::vector<std::pair<double, double>> admitted_waits_;
  double retry_now_ = 1;     // the estimate when the step began
  bool backlogged_ = false;  // the last step left requests waiting (RetryEstimate::note_step)
  // The wait forecast's inputs: the answers that ended, the step period (a moving mean), and
  // the forecast being built, published into forecast_ after each step.
  OutputLengths lengths_;
  double step_seconds_ = 0;
  Clock::time_point last_step_started_{};
  bool last_step_ran_ = false;  // it ran a step and left work for the next
  WaitForecast forecast_next_;
  std::vector<double> busy_, holds_;
  StepCounters step_counters_;
  // The stepping thread's copy of !lost_.ok(): slots on a lost context are not released (every
  // driver call fails there; the memory goes with the process).
  bool context_lost_ = false;

  // Shared, under mutex_.
  mutable Mutex mutex_;
  std::condition_variable wake_;  // the worker: work arrived or stop
  std::condition_variable idle_;  // drain: nothing left
  std::vector<std::unique_ptr<RequestState>> inbox_ KVVM_GUARDED_BY(mutex_);
  std::vector<RequestId> cancels_ KVVM_GUARDED_BY(mutex_);
  bool cancel_all_ KVVM_GUARDED_BY(mutex_) = false;
  bool draining_ KVVM_GUARDED_BY(mutex_) = false;
  Status lost_ KVVM_GUARDED_BY(mutex_);  // not OK once the GPU context was lost
  bool stop_ KVVM_GUARDED_BY(mutex_) = false;
  bool started_ KVVM_GUARDED_BY(mutex_) = false;
  bool work_left_ KVVM_GUARDED_BY(mutex_) = false;  // as of the last step
  RequestId next_id_ KVVM_GUARDED_BY(mutex_) = 1;
  std::uint64_t queued_ KVVM_GUARDED_BY(mutex_) = 0;  // inbox and queue
  std::uint64_t submitted_ KVVM_GUARDED_BY(mutex_) = 0;
  std::uint64_t refused_at_submit_ KVVM_GUARDED_BY(mutex_) = 0;
  std::uint64_t refused_predicted_ KVVM_GUARDED_BY(mutex_) = 0;  // of those: predicted wait
  std::uint32_t running_count_ KVVM_GUARDED_BY(mutex_) = 0;
  StepCounters published_ KVVM_GUARDED_BY(mutex_);
  model::GraphStats graphs_ KVVM_GUARDED_BY(mutex_);
  RetryEstimate retry_ KVVM_GUARDED_BY(mutex_);
  WaitForecast forecast_ KVVM_GUARDED_BY(mutex_);
  // Started under mutex_ (start()), joined by the thread that stops the engine.
  std::thread worker_;
};

}  // namespace kvvm::engine
