// The checks every backend makes of a step before it touches anything (Model::forward's
// contract): counts within the limits, chunks that hold tokens and sum to token_ids, ids in
// the vocabulary, positions below max_position_embeddings, and sampling entries for sampled
// outputs. The view's checks stay with each backend (the element types they read differ).
#pragma once

#include <string_view>

#include "kvvm/model/model.h"
#include "kvvm/status.h"

namespace kvvm::model::detail {

// InvalidArgument naming the value, the field and the limit; each message starts with
// `who` ("forward", "CUDA model"), then ": ".
Status check_step(const StepBatch& batch, const StepOutput& out, const ModelConfig& config,
                  const ModelLimits& limits, std::string_view who);

}  // namespace kvvm::model::detail
