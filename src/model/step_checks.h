// The checks every backend makes of a step before it touches anything (Model::forward's
// contract): counts within the limits, chunks that hold tokens and sum to token_ids, ids in
// the vocabulary, positions below max_position_embeddings, sampling entries for sampled
// outputs, and log-probability requests within bounds and with somewhere to go. The view's
// checks stay with each backend (the element types they read differ).
#pragma once

#include <string>
#include <string_view>

#include "kvvm/base/status.h"
#include "kvvm/model/model.h"

namespace kvvm::model::detail {

// InvalidArgument naming the value, the field and the limit; each message starts with
// `who` ("forward", "CUDA model"), then ": ".
Status check_step(const StepBatch& batch, const StepOutput& out, const ModelConfig& config,
                  const ModelLimits& limits, std::string_view who);

// The logit-transform part of check_step: at most max_logit_adjustments, each chunk's range
// inside the batch's, its ids ascending inside the vocabulary, biases finite or -inf.
Status check_adjustments(const StepBatch& batch, const ModelConfig& config,
                         const ModelLimits& limits, const std::string& prefix);

// The log-probability part of check_step (which calls it): top_logprobs within
// kMaxTopLogprobs, a known logprob_rows, last_target -1 or in the vocabulary, and
// out.logprobs and out.sampled present when any chunk asks. `prefix` is check_step's
// ("forward: ").
// Token masks: whole rows (token_mask_words of the vocabulary each), at most max_chunks, every
// mask_row naming one of them, every named row allowing a token.
Status check_token_masks(const StepBatch& batch, const ModelConfig& config,
                         const ModelLimits& limits, const std::string& prefix);
Status check_logprobs(const StepBatch& batch, const StepOutput& out, const ModelConfig& config,
                      const std::string& prefix);

}  // namespace kvvm::model::detail
