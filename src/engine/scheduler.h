// Scheduler: the requests inside the engine and the two phases of a step that decide and
// apply. schedule() plans the step (decode tokens first, then running prompts, then new
// requests into the room left, committing every chunk's KV and preempting the newest sequence
// when growth is refused) and returns it as a StepPlan; update() applies the model's
// StepOutputs (draws, stops, stop strings, forks, prefix-cache publishing). Requests leave
// through end_request() (released at once, delivered after the step) or preempt() (back in
// line, recomputed later). The stepping thread alone calls it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "admission_control.h"
#include "draft_proposer.h"
#include "kvvm/engine/engine.h"
#include "kvvm/engine/kv_manager.h"
#include "request_state.h"
#include "step_plan.h"

namespace kvvm::engine {

// What the stepping thread counts; the engine publishes a copy after each step.
struct StepCounters {
  std::uint64_t finished = 0, cancelled = 0, failed = 0, refused_in_queue = 0;
  std::uint64_t preemptions = 0, steps = 0, decode_only_steps = 0;
  StepTokenCounts step_tokens;
  std::uint64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  std::uint64_t forced_tokens = 0;  // of the generated: a grammar's forced runs
  std::uint64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
  std::uint64_t spec_draft_steps = 0, spec_draft_refused = 0, spec_draft_failed = 0;
  std::uint32_t peak_running = 0;
};

class Scheduler {
 public:
  // REQUIRES: options resolved; model, kv and admission outlive the scheduler.
  Scheduler(const model::Model& model, KvManager& kv, const EngineOptions& options,
            AdmissionControl& admission);

  // The decode graphs captured (ascending batch sizes; empty: none), for StepPlan::graph_bucket.
  void set_graph_buckets(std::vector<std::uint32_t> buckets) { buckets_ = std::move(buckets); }
  // With speculative method kDraftModel: what fills the planned proposals (outlives this).
  void set_draft_proposer(DraftProposer* draft) { draft_ = draft; }

  // Arrivals, last in line; cancellations of every choice of each id, or of all.
  void enqueue(std::unique_ptr<RequestState> r);
  void cancel(std::span<const RequestId> ids);
  void cancel_all();

  // Plans the step at `now`: the running sequences' chunks with their KV committed (the newest
  // preempted while growth is refused), the waiting ones admitted into the room left, each
  // with its first chunk, and the overdue refused. An empty plan: nothing to run.
  StepPlan schedule(Clock::time_point now);
  // Applies what the model returned for `plan`: each chunk's tokens computed, its draw taken
  // (a stop, a stop string, max_tokens), its log-probabilities kept, its forks made, its
  // written tokens published. A failed step ends the plan's requests with the error.
  void update(const StepPlan& plan, const StepOutputs& outputs, Clock::time_point now);
  // The GPU context is gone: every request ends with `lost`, and slots are no longer released
  // (every driver call fails there; the memory goes with the process).
  void lose_context(const Status& lost);

  // After a step: the slots whose release failed retried, the finished requests' stats
  // counted and moved out of the running set and the line.
  void finish_step(Clock::time_point now);
  // The requests with an event this step (finished ones included), until delivered().
  std::span<RequestState* const> events() const { return touched_; }
  // Every event was delivered: the finished requests go.
  void delivered();

  const RunningSet& running() const { return running_; }
  const WaitingQueue& waiting() const { return waiting_; }
  const StepCounters& counters() const { return counters_; }
  // The model ran a step of `tokens` tokens (decode_only: every chunk a single token).
  void count_step(std::uint32_t tokens, bool decode_only);

 private:
  // What is left of the step being planned: tokens, logit transforms, and the prefill share
  // (max_prefill_tokens_while_decoding) that binds once a decode token is in it.
  struct Room {
    std::uint32_t tokens = 0;
    std::size_t transforms = 0;
    std::uint32_t prefill = 0;
    bool decoding = false;
  };
  // Whether the step being planned has room for another prefill chunk.
  bool room_for_prefill(const StepPlan& plan, const Room& room) const;
  // The tokens of r's next chunk in the step being planned (its decode token: 1).
  std::uint32_t chunk_tokens(const RequestState& r, const Room& room) const;
  // Adds r's next `n` tokens to the plan; false when they do not fit it.
  bool plan_chunk(StepPlan& plan, Room& room, RequestState& r, std::uint32_t n);
  // Commits a speculative row's token; where that is refused (or fails), the row and the later
  // ones of its sequence are dropped and its proposals cut there: never a preemption, never an
  // error, the sequence decodes as it would have without them.
  void commit_draft(StepPlan& plan, ScheduledChunk& row);
  // Commits what each planned chunk writes, preempting the newest sequence while growth is
  // refused; chunks of requests preempted or failed are dropped from the plan.
  void commit_planned(StepPlan& plan);
  // Admits from the front of the line while a running place, the step's token budget and its
  // prefill share leave room for a chunk.
  void admit_waiting(StepPlan& plan, Room& room, Clock::time_point now);
  // Refuses the requests still waiting, never admitted, past max_queue_wait.
  void refuse_overdue(StepPlan& plan, Clock::time_point now);

  // Speculative decoding (scheduler_speculation.cc). Whether this step's decoding sequences
  // speculate (on, and fewer of them than disable_by_batch_size).
  bool speculates_this_step() const;
  // After r's decode chunk: its proposals as speculative rows, as many as the step, the
  // transforms' bound and max_tokens leave.
  void plan_drafts(StepPlan& plan, Room& room, RequestState& r);
  // How many of `proposals` r's grammar accepts in turn, stopping before an end token (all of
  // them for an unconstrained request); r's matcher is left as it was.
  std::size_t grammar_prefix(RequestState& r, std::span<const std::int32_t> proposals) const;
  // With a draft model, once the rows are committed: the draft fills every planned proposal;
  // the rows it could not fill are dropped.
  void propose_with_draft(StepPlan& plan);
  // Applies the draws of r's decode chunk (plan.chunks[first]) and of its speculative rows
  // after it: each proposal kept while it equals the draw before it, the first draw that
  // differs (or the one after the last proposal) taken as the step's last token; the tokens
  // as on_sampled takes them, one at a time. Returns the rows after `first` it consumed.
  std::size_t verify_drafts(RequestState& r, const StepOutputs& outputs, std::size_t first,
                            Clock::time_point now);

  // The token sampled after the request's last missing one.
  void on_sampled(RequestState& r, std::int32_t token, Clock::time_point now);
  // Appends one output token (drawn or forced): its text, the stop strings, the grammar's end,
  // max_tokens. False once the request ended.
  bool append_output(RequestState& r, std::int32_t token, Clock::time_point now);
  // With a grammar trigger not yet seen: takes `token`'s bytes and starts r's grammar once its
  // output holds the trigger.
  void start_grammar(RequestState& r, std::int32_t token) const;
  // The tokens a grammar forces after r's last token (EngineOptions::jump_forward), at most what
  // max_tokens leaves; empty without a grammar, a tokenizer, or with log-probabilities asked.
  std::vector<std::int32_t> forced_tokens(RequestState& r) const;
  // Tells the KV manager the ids and the written tokens, so later requests may share them.
  void publish_written(RequestState& r);
  // The choices waiting on `parent`, whose prompt is now computed, fork its KV
  // (scheduler_forks.cc): each becomes a running sequence missing the prompt's last token, or,
  // without room or a running place, a request first in line.
  void fork_choices(RequestState& parent, Clock::time_point now);

  // Request outcomes (scheduler_requests.cc).
  void touch(RequestState& r);
  void end_request(RequestState& r, RequestEnd end, Status error = Status::Ok());
  void release_slot(RequestState& r);
  bool retry_releases();  // the slots whose release failed; whether any was released
  void preempt(RequestState& victim);
  // The newest running request not finished; null when none.
  RequestState* newest_running();
  std::size_t active_running() const;  // running and not finished
  void finish_stats(RequestState& r, Clock::time_point now);

  const model::Model& model_;
  KvManager& kv_;
  const EngineOptions& options_;
  AdmissionControl& admission_;
  std::vector<std::uint32_t> buckets_;
  DraftProposer* draft_ = nullptr;
  std::vector<RequestState*> drafting_;  // propose_with_draft's requests, kept for its buffer

  WaitingQueue waiting_;
  RunningSet running_;
  std::vector<std::unique_ptr<RequestState>> done_;  // finished this step
  std::vector<RequestState*> touched_;               // with an event this step
  std::vector<SlotId> unreleased_;  // released by no request any more; retried after each step
  std::uint64_t admissions_ = 0;
  StepCounters counters_;
  bool context_lost_ = false;
};

}  // namespace kvvm::engine
