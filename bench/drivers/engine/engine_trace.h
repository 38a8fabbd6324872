// The trace part of `kvvm bench engine`: the `kvvm simulate` generator's trace (sim/trace.h:
// Poisson arrivals, ShareGPT-like log-normal lengths, tenants whose requests start with the
// tenant's system prompt) replayed open loop through a real engine. The engine steps on its
// own thread (Engine::start); a submitter thread submits each request at its arrival time,
// whatever the engine's progress, with the token ids synthesize_ids() gives (the same ids for
// a tenant's system prompt, so the prefix cache shares within the tenant, whose index is the
// request's EngineRequest::tenant), folded into the vocabulary.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>

#include "bench/drivers/engine/engine_report.h"
#include "kvvm/base/status.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/model/model.h"
#include "sim/trace.h"

namespace kvvm::cli {

struct ReplayParams {
  bool preallocate = false;           // the preallocated-KV engine instead of the arena
  std::uint32_t max_running = 0;      // > 0
  double duration_limit_s = 0;        // 0: none; else later arrivals are not submitted and what
                                      // is still running at the limit is cancelled
  bool refuse_predicted_wait = true;  // EngineOptions::refuse_predicted_wait
  bool wait_forecast = true;          // EngineOptions::wait_forecast
  std::chrono::milliseconds max_queue_wait{30000};      // EngineOptions's; 0: no limit
  std::uint32_t parked_slots = 0;                       // KvSpaceOptions's
  std::uint32_t max_prefill_tokens_while_decoding = 0;  // EngineOptions's; 0: no bound
  std::chrono::microseconds tpot_target{0};             // EngineOptions's; 0: no target
  std::chrono::microseconds ttft_target{0};             // EngineOptions's; 0: no target
  std::ostream* progress = nullptr;                     // a line every few seconds (may be null)
};

// Builds a KV space (`kv` with max_running + parked_slots + 1 slots) and an engine, replays `trace`
// (its ids synthesized, see synthesize_ids) and reports. `rate` is only recorded.
Result<TraceRun> replay_trace(model::Model& model, const engine::KvSpaceOptions& kv,
                              const Trace& trace, double rate, const ReplayParams& params);

}  // namespace kvvm::cli
