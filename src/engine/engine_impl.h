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
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/engine/kv_manager.h"
#include "kvvm/mutex.h"
#include "request_state.h"
#include "retry_estimate.h"

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
  // Choice `index` of `request`, not yet submitted (engine.cc).
  std::unique_ptr<RequestState> make_state(EngineRequest request, std::uint32_t index) const;
  void worker();  // engine.cc

  // The step's phases (engine_step.cc).
  // Takes the inbox and the cancellations.
  void take_inbox(Clock::time_point now);
  void admit_waiting(Clock::time_point now);
  // Refuses the requests still waiting, never admitted, past max_queue_wait.
  void refuse_overdue(Clock::time_point now);
  // Plans the step's chunks and commits what they write; false when there is nothing to run.
  bool plan_step();
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

  // Request outcomes (engine_request.cc).
  void touch(RequestState& r);
  void end_request(RequestState& r, RequestEnd end, Status error = Status::Ok());
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
  double retry_now_ = 1;  // the estimate when the step began
  StepCounters step_counters_;

  // Shared, under mutex_.
  mutable Mutex mutex_;
  std::condition_variable wake_;  // the worker: work arrived or stop
  std::condition_variable idle_;  // drain: nothing left
  std::vector<std::unique_ptr<RequestState>> inbox_ KVVM_GUARDED_BY(mutex_);
  std::vector<RequestId> cancels_ KVVM_GUARDED_BY(mutex_);
  bool cancel_all_ KVVM_GUARDED_BY(mutex_) = false;
  bool draining_ KVVM_GUARDED_BY(mutex_) = false;
  bool stop_ KVVM_GUARDED_BY(mutex_) = false;
  bool started_ KVVM_GUARDED_BY(mutex_) = false;
  bool work_left_ KVVM_GUARDED_BY(mutex_) = false;  // as of the last step
  RequestId next_id_ KVVM_GUARDED_BY(mutex_) = 1;
  std::uint64_t queued_ KVVM_GUARDED_BY(mutex_) = 0;  // inbox and queue
  std::uint64_t submitted_ KVVM_GUARDED_BY(mutex_) = 0;
  std::uint64_t refused_at_submit_ KVVM_GUARDED_BY(mutex_) = 0;
  std::uint32_t running_count_ KVVM_GUARDED_BY(mutex_) = 0;
  StepCounters published_ KVVM_GUARDED_BY(mutex_);
  model::GraphStats graphs_ KVVM_GUARDED_BY(mutex_);
  RetryEstimate retry_ KVVM_GUARDED_BY(mutex_);
  // Started under mutex_ (start()), joined by the thread that stops the engine.
  std::thread worker_;
};

}  // namespace kvvm::engine
