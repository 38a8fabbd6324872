// What `kvvm bench engine` measured, and its renderings: a text report, JSON with ordered keys,
// and the SVG chart of output tokens/s against request rate (arena vs preallocated).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvvm/engine/engine.h"

namespace kvvm::cli {

// One decode measurement: `batch` identical-length random prompts submitted together, each
// generating `decode_tokens` greedy tokens (end tokens ignored). The decode figures count only
// what happens after every sequence has its first token, so prefill is left out.
struct DecodeRun {
  std::string mode;  // "graphs", "eager" or "preallocated"
  std::uint32_t batch = 0;
  std::string skipped;  // why the mode did not run (empty: it ran)
  std::string note;     // what the reader should know (no graph captured, a queued batch)
  std::uint64_t generated_tokens = 0;  // every token, first ones included
  std::uint64_t decode_tokens = 0;     // tokens after every sequence had its first token
  std::uint64_t decode_steps = 0;      // engine steps after that moment
  double prefill_seconds = 0;          // submit to every sequence's first token
  double decode_seconds = 0;           // that moment to the last token
  double decode_tokens_per_s = 0;
  double ms_per_step = 0;
  // The window's steps split by whether they ended a sequence: a step that ends one also
  // releases its slot (the arena unmaps its windows, tens of microseconds a granule on a GPU),
  // work ms_per_step spreads over all the steps.
  double ms_per_running_step = 0;    // steps that ended no sequence
  std::uint64_t retiring_steps = 0;  // steps that ended at least one
  double retiring_ms = 0;            // their time, in all
  std::uint32_t peak_running = 0;
  std::uint64_t graph_replays = 0;
  std::uint64_t eager_steps = 0;
  // The constrained mode's token masks on the host: how many, and their mean time.
  std::uint64_t masks = 0;
  double mask_us = 0;
  // A mixture's expert cache over the timed run (prefill and decode; absent without a cache):
  // lookups and hits, bytes copied per token the model processed (prompts and outputs), the
  // time the steps waited on copies.
  bool expert_cache = false;
  std::uint64_t expert_lookups = 0, expert_hits = 0;
  double expert_bytes_per_token = 0;
  double expert_copy_seconds = 0;
};

// One offline run (bench/drivers/engine/engine_offline.h): every request submitted at once.
struct OfflineRun {
  std::string label;  // "128/128", or the dataset's file name
  std::uint64_t requests = 0;
  std::uint64_t input_tokens = 0;
  std::uint64_t output_tokens = 0;
  std::uint32_t max_running = 0;   // the engine's limit (the KV budget's, unless given)
  std::uint32_t peak_running = 0;  // what ran at once at most
  std::uint32_t warmup = 0;        // requests run first, excluded
  double seconds = 0;              // submit of the first to the end of the last
  double output_tokens_per_s = 0;
  double total_tokens_per_s = 0;  // prompts and outputs
  double requests_per_s = 0;
  double latency_p50_s = 0, latency_p99_s = 0;  // submit to a request's last token
  double ttft_p50_s = 0, ttft_p99_s = 0;        // submit to its first token
  double tpot_p50_ms = 0, tpot_p99_ms = 0;      // its tokens after the first, each
  std::uint64_t steps = 0;
  std::uint64_t graph_replays = 0;
  std::uint64_t preemptions = 0;
  engine::StepPhaseSeconds phases;  // the measured run's steps, where the host's time went
  // With --speculative-config: verifications, tokens proposed, tokens kept.
  std::uint64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
  std::string note;
};

// One open-loop replay of the generated trace at one rate through one engine.
struct TraceRun {
  std::string system;                    // "arena" or "preallocated"
  double rate = 0;                       // requests per second
  std::uint64_t submitted = 0;           // submit() calls (arrivals inside --duration-limit)
  std::uint64_t completed = 0;           // ended by their length (or an end token)
  std::uint64_t refused_overloaded = 0;  // at submit or in the queue
  std::uint64_t refused_at_arrival = 0;  // of those, at submit (the 429 a client sees at once)
  std::uint64_t cancelled = 0;           // still running when the duration limit ended it
  std::uint64_t failed = 0;              // any other error
  std::uint64_t not_submitted = 0;       // arrivals after the duration limit
  std::uint64_t output_tokens = 0;       // delivered to the callbacks
  double wall_seconds = 0;               // first arrival to the last event
  double output_tokens_per_s = 0;        // output_tokens / wall_seconds
  // The rate while loaded (bench/drivers/engine/steady_rate.h): from the first to the last moment
  // the engine held 9/10 of its peak running; 0 when that window is under a second.
  double steady_start_s = 0, steady_end_s = 0;
  double steady_output_tokens_per_s = 0;
  double ttft_p50_s = 0, ttft_p99_s = 0;  // completed requests
  double tpot_p50_s = 0, tpot_p99_s = 0;  // completed requests with two tokens or more
  std::uint32_t peak_running = 0;
  std::uint64_t prefix_hit_tokens = 0;
  std::uint64_t preemptions = 0;
  // The KV's memory-driver calls during the replay, the engine's thread and the arena's
  // commit-ahead worker together: seconds in map and set_access (which includes the access
  // changes that publish windows to the prefix cache), in unmap, and in create and release.
  double kv_map_seconds = 0, kv_unmap_seconds = 0, kv_create_release_seconds = 0;
  std::uint64_t kv_map_calls = 0, kv_unmap_calls = 0;
  std::uint64_t reused_admissions = 0;  // admitted into a finished slot's mapped windows
  std::uint64_t shared_admissions = 0;  // admitted sharing a cached prefix's windows
  // Shared admissions that passed over a finished slot still mapping their prefix (its last
  // sequence's kernels may still read what it would unmap), and reclaims that left a
  // finished slot its prefix's windows.
  std::uint64_t reuse_fence_pending = 0, prefix_kept_reclaims = 0;
  std::string first_error;  // the first failure's message, when any failed
  std::string note;         // what the reader should know (a preallocated engine over capacity)
};

// One system of the choices part: one prompt answered n times.
struct ChoicesRun {
  std::string system;  // "fork" (one request of n choices) or "requests" (n requests at once)
  std::uint32_t n = 0;
  std::uint64_t peak_kv_bytes = 0;  // in use (mapped less reclaimable), the most after any step
  double seconds = 0;               // submit to the last token
  std::uint64_t generated_tokens = 0;
  std::uint64_t steps = 0;
  std::uint64_t forks = 0;              // the arena's forks
  std::uint64_t prefix_hit_tokens = 0;  // prompt tokens found cached
};

struct BenchEngineReport {
  std::string model_dir;
  std::string architecture;
  std::string backend;  // "cpu" or "cuda"
  std::string kernels;  // CUDA: "fused" or "unfused" (--unfused-kernels), then
                        // ", in-order launches" (--in-order-launches); else empty
  std::uint32_t layers = 0;
  std::uint32_t vocab_size = 0;
  std::uint64_t max_context = 0;
  std::uint64_t kv_budget = 0;  // bytes, as the KV space resolved it
  std::string kv_dtype;
  std::uint64_t kv_bytes_per_token = 0;  // every layer's K and V
  // Sequences of max context the budget holds: the preallocated engine's concurrency bound.
  std::uint64_t preallocated_capacity = 0;
  std::uint32_t max_running = 0;
  // Weights: where they live (WeightSplit::describe), what a step streams, and the load.
  std::string weights;
  bool dummy_weights = false;
  std::uint64_t weights_device_bytes = 0;  // physical, from the store's handles
  std::uint64_t weights_streamed_bytes_per_step = 0;
  std::uint32_t weights_streamed_layers = 0;
  std::uint32_t weights_ring_slots = 0;
  std::uint64_t load_bytes = 0;
  double load_seconds = 0;
  // Decode part.
  std::uint64_t prompt_tokens = 0;
  std::uint64_t decode_tokens = 0;
  std::vector<DecodeRun> decode;
  std::uint32_t logprobs = 0;  // the "logprobs" decode mode's alternatives (0: not run)
  // Choices part (none when not asked).
  std::uint64_t choices_prompt_tokens = 0;
  std::uint64_t choices_tokens = 0;
  std::vector<ChoicesRun> choices;
  std::vector<OfflineRun> offline;
  // Trace part.
  std::uint64_t trace_requests = 0;
  std::uint32_t tenants = 0;
  std::uint64_t system_prompt_tokens = 0;
  std::uint64_t seed = 0;
  double duration_limit_s = 0;     // 0: none
  double max_queue_wait_s = 0;     // the engines' queue-wait bound; 0: none
  std::uint32_t parked_slots = 0;  // the arena engine's slots beyond max_running
  std::vector<TraceRun> trace;
  double wall_seconds = 0;
};

nlohmann::ordered_json bench_engine_json(const BenchEngineReport& report);
void print_bench_engine(const BenchEngineReport& report, std::ostream& out);
// The SVG chart: one line per system, output tokens/s against rate.
std::string bench_engine_svg(const BenchEngineReport& report);

}  // namespace kvvm::cli
