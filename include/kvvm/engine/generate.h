// generate(): one request through a model on a KvSpace, start to finish, on the caller's
// thread: the path of `kvvm generate` and of the parity tests. A thin wrapper over Engine (one
// running sequence, no prefix cache): the same scheduler, checks, sampling and CUDA graphs as
// every batched request, returned in one piece.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/engine/speculative.h"
#include "kvvm/grammar/compiled_grammar.h"
#include "kvvm/model/model.h"
#include "kvvm/model/sampling.h"

namespace kvvm::engine {

// The sampler is the model layer's (both backends draw inside a step); requests name it here.
using model::check_sampling;
using model::counter_uniform;
using model::sample_token;
using model::SamplingParams;

struct GenerateRequest {
  std::vector<std::int32_t> prompt;  // non-empty
  std::uint32_t max_tokens = 128;    // 0 only with keep_prompt_logits: prefill only
  SamplingParams sampling;
  std::vector<std::int32_t> stop_ids;  // end tokens (the config's eos ids, say); not emitted
  std::uint32_t prefill_chunk = 0;     // tokens per prefill step; 0: the model's step limit
  bool keep_prompt_logits = false;     // fill GenerateResult::prompt_logits
  // CUDA: capture the engine's decode graphs for this call. Off by default: a capture costs
  // more than a short answer's decode saves; `kvvm generate` turns it on.
  bool graphs = false;
  // Structured output: every draw masked to what this grammar allows (EngineRequest::grammar),
  // compiled against this model's vocabulary with stop_ids as its ends.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // Speculative decoding (EngineOptions::speculative): the same tokens in fewer steps; with
  // method kDraftModel, `draft` is the draft and its KV space (EngineOptions::draft).
  SpeculativeOptions speculative;
  DraftModel draft;
};

struct GenerateTimings {
  double prefill_seconds = 0;  // admit + every prefill step, to the first token's logits
  double decode_seconds = 0;   // every decode step after the first token
  std::uint32_t decode_steps = 0;
  std::uint32_t decode_tokens = 0;  // after the first (more than the steps when speculating)
  // Speculative decoding: the tokens proposed and those kept.
  std::uint64_t draft_tokens = 0, accepted_tokens = 0;
};

enum class FinishReason : std::uint8_t { kStop, kLength };

struct GenerateResult {
  std::vector<std::int32_t> tokens;  // generated, the stop token excluded
  FinishReason finish = FinishReason::kLength;
  std::vector<float> prompt_logits;  // the prompt's last position, when asked
  GenerateTimings timings;
};

// Called with each generated token as soon as it is known; returning false stops generation
// (finish kStop). InvalidArgument from check_request_limits (engine.h: the same message as
// Engine::submit gives) against request_limits(model, kv); the arena's or the model's error
// when the KV cannot grow or a step fails. The slot is released on every path.
// REQUIRES: nothing else uses the kv's arena during the call (an Engine owns it meanwhile).
using TokenCallback = std::function<bool(std::int32_t token)>;
Result<GenerateResult> generate(model::Model& model, KvSpace& kv, const GenerateRequest& request,
                                const TokenCallback& on_token = {});

}  // namespace kvvm::engine
