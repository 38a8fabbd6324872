// Engine::Impl: the engine core. A step is three phases over values: the scheduler's
// schedule() returns a StepPlan, the model runner executes it and returns StepOutputs, the
// scheduler's update() applies them; then the step's events are delivered.
//
// The stepping thread alone owns the scheduler (the line, the running sequences) and the
// runner (the step's buffers); other threads meet it only through mutex_: submit() and
// cancel() leave requests and ids in an inbox the next step takes in one lock, and each step
// publishes its counters back in one lock. Admission control has its own lock, taken after
// this one. Callbacks run after the step with no lock held, so they may submit or cancel.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "admission_control.h"
#include "draft_proposer.h"
#include "kvvm/base/mutex.h"
#include "kvvm/engine/engine.h"
#include "kvvm/engine/kv_manager.h"
#include "model_runner.h"
#include "request_state.h"
#include "scheduler.h"

namespace kvvm::engine {

class Engine::Impl {
 public:
  // `draft`: the draft model's proposer, with speculative method kDraftModel; else null.
  Impl(model::Model& model, std::unique_ptr<KvManager> kv, EngineOptions options,
       std::uint64_t context, std::unique_ptr<DraftProposer> draft);
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
  Status validate(const EngineRequest& request) const;  // engine_options.cc
  // The scheduler's time: EngineOptions::clock, else the steady clock.
  Clock::time_point now() const;
  // Choice `index` of `request`, not yet submitted.
  std::unique_ptr<RequestState> make_state(EngineRequest request, std::uint32_t index) const;
  void worker();

  // Moves the inbox into the scheduler's line and applies the cancellations; the requests
  // queued as the step begins.
  std::uint64_t take_inbox();
  // The GPU context is gone (context_lost(cause)): every running and waiting request ends with
  // the error, and from now on submit() refuses and health() says why.
  void lose_context(const Status& cause);
  // Counts the finished, publishes the step's counters and the admission forecast, and runs
  // the callbacks of every request with an event.
  void deliver(Clock::time_point now);
  void fill_event(const RequestState& r, RequestEvent& event) const;

  model::Model& model_;
  // Every sequence's KV goes through it, caching on or off (docs/ARCHITECTURE.md, "The KV seam").
  const std::unique_ptr<KvManager> kv_;
  EngineOptions options_;
  const std::uint64_t context_;  // prompt + max_tokens limit
  bool graphs_captured_ = false;
  AdmissionControl admission_;
  // Declared before the scheduler, which holds it: it goes after every request's draft slot
  // was released through it.
  std::unique_ptr<DraftProposer> draft_;

  // The stepping thread's own.
  Scheduler scheduler_;
  ModelRunner runner_;
  std::vector<RequestId> cancels_taken_;
  // The stepping thread's copy of !lost_.ok().
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
  std::uint64_t queued_ KVVM_GUARDED_BY(mutex_) = 0;  // inbox and line
  std::uint64_t submitted_ KVVM_GUARDED_BY(mutex_) = 0;
  std::uint32_t running_count_ KVVM_GUARDED_BY(mutex_) = 0;
  StepCounters published_ KVVM_GUARDED_BY(mutex_);
  model::GraphStats graphs_ KVVM_GUARDED_BY(mutex_);
  GrammarStats grammar_ KVVM_GUARDED_BY(mutex_);     // the runner's masks, the submits' count
  StepPhaseSeconds phases_ KVVM_GUARDED_BY(mutex_);  // the steps' phases, summed
  // Started under mutex_ (start()), joined by the thread that stops the engine.
  std::thread worker_;
};

}  // namespace kvvm::engine
