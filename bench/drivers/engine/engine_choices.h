// The choices part of `kvvm bench engine`: one random prompt answered n times, as one request
// of n choices (one prefill, the others forking its KV) and as n requests of it submitted at
// once with the prefix cache on (each admitted before any has published its prompt, so each
// computes it). Both greedy, end tokens ignored, with the decode graphs where there are any,
// stepped on this thread after a warm-up request; reported: the peak of the KV bytes in use
// (physical bytes mapped less what finished slots keep for reuse, read after every step) and
// the time from submit to the last token.
#pragma once

#include <cstdint>

#include "bench/drivers/engine/engine_report.h"
#include "kvvm/base/status.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/model/model.h"

namespace kvvm::cli {

struct ChoicesParams {
  std::uint32_t n = 8;
  std::uint64_t prompt_tokens = 2048;
  std::uint64_t max_tokens = 256;
  std::uint64_t seed = 1;
};

// Builds a KV space of n sequences per system (from `kv`) and measures both; the fork first.
Result<std::vector<ChoicesRun>> measure_choices(model::Model& model,
                                                const engine::KvSpaceOptions& kv,
                                                const ChoicesParams& params);

}  // namespace kvvm::cli
