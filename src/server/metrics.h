// GET /metrics: Prometheus text exposition (format 0.0.4).
//
// vLLM's names where vLLM has the metric, so dashboards built for it read kvvm:
//   gauges      vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc
//               (0..1, as vLLM reports it: (kvvm_kv_physical_bytes -
//               kvvm_kv_reclaimable_bytes) / kvvm_kv_budget_bytes, engine::kv_usage),
//               vllm:cache_config_info (1, the KV cache's configuration in its labels: kvvm's
//               own, as vLLM's are its cache config's fields, and vLLM's block_size and
//               num_gpu_blocks, which endpoint pickers read; cache_blocks() below),
//               vllm:lora_requests_info (kvvm serves no adapters: max_lora="0" and empty
//               adapter lists, the wall time of the scrape as its value, as vLLM stamps it)
// Every gauge is computed when /metrics is read, from the engine's state at its last step
// boundary (requests are admitted and end only there) plus the arrivals since: no timer
// caches them, so a scraper polling every 50 ms reads values at most one step old.
//   counters    vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total (tokens),
//               vllm:prompt_tokens_total, vllm:generation_tokens_total,
//               vllm:num_preemptions_total, vllm:request_success_total{finished_reason}
//   histograms  vllm:time_to_first_token_seconds, vllm:time_per_output_token_seconds,
//               vllm:inter_token_latency_seconds, vllm:e2e_request_latency_seconds,
//               vllm:request_queue_time_seconds, vllm:request_prefill_time_seconds,
//               vllm:request_decode_time_seconds, vllm:request_params_n,
//               vllm:request_prompt_tokens, vllm:request_generation_tokens,
//               vllm:iteration_tokens_total (tokens per engine step, from EngineStats)
// and kvvm's own: kvvm_driver_calls_total{op}, kvvm_driver_seconds_total{op},
// kvvm_kv_committed_bytes,
// kvvm_kv_physical_bytes, kvvm_kv_reclaimable_bytes, kvvm_kv_budget_bytes, kvvm_kv_commits_total,
// kvvm_kv_reclaimed_bytes_total, kvvm_requests_refused_total{reason} (overloaded = the 429s),
// kvvm_http_responses_total{endpoint,status}, kvvm_ignored_fields_total{field}, kvvm_draining;
// structured output's: kvvm_constrained_requests_total, kvvm_grammar_compiles_total,
// kvvm_grammar_compile_seconds_total, kvvm_grammar_cache_hits_total,
// kvvm_grammar_refused_total, kvvm_grammar_cache_entries, kvvm_grammar_cache_bytes and the
// histogram kvvm_grammar_mask_seconds (each constrained draw's mask, on the host).
// Every vLLM-named sample carries model_name="..." as vLLM's do. A counter's family name ends
// in _total (the TYPE line names the sample), as prometheus_client writes them.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvvm/base/mutex.h"
#include "kvvm/engine/engine.h"
#include "kvvm/governor/governor.h"
#include "kvvm/grammar/constraint.h"
#include "kvvm/grammar/grammar_cache.h"
#include "kvvm/kv/layout.h"
#include "kvvm/vmm/driver.h"

namespace kvvm::server {

// vLLM's block_size and num_gpu_blocks for kvvm's KV, which has no blocks: a router's prefix
// scorer hashes prompts in blocks of block_size tokens and sizes its index by num_gpu_blocks.
// The prefix cache matches whole windows ending on a token boundary, so a hit comes in units of
// the fewest tokens that fill whole granules, lcm(granule, contiguous bytes per token) /
// contiguous bytes per token; block_size is the smallest multiple of that unit of at least 16
// (vLLM's default block, and the KV events' default block: a router hashing either way meets
// the same boundaries). A block is that many tokens in every fragment, and the budget holds
// floor(budget / (block_size * bytes_per_token)) of them. Both 0 for a plan without a granule.
struct CacheBlocks {
  std::uint64_t block_size = 0;  // tokens
  std::uint64_t num_gpu_blocks = 0;
};
CacheBlocks cache_blocks(const LayoutPlan& plan, std::uint64_t budget_bytes);

// A Prometheus histogram: fixed upper bounds, cumulative when rendered. Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending; +Inf is implied
  void observe(double value);
  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<std::uint64_t> counts;  // per bucket (not cumulative), +Inf last
    double sum = 0;
    std::uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  mutable Mutex mutex_;
  Snapshot data_ KVVM_GUARDED_BY(mutex_);
};

// What the HTTP layer counts itself. Thread-safe.
class ServerMetrics {
 public:
  ServerMetrics();
  // One answered HTTP request: its route ("/v1/completions", ...; anything else "other") and
  // status.
  void count_response(std::string_view endpoint, int status);
  // A request the engine finished (stop or length): the latency and token histograms, each of
  // `inter_token_seconds` (RequestStream::inter_token_seconds), its `n` choices and
  // vllm:request_success_total{finished_reason}.
  void observe_finished(const engine::RequestStats& stats, engine::RequestEnd end,
                        std::span<const double> inter_token_seconds = {}, std::uint32_t n = 1);
  // A refusal: reason "overloaded" (429), "draining" (503), "unauthorized" (401),
  // "too_large" (413), "invalid" (400 / 404).
  void count_refusal(std::string_view reason);
  // A request field kvvm ignored (ApiRequest::ignored): kvvm_ignored_fields_total{field}.
  // The label set is bounded, since clients choose the names: a name that is not 1 to 64 of
  // [A-Za-z0-9_.-], or any past the first kMaxIgnoredNames, is counted as "other". Returns
  // the name counted the first time it is counted (the caller logs each name once), nullopt
  // after.
  std::optional<std::string> count_ignored_field(std::string_view field);
  static constexpr std::size_t kMaxIgnoredNames = 64;

  // The KV cache as configured: vllm:cache_config_info's labels.
  struct CacheConfig {
    std::string layout;  // to_string(Layout)
    // The KV space's element type in use, as to_string(DType) names it (fp8, bf16, fp16,
    // fp32), never vLLM's "auto": a dashboard can tell an fp8 cache apart.
    std::string cache_dtype;
    // The weights' quantization, as to_string(WeightQuant) names it ("none", "fp8-block128",
    // "fp8-channel"): vLLM's dashboards read the model's quantization off this gauge too.
    std::string quantization = "none";
    std::uint64_t granule_bytes = 0;
    std::uint64_t num_slots = 0;    // the arena's slots (the graphs' padding slot included)
    std::uint64_t max_context = 0;  // tokens a slot holds
    bool prefix_caching = false;    // (the budget label is the tier's limit)
    CacheBlocks blocks;             // vLLM's block_size and num_gpu_blocks labels
  };
  struct Inputs {
    std::string model_name;
    CacheConfig cache;
    engine::EngineStats engine;
    DriverCallCounts driver;
    TierStats tier;  // the KV tier's governor view (limit = the budget)
    model::WeightStats weights;
    bool draining = false;
    grammar::GrammarCacheStats grammar_cache;  // the server's structured-output grammars
    // Seconds since the epoch when the inputs were read: vllm:lora_requests_info's value.
    double unix_time = 0;
  };
  // The whole exposition text.
  std::string render(const Inputs& inputs) const;

 private:
  mutable Mutex mutex_;
  std::map<std::pair<std::string, int>, std::uint64_t> responses_ KVVM_GUARDED_BY(mutex_);
  std::map<std::string, std::uint64_t> refusals_ KVVM_GUARDED_BY(mutex_);
  // By finished_reason.
  std::map<std::string, std::uint64_t> successes_ KVVM_GUARDED_BY(mutex_);
  std::map<std::string, std::uint64_t> ignored_ KVVM_GUARDED_BY(mutex_);  // by field name
  // Each has its own lock.
  Histogram ttft_, tpot_, itl_, e2e_, queue_, prefill_, decode_, prompt_tokens_, generation_tokens_,
      params_n_;
};

}  // namespace kvvm::server
