// The decode part of `kvvm bench engine`: `batch` random prompts of equal length submitted
// together, each generating exactly `decode_tokens` greedy tokens (end tokens ignored), stepped
// on this thread. After each step the clock is read; the decode window opens at the end of
// the step that gave the last sequence its first token, and closes at the end of the last
// step, so decode tokens/s and ms per step leave prefill (and decode steps that ran mixed with
// it) out; the steps that ended a sequence (ending one releases its slot, whose windows the
// arena unmaps) are also timed one by one, so the release is reported apart from the steady
// step. A warm-up batch of other random prompts (two tokens each) runs first on the same
// engine, so first-use costs (cuBLAS handles, lazy kernel loads) are not counted.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>

#include "bench/drivers/engine/engine_report.h"
#include "kvvm/base/status.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/grammar/compiled_grammar.h"
#include "kvvm/model/model.h"

namespace kvvm::cli {

// kLogprobs: as kGraphs (eager on the CPU), every request asking for DecodeParams::logprobs
// alternatives per token: what reporting log-probabilities costs. kConstrained: as kGraphs,
// every request's output held to DecodeParams::grammar (structured output): what the masks
// cost. A grammar that completes ends its request early (fewer tokens: the report says how
// many were generated).
enum class DecodeMode { kGraphs, kEager, kPreallocated, kLogprobs, kConstrained };
const char* to_string(DecodeMode mode);

struct DecodeParams {
  std::uint32_t batch = 1;
  std::uint64_t prompt_tokens = 128;
  std::uint64_t decode_tokens = 128;  // >= 2: one first token, then decode
  std::uint64_t seed = 1;
  std::uint32_t logprobs = 0;                               // kLogprobs: alternatives per token
  std::shared_ptr<const grammar::CompiledGrammar> grammar;  // kConstrained
};

// Builds a KV space (`kv` with batch + 1 slots) and an engine in `mode`, and measures. A mode
// that cannot run here (graphs on the CPU) comes back with DecodeRun::skipped set.
Result<DecodeRun> measure_decode(model::Model& model, const engine::KvSpaceOptions& kv,
                                 DecodeMode mode, const DecodeParams& params);

}  // namespace kvvm::cli
