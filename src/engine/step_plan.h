// The values one engine step passes between its phases. The scheduler's schedule() returns a
// StepPlan (who runs, which chunk of which prompt, the graph bucket, who was preempted, admitted
// or refused); the model runner executes it and returns StepOutputs (each chunk's draw and
// log-probabilities); the scheduler's update() applies them (stops, streams, frees). A phase
// reads only what the one before returned, so each can be read and tested alone, and a new
// feature of the step (a grammar's mask, speculative tokens) is a new field here.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/model/model.h"
#include "request_state.h"

namespace kvvm::engine {

// One sequence's share of a step: its tokens [start, start + tokens).
struct ScheduledChunk {
  RequestState* request = nullptr;
  std::uint32_t start = 0;
  std::uint32_t tokens = 0;
  // 0: the sequence's own tokens. j >= 1: a speculative row, one token at position start whose
  // input is the j-th proposal (request->drafts[j - 1]); a sequence's rows follow its decode
  // chunk in the plan, j ascending.
  std::uint32_t draft = 0;
};

struct StepPlan {
  // In the order the model runs them: decode tokens first, then running prompts, then the
  // admitted ones' first chunks. Every chunk's KV is committed through start + tokens.
  std::vector<ScheduledChunk> chunks;
  std::uint32_t tokens = 0;  // all chunks together
  bool decode_only = true;   // every chunk a single token
  // The smallest captured decode graph's batch that holds a decode-only step; 0 when the step
  // runs eagerly (a prefill chunk in it, no graphs, or more chunks than the largest bucket).
  std::uint32_t graph_bucket = 0;
  // What planning changed besides the chunks: requests admitted (each with its first chunk in
  // `chunks`), preempted (back in line, their KV released), and refused (ended: overdue in the
  // queue, or an admission that could never succeed).
  std::vector<const RequestState*> admitted;
  std::vector<const RequestState*> preempted;
  std::vector<const RequestState*> refused;

  bool empty() const { return chunks.empty(); }
};

// One chunk's result, in the plan's order.
struct ChunkOutput {
  std::int32_t sampled = -1;  // the token drawn after the chunk (moot mid-prompt)
  model::LogprobRows rows = model::LogprobRows::kNone;
  std::span<const model::RowLogprobs> logprobs;  // `rows` of them: none, the last, or all
  std::span<const float> logits;  // the last row's, when the chunk ends a prompt kept whole
};

struct StepOutputs {
  // Not OK: the step failed and its chunks' KV is in an unknown state (no chunk output).
  Status status;
  std::vector<ChunkOutput> chunks;  // valid until the runner's next execute()
};

}  // namespace kvvm::engine
