// generate(): one sequence through a model on a KvSpace: admit a slot, prefill the prompt in
// chunks, decode token by token until an end token or max_tokens, release the slot. The
// single-sequence path of `kvvm generate` and of the parity tests; the batched engine
// schedules many sequences with the same model and arena calls.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kvvm/engine/kv_space.h"
#include "kvvm/model/model.h"
#include "kvvm/model/sampling.h"
#include "kvvm/status.h"

namespace kvvm::engine {

// The sampler is the model layer's (both backends draw inside a step); requests name it here.
using model::check_sampling;
using model::counter_uniform;
using model::sample_token;
using model::SamplingParams;

struct GenerateRequest {
  std::vector<std::int32_t> prompt;  // non-empty
  std::uint32_t max_tokens = 128;    // 0: prefill only (prompt_logits filled)
  SamplingParams sampling;
  std::vector<std::int32_t> stop_ids;  // end tokens (the config's eos ids, say); not emitted
  std::uint32_t prefill_chunk = 0;     // tokens per prefill step; 0: the model's step limit
  bool keep_prompt_logits = false;     // fill GenerateResult::prompt_logits
};

struct GenerateTimings {
  double prefill_seconds = 0;  // admit + every prefill step, to the first token's logits
  double decode_seconds = 0;   // every decode step after the first token
  std::uint32_t decode_steps = 0;
};

enum class FinishReason : std::uint8_t { kStop, kLength };

struct GenerateResult {
  std::vector<std::int32_t> tokens;  // generated, the stop token excluded
  FinishReason finish = FinishReason::kLength;
  std::vector<float> prompt_logits;  // the prompt's last position, when asked
  GenerateTimings timings;
};

// Called with each generated token as soon as it is known; returning false stops generation
// (finish kStop). InvalidArgument for an empty prompt, prompt + max_tokens beyond the
// KvSpace's context, or bad sampling parameters; the arena's error (ResourceExhausted, ...)
// when the KV cannot grow. The slot is released on every path.
using TokenCallback = std::function<bool(std::int32_t token)>;
Result<GenerateResult> generate(model::Model& model, KvSpace& kv, const GenerateRequest& request,
                                const TokenCallback& on_token = {});

}  // namespace kvvm::engine
