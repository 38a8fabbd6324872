// DraftProposer: speculative decoding's draft-model proposer (SpeculativeMethod::kDraftModel).
// A smaller checkpoint with the target's vocabulary runs beside it on a KV space of its own
// (under the target's governor, so both caches share one device budget) and proposes each
// speculating sequence's next tokens greedily, the whole batch at once: one forward that
// catches every sequence up on the tokens it has not read (the prompt at first, then the
// step's kept tokens), whose greedy draw is each sequence's first proposal, then one single-token
// forward per further proposal. Its steps after the first are decode steps: on CUDA they
// replay the draft's own decode graphs.
//
// A draft's KV follows its sequence by length alone, as the target's does: after a verify the
// sequence keeps min(what the draft has read, what the target has computed) of it, and the
// rest is overwritten when the draft next catches up. Every failure here (the draft's KV
// refused, a step of the draft failing) costs the sequence its proposals for the step and
// nothing else: it decodes as it would without speculation. The draft's slot goes when the
// sequence is released or preempted.
//
// Thread-safety: the engine's stepping thread alone calls it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/engine/kv_manager.h"
#include "kvvm/engine/speculative.h"
#include "kvvm/model/model.h"
#include "request_state.h"

namespace kvvm::engine {

class DraftProposer {
 public:
  // InvalidArgument naming the value when the draft cannot serve `target`: another backend,
  // another vocabulary size, or a KV space whose geometry is not the draft's. A sequence
  // proposes only what the draft's context holds after it. `graphs`: capture the draft's decode
  // graphs for up to `max_running` sequences (CUDA; a failed capture leaves eager steps).
  static Result<std::unique_ptr<DraftProposer>> create(const DraftModel& draft,
                                                       const model::Model& target,
                                                       std::uint32_t num_speculative_tokens,
                                                       std::uint32_t max_running, bool graphs);
  ~DraftProposer();  // the graphs released, then every slot still held
  DraftProposer(const DraftProposer&) = delete;
  DraftProposer& operator=(const DraftProposer&) = delete;

  // Fills each request's planned proposals (r->drafts, sized by the scheduler) with the draft's
  // greedy tokens after r->tokens (through its grammar's masks when constrained), and returns how
  // many of each it filled, in order: all of them, or 0 for a sequence the draft could not serve
  // this step (still catching up on a long prompt, its KV refused, the draft's step failed).
  std::span<const std::uint32_t> propose(std::span<RequestState* const> requests);
  // The sequence's draft slot released (its end, its preemption). `driver_usable` false: the
  // GPU context is lost and no driver call is made (the memory goes with the process).
  void release(RequestState& r, bool driver_usable = true);

  struct Stats {
    std::uint64_t steps = 0;        // draft forwards run
    std::uint64_t caught_up = 0;    // tokens read to catch sequences up
    std::uint64_t refused = 0;      // sequences left without proposals by their KV
    std::uint64_t failed = 0;       // draft forwards that failed
    std::uint64_t graph_steps = 0;  // of the forwards, those that replayed a graph
  };
  Stats stats() const { return stats_; }

 private:
  DraftProposer(model::Model& model, std::unique_ptr<KvManager> kv, std::uint32_t k,
                std::uint64_t context);
  // One forward over chunks_ (ids_ packed in chunk order; chunk m is requests[members_[m]]'s):
  // each chunk's greedy draw into drawn_, through its grammar's mask where masked_[m] and the
  // request is constrained. False (counted, logged once) when the step failed.
  bool forward(std::span<RequestState* const> requests);
  // `token` as proposal j of r (requests[i]): kept unless r's grammar refuses it or it is an
  // end, which stop r's proposals; a constrained r's matcher moves past it (rolled back at the
  // end of propose()).
  void take(RequestState& r, std::size_t i, std::int32_t token, std::uint32_t j);
  // r's draft slot, admitted when it has none, committed through `tokens`; false when refused.
  bool hold(RequestState& r, std::uint64_t tokens);

  model::Model& model_;
  std::unique_ptr<KvManager> kv_;
  const std::uint32_t k_;
  const std::uint64_t context_;  // the draft's: its space's max_context and its positions
  bool graphs_captured_ = false;
  bool warned_ = false;
  Stats stats_;
  // Each step's buffers, sized once.
  std::vector<std::int32_t> ids_;
  std::vector<model::Chunk> chunks_;
  std::vector<std::int32_t> drawn_;
  std::vector<model::ChunkSampling> sampling_;
  std::vector<std::uint32_t> masks_;
  std::vector<bool> masked_;          // chunk m's draw is a proposal (masked when constrained)
  std::vector<std::uint32_t> taken_;  // proposals each request's matcher moved past
  std::vector<std::uint32_t> filled_;
  std::vector<std::uint32_t> want_;   // proposals each request can take this step
  std::vector<std::size_t> members_;  // the requests in this forward's chunks, by index
  std::vector<SlotId> unreleased_;    // releases that failed, tried again
};

}  // namespace kvvm::engine
