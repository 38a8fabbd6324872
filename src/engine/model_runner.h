// ModelRunner: the step's middle phase. It turns a StepPlan into the model's batch (token ids,
// chunks, each chunk's sampling, the draws' logit transforms), runs one forward and returns
// what each chunk drew as StepOutputs. It owns the step's buffers, reused from step to step.
#pragma once

#include <cstdint>
#include <vector>

#include "kvvm/kv/arena.h"
#include "kvvm/model/model.h"
#include "step_plan.h"

namespace kvvm::engine {

class ModelRunner {
 public:
  explicit ModelRunner(model::Model& model, std::uint32_t step_tokens);

  // Runs `plan` (non-empty) on `kv`. The outputs' spans point into this runner's buffers and
  // stay valid until the next call.
  const StepOutputs& execute(const StepPlan& plan, const KvView& kv);
  // Adds the masks computed since the last call to `stats` (mask count, time, buckets).
  void add_grammar_stats(GrammarStats& stats);
  // The last execute()'s host time building the batch, and in the model's forward (seconds).
  double prepare_seconds() const { return prepare_seconds_; }
  double forward_seconds() const { return forward_seconds_; }

 private:
  // A speculative row (c.draft >= 1): the proposal as its input, drawn as the sequence would
  // draw after the proposals before it.
  void add_draft_row(const ScheduledChunk& c, std::size_t& logprob_rows_wanted);
  // r's next draw masked by its grammar: a row of masks_ filled and named in `sampling`.
  void add_mask(RequestState& r, model::ChunkSampling& sampling);

  model::Model& model_;
  std::vector<std::int32_t> ids_;
  std::vector<model::Chunk> chunks_;
  std::vector<model::ChunkSampling> sampling_;
  std::vector<std::int32_t> sampled_;
  std::vector<model::RowLogprobs> logprob_rows_;     // grown when a step first needs more
  std::vector<model::LogitAdjustment> adjustments_;  // the step's draws' logit transforms
  std::vector<model::LogitAdjustment> adjust_scratch_;
  std::vector<float> logits_;  // rare: a request asking for its prompt's logits
  // The step's token masks (constrained draws), token_mask_words(vocab) words a row.
  std::vector<std::uint32_t> masks_;
  std::size_t mask_rows_ = 0;   // rows of masks_ this step
  GrammarStats grammar_stats_;  // since add_grammar_stats last took them
  StepOutputs outputs_;
  double prepare_seconds_ = 0;
  double forward_seconds_ = 0;
};

}  // namespace kvvm::engine
