// Sampling as the engine's callers see it: the model layer's counter-based sampler
// (kvvm/model/sampling.h), under the engine's namespace.
#pragma once

#include "kvvm/model/sampling.h"

namespace kvvm::engine {

using model::check_sampling;
using model::counter_uniform;
using model::sample_token;
using model::SamplingParams;

}  // namespace kvvm::engine
