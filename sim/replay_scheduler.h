// The scheduler of `kvvm simulate`: replays a trace in simulated time against one memory
// model (kvvm's real arena, or a baseline's accounting), so every model sees the same
// requests under the same rules and only the memory differs.
//
// Simulated time is discrete: one step is one decode iteration of `step_s` seconds. Nothing
// sleeps. A request arriving at t seconds joins the queue at step ceil(t / step_s). Each step:
//   1. arrivals join the back of the FIFO queue;
//   2. decode: every running sequence, oldest admission first, grows by one token. When the
//      model has no room for it, the most recently admitted running sequence is preempted
//      (released, and put back at the front of the queue to be recomputed with its prompt and
//      the tokens generated so far, as vLLM's recompute preemption does) until the growth
//      fits; a sequence that cannot grow even when it runs alone is aborted (it can never
//      finish in this budget). A sequence that reached prompt + output tokens is released;
//   3. queued requests that have waited longer than `max_queue_wait_s` are rejected (what a
//      server answers with HTTP 429); preempted requests were already answered and never are;
//   4. admission: the head of the queue is admitted (prefill: its whole prompt at once) while
//      the model has room; the first that does not fit stops admission for this step (FIFO:
//      no later request overtakes it). A head that does not fit while nothing runs never
//      will: it is rejected as too large;
//   5. a sample: running, queued, and the model's committed / live / saved bytes.
// Closed loop: a request that follows another (a later turn of a conversation) arrives when
// that one completed plus its think time, at the next step at the earliest; when that one is
// rejected or aborted the conversation ends and its later turns are abandoned.
// The run ends when every request finished or was rejected. Peaks are over the whole run;
// means over the steps while requests arrive (0 to the last arrival's step), since the drain
// after it lasts as long as the few longest outputs and would dilute them; waste over the
// whole run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvvm/base/status.h"
#include "sim/trace.h"

namespace kvvm::cli {

// What a model holds now, in bytes.
struct MemorySample {
  std::uint64_t committed = 0;  // backing the running sequences (shared bytes once per sharer)
  std::uint64_t live = 0;       // tokens x bytes per token, running sequences
  std::uint64_t saved = 0;      // what sharing saves: committed - physical
  std::uint64_t used = 0;       // charged to the budget (physical, pooled, reclaimable)
};

// A prefix cache's figures over a run, counted on successful admissions only (a refused one is
// retried next step and would count again): queries = prompt tokens looked up (with the
// generated ones of a preempted request), hits = of which found cached (vLLM's meaning).
struct CacheFigures {
  bool enabled = false;
  std::uint64_t queries = 0;
  std::uint64_t hits = 0;
  std::uint64_t evictions = 0;     // cached windows or blocks evicted to make room
  std::uint64_t cached_bytes = 0;  // held by the cache at the end
  std::uint64_t published = 0;     // windows or blocks that entered the cache
  std::uint64_t bytes_per_token = 0;
  double hit_rate() const { return queries == 0 ? 0.0 : static_cast<double>(hits) / queries; }
  // KV bytes that did not have to be computed and written again.
  std::uint64_t saved_bytes() const { return hits * bytes_per_token; }
};

// The memory of one system. Sequence ids are request indices into the trace.
class MemoryModel {
 public:
  virtual ~MemoryModel() = default;
  virtual std::string name() const = 0;
  // Admits request `seq` holding `tokens` tokens now. false: no room now (it waits);
  // an error status aborts the simulation.
  virtual Result<bool> admit(std::size_t seq, const TraceRequest& request,
                             std::uint64_t tokens) = 0;
  // Grows a running sequence to `tokens` tokens. false: no room now.
  virtual Result<bool> grow(std::size_t seq, std::uint64_t tokens) = 0;
  virtual Status release(std::size_t seq) = 0;
  virtual MemorySample sample() const = 0;
  virtual CacheFigures cache() const { return {}; }
};

struct SchedulerOptions {
  double step_s = 0.05;
  double max_queue_wait_s = 30;
  std::uint64_t bytes_per_token = 0;  // for the live bytes of every model's report
};

// One step's sample, as the time series of --csv and --plot show it.
struct StepSample {
  std::uint32_t running = 0;
  std::uint32_t queued = 0;
  std::uint64_t committed = 0;
  std::uint64_t live = 0;
  std::uint64_t saved = 0;
  std::uint64_t used = 0;
};

struct RunSummary {
  std::string name;
  std::uint64_t requests = 0;
  std::uint64_t admitted = 0;  // admitted at least once
  std::uint64_t queued = 0;    // waited at least one step: admitted later than they arrived,
                               // or rejected
  std::uint64_t rejected = 0;  // all rejections (429s): waited too long, or too large
  std::uint64_t rejected_too_large = 0;  // of those: could not fit even with nothing running
  std::uint64_t completed = 0;
  std::uint64_t aborted = 0;    // admitted, then could not grow even alone
  std::uint64_t abandoned = 0;  // later turns never sent: an earlier one was rejected/aborted
  std::uint64_t preemptions = 0;
  std::uint32_t peak_concurrency = 0;
  double mean_concurrency = 0;  // over the steps while requests arrive (0 to the last arrival)
  double mean_wait_s = 0;       // queue wait before the first admission, admitted requests
  double p99_wait_s = 0;
  std::uint64_t steps = 0;
  double simulated_s = 0;
  std::uint64_t peak_committed = 0;
  std::uint64_t peak_live = 0;
  std::uint64_t peak_used = 0;
  std::uint64_t peak_saved = 0;
  double mean_committed = 0;  // over the same steps as mean_concurrency
  double mean_live = 0;
  double mean_saved = 0;
  // sum over every step of (committed - live) / sum of live: the time-weighted waste.
  double waste_ratio = 0;
  std::vector<StepSample> series;  // one per step
  CacheFigures cache;
};

// Called every step with (step, summary so far); the CLI's progress line.
using ProgressFn = std::function<void(std::uint64_t step, const RunSummary& so_far)>;

// Runs `trace` through `model`. A model error aborts with its status (with the step).
Result<RunSummary> run_schedule(const Trace& trace, MemoryModel& model,
                                const SchedulerOptions& options, const ProgressFn& progress = {});

}  // namespace kvvm::cli
