// `kvvm bench engine`: the batched engine on one Hugging Face checkpoint, the anchors of
// docs/ARCHITECTURE.md "Anchors for speed" measured in one run:
//   (a) decode throughput at each --batches size for three engine modes: kvvm with CUDA graphs,
//       kvvm without them, and kvvm with preallocated KV (max context per sequence, same
//       engine and kernels). Prefill is left out: the clock starts when every sequence has its
//       first token (bench/drivers/engine/engine_decode.h);
//   (b) an open-loop replay of the `kvvm simulate` generator's trace (ShareGPT-like lengths,
//       tenants with system prompts) at each --rates value, through the arena engine and the
//       preallocated one at the same KV budget (bench/drivers/engine/engine_trace.h);
//   (c) with --choices N: one prompt answered N times, as one request of N choices (forked)
//       and as N requests at once with the prefix cache (bench/drivers/engine/engine_choices.h);
//   (d) with --offline IN/OUT,... or --offline-dataset FILE: every request submitted at once,
//       on the terms of `trtllm-bench throughput` (bench/drivers/engine/engine_offline.h).
// With --logprobs K the decode part adds a mode whose requests ask for K alternatives per
// token, beside the graphs mode it is compared with.
// On the CPU backend graphs do not exist: that mode is reported as skipped, with the reason.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "bench/drivers/engine/engine_report.h"
#include "kit/weight_flags.h"
#include "kvvm/base/dtype.h"
#include "kvvm/base/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

struct BenchEngineOptions {
  std::string model_dir;                 // --model DIR (required)
  std::string backend = "auto";          // auto | cpu | cuda
  std::uint64_t max_context = 0;         // 0: min(the config's max_position_embeddings, 8192)
  std::uint32_t max_running = 0;         // 0: kDefaultMaxRunning (and at least the largest batch)
  std::uint64_t kv_budget = 0;           // bytes; 0: the KV space's default, resolved once
  WeightFlags weights;                   // --weight-budget, --ring-slots, --load-format
  DType kv_dtype = DType::kUnset;        // --kv-dtype; kUnset: the KV space's default
  std::string kv_scales = "checkpoint";  // --kv-scales: checkpoint or calibrate
  bool unfused = false;                  // --unfused-kernels: CudaModelOptions::fused false
  bool in_order_launches = false;        // --in-order-launches: set_overlapped_launches(false)
  std::string batches = "1,32";          // decode batch sizes
  std::uint64_t prompt_tokens = 128;
  std::uint64_t decode_tokens = 128;
  std::string rates = "1,2,4,8";                     // trace replay, requests per second
  std::string trace_systems = "arena,preallocated";  // --trace-systems: which engines replay
  std::uint64_t requests = 100;                      // per rate
  double duration_limit_s = 0;                       // per replay; 0: none
  bool no_early_refusal = false;  // the replays' engines refuse only after max_queue_wait
  bool no_wait_forecast = false;  // their predicted waits from the admission rate alone
  double max_queue_wait_s = 30;   // the replays' engines' EngineOptions::max_queue_wait
  // The arena replays' KV slots beyond max_running (KvSpaceOptions::parked_slots); unset: as
  // many as max_running.
  std::optional<std::uint32_t> parked_slots;
  std::uint32_t max_prefill_tokens_while_decoding = 0;  // the replays' engines; 0: no bound
  double tpot_target_ms = 0;                            // the replays' engines; 0: no target
  double ttft_target_ms = 0;                            // the replays' engines; 0: no target
  std::uint32_t tenants = 4;
  std::uint64_t system_prompt_tokens = 512;
  std::uint64_t seed = 1;
  std::uint32_t logprobs = 0;  // > 0: a decode mode asking for this many alternatives
  // A decode mode whose requests are held to a grammar over this tokenizer's vocabulary: the
  // JSON Schema in constrain_schema, else the regex constrain_regex (structured output's cost).
  std::string constrain_tokenizer;
  std::string constrain_schema;
  std::string constrain_regex;
  std::uint32_t choices = 0;  // > 1: the choices part with this n
  std::uint64_t choices_prompt_tokens = 2048;
  std::uint64_t choices_tokens = 256;
  std::string offline;          // --offline "128/128,1000/1000"
  std::string offline_dataset;  // --offline-dataset FILE
  std::uint64_t offline_requests = 1000;
  std::uint32_t offline_max_running = 0;  // 0: what the KV budget holds
  std::uint32_t offline_warmup = 8;
  // --speculative-config for the offline runs (empty: off); a draft model is loaded as the
  // model is (its own --load-format dummy weights when the model's are; the same folder as
  // --model: the model drafts for itself, every proposal kept, which prices the verify rows).
  std::string speculative_config;
  bool skip_decode = false;
  bool skip_trace = false;
  bool json = false;
  std::string plot;  // SVG file
};

inline constexpr std::uint64_t kDefaultBenchContext = 8192;
inline constexpr std::uint32_t kDefaultMaxRunning = 64;
// The offline runs' sequences in one step at most when --offline-max-running is not given:
// the model's activations are sized for it, and the KV budget sets what runs below it.
inline constexpr std::uint32_t kDefaultOfflineChunks = 2048;

// Adds `engine` under the existing `bench` subcommand.
CLI::App* add_bench_engine_command(CLI::App& bench, BenchEngineOptions& options);

// Loads the model and runs both parts; `progress` (may be null) receives progress lines.
Result<BenchEngineReport> make_bench_engine(const BenchEngineOptions& options,
                                            std::ostream* progress);

// The whole subcommand: the report (text or --json) on `out`, --plot written, kExitUsage for
// bad options, kExitFailure when a run failed.
int run_bench_engine(const BenchEngineOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
