#include "server/metrics.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <numeric>
#include <string>
#include <system_error>

#include "kvvm/engine/kv_manager.h"

namespace kvvm::server {
namespace {

// vLLM's bucket bounds (vllm/v1/metrics/loggers.py), so its dashboards' quantiles read the
// same here.
std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,  0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160., 640., 2560.};
}
std::vector<double> tpot_buckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
          0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> latency_buckets() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120., 240.0, 480.0, 960.0, 1920.0, 7680.0};
}
std::vector<double> n_buckets() { return {1, 2, 5, 10, 20}; }
std::vector<double> token_buckets() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};
}

// The engine's steps by their tokens, as a histogram's snapshot (the engine keeps the counts).
Histogram::Snapshot step_token_snapshot(const engine::StepTokenCounts& steps) {
  Histogram::Snapshot snapshot;
  snapshot.upper_bounds.assign(engine::kStepTokenBounds.begin(), engine::kStepTokenBounds.end());
  snapshot.counts.assign(steps.buckets.begin(), steps.buckets.end());
  snapshot.sum = static_cast<double>(steps.tokens);
  for (std::uint64_t count : steps.buckets) snapshot.count += count;
  return snapshot;
}

// Constrained draws by their mask's host time, as a histogram's snapshot (the engine counts).
Histogram::Snapshot mask_seconds_snapshot(const engine::GrammarStats& grammar) {
  Histogram::Snapshot snapshot;
  snapshot.upper_bounds.assign(engine::kMaskSecondsBounds.begin(),
                               engine::kMaskSecondsBounds.end());
  snapshot.counts.assign(grammar.mask_buckets.begin(), grammar.mask_buckets.end());
  snapshot.sum = grammar.mask_seconds;
  for (std::uint64_t count : grammar.mask_buckets) snapshot.count += count;
  return snapshot;
}

// The refusal reasons the HTTP layer reports; each is rendered (at 0 too) so a rate() over
// them has a series from the first scrape on.
constexpr std::string_view kRefusalReasons[] = {"overloaded", "draining", "unauthorized",
                                                "too_large", "invalid"};
constexpr std::string_view kFinishedReasons[] = {"stop", "length"};

// Bounds the (endpoint, status) series: the route comes from the HTTP layer, but a bug there
// must not let clients grow the exposition without limit.
constexpr std::size_t kMaxResponseSeries = 256;

std::string format_double(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  // Shortest text that reads back as the same double; whole numbers below 2^53 without an
  // exponent (le="100000", not le="1e+05"), as people read them.
  const bool whole = std::fabs(value) < 9007199254740992.0 && value == std::trunc(value);
  auto [end, ec] =
      whole ? std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::fixed)
            : std::to_chars(buffer, buffer + sizeof(buffer), value);
  if (ec != std::errc()) return "NaN";  // cannot happen with 64 bytes
  return std::string(buffer, end);
}

std::string format_uint(std::uint64_t value) { return std::to_string(value); }

// Label values escape backslash, double quote and newline (format 0.0.4).
void append_escaped(std::string& out, std::string_view value) {
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
}

// HELP text escapes backslash and newline only.
void append_help(std::string& out, std::string_view text) {
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

using Labels = std::vector<std::pair<std::string_view, std::string_view>>;

class Writer {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    append_help(out_, help);
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }

  void sample(std::string_view name, const Labels& labels, std::string_view value) {
    out_ += name;
    if (!labels.empty()) {
      out_ += '{';
      bool first = true;
      for (const auto& [key, label_value] : labels) {
        if (!first) out_ += ',';
        first = false;
        out_ += key;
        out_ += "=\"";
        append_escaped(out_, label_value);
        out_ += '"';
      }
      out_ += '}';
    }
    out_ += ' ';
    out_ += value;
    out_ += '\n';
  }

  void sample(std::string_view name, const Labels& labels, std::uint64_t value) {
    sample(name, labels, format_uint(value));
  }
  void sample(std::string_view name, const Labels& labels, double value) {
    sample(name, labels, format_double(value));
  }

  // A one-sample family.
  void single(std::string_view name, std::string_view type, std::string_view help,
              const Labels& labels, std::uint64_t value) {
    family(name, type, help);
    sample(name, labels, value);
  }
  void single(std::string_view name, std::string_view type, std::string_view help,
              const Labels& labels, double value) {
    family(name, type, help);
    sample(name, labels, value);
  }

  void histogram(std::string_view name, std::string_view help, const Labels& labels,
                 const Histogram::Snapshot& snapshot) {
    family(name, "histogram", help);
    const std::string bucket_name = std::string(name) + "_bucket";
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < snapshot.counts.size(); ++i) {
      cumulative += snapshot.counts[i];
      const std::string le = i < snapshot.upper_bounds.size()
                                 ? format_double(snapshot.upper_bounds[i])
                                 : std::string("+Inf");
      Labels with_le = labels;
      with_le.emplace_back("le", le);
      sample(bucket_name, with_le, cumulative);
    }
    sample(std::string(name) + "_sum", labels, snapshot.sum);
    sample(std::string(name) + "_count", labels, snapshot.count);
  }

  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace

CacheBlocks cache_blocks(const LayoutPlan& plan, std::uint64_t budget_bytes) {
  CacheBlocks blocks;
  const std::uint64_t per_token = plan.contiguous_bytes_per_token;
  if (plan.granule == 0 || per_token == 0 || plan.bytes_per_token == 0) return blocks;
  // granule / gcd = lcm(granule, per_token) / per_token, without the lcm's overflow.
  const std::uint64_t unit = plan.granule / std::gcd(plan.granule, per_token);
  constexpr std::uint64_t kVllmBlock = 16;
  blocks.block_size = unit * ((kVllmBlock + unit - 1) / unit);
  const std::uint64_t block_bytes = blocks.block_size * plan.bytes_per_token;
  if (block_bytes / plan.bytes_per_token == blocks.block_size) {  // no overflow
    blocks.num_gpu_blocks = budget_bytes / block_bytes;
  }
  return blocks;
}

Histogram::Histogram(std::vector<double> upper_bounds) {
  data_.upper_bounds = std::move(upper_bounds);
  data_.counts.assign(data_.upper_bounds.size() + 1, 0);
}

void Histogram::observe(double value) {
  // A NaN would make _sum NaN for good; it is no measurement, so it is dropped.
  if (std::isnan(value)) return;
  MutexLock lock(mutex_);
  // Prometheus buckets are "less than or equal": the first bound >= value.
  const auto it = std::lower_bound(data_.upper_bounds.begin(), data_.upper_bounds.end(), value);
  const auto index = static_cast<std::size_t>(it - data_.upper_bounds.begin());
  ++data_.counts[index];
  data_.sum += value;
  ++data_.count;
}

Histogram::Snapshot Histogram::snapshot() const {
  MutexLock lock(mutex_);
  return data_;
}

ServerMetrics::ServerMetrics()
    : ttft_(ttft_buckets()),
      tpot_(tpot_buckets()),
      itl_(tpot_buckets()),
      e2e_(latency_buckets()),
      queue_(latency_buckets()),
      prefill_(latency_buckets()),
      decode_(latency_buckets()),
      prompt_tokens_(token_buckets()),
      generation_tokens_(token_buckets()),
      params_n_(n_buckets()) {}

void ServerMetrics::count_response(std::string_view endpoint, int status) {
  MutexLock lock(mutex_);
  std::pair<std::string, int> key(std::string(endpoint), status);
  auto it = responses_.find(key);
  if (it == responses_.end() && responses_.size() >= kMaxResponseSeries) {
    key.first = "other";
    it = responses_.find(key);
  }
  if (it == responses_.end()) {
    responses_.emplace(std::move(key), 1);
  } else {
    ++it->second;
  }
}

void ServerMetrics::observe_finished(const engine::RequestStats& stats, engine::RequestEnd end,
                                     std::span<const double> inter_token_seconds, std::uint32_t n) {
  // vLLM's histograms and request_success_total cover finished requests only.
  if (end != engine::RequestEnd::kStop && end != engine::RequestEnd::kLength) return;
  {
    MutexLock lock(mutex_);
    ++successes_[std::string(engine::to_string(end))];
  }
  if (stats.generated_tokens > 0) ttft_.observe(stats.time_to_first_token);
  // One token has no gap after it: the engine reports 0, which is no measurement.
  if (stats.generated_tokens > 1) tpot_.observe(stats.time_per_output_token);
  for (const double gap : inter_token_seconds) itl_.observe(gap);
  e2e_.observe(stats.total_seconds);
  queue_.observe(stats.queue_seconds);
  // As vLLM splits a request's time: prefill from its (first) admission to its first token,
  // decode from the first token to the finish.
  if (stats.generated_tokens > 0) {
    prefill_.observe(std::max(0.0, stats.time_to_first_token - stats.queue_seconds));
    decode_.observe(std::max(0.0, stats.total_seconds - stats.time_to_first_token));
  }
  params_n_.observe(static_cast<double>(n));
  prompt_tokens_.observe(static_cast<double>(stats.prompt_tokens));
  generation_tokens_.observe(static_cast<double>(stats.generated_tokens));
}

void ServerMetrics::count_refusal(std::string_view reason) {
  MutexLock lock(mutex_);
  ++refusals_[std::string(reason)];
}

std::optional<std::string> ServerMetrics::count_ignored_field(std::string_view field) {
  constexpr std::size_t kMaxName = 64;
  const bool plain =
      !field.empty() && field.size() <= kMaxName &&
      std::all_of(field.begin(), field.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.' || c == '-';
      });
  MutexLock lock(mutex_);
  std::string name(plain ? field : "other");
  if (!ignored_.contains(name) && ignored_.size() >= kMaxIgnoredNames) name = "other";
  const bool first = !ignored_.contains(name);
  ++ignored_[name];
  if (!first) return std::nullopt;
  return name;
}

std::string ServerMetrics::render(const Inputs& inputs) const {
  std::map<std::pair<std::string, int>, std::uint64_t> responses;
  std::map<std::string, std::uint64_t> refusals;
  std::map<std::string, std::uint64_t> successes;
  std::map<std::string, std::uint64_t> ignored;
  {
    MutexLock lock(mutex_);
    responses = responses_;
    refusals = refusals_;
    successes = successes_;
    ignored = ignored_;
  }
  for (std::string_view reason : kRefusalReasons) refusals.try_emplace(std::string(reason), 0);
  for (std::string_view reason : kFinishedReasons) successes.try_emplace(std::string(reason), 0);

  const engine::EngineStats& engine = inputs.engine;
  const ArenaStats& arena = engine.arena;
  const Labels model = {{"model_name", inputs.model_name}};
  Writer w;

  w.single("vllm:num_requests_running", "gauge", "Requests in the running batch.", model,
           std::uint64_t{engine.running});
  w.single("vllm:num_requests_waiting", "gauge", "Requests waiting to be admitted.", model,
           std::uint64_t{engine.waiting});
  // A fraction, never above 1 (a picker scores 1 - usage): mapped bytes the tier charges
  // elsewhere, or a budget lowered under what is mapped, must not read as more than full.
  w.single("vllm:kv_cache_usage_perc", "gauge",
           "KV cache in use as a fraction of the KV budget (1 = full): physical bytes mapped "
           "minus those finished sequences keep for reuse, over the budget.",
           model, std::min(1.0, engine::kv_usage(arena, inputs.tier.limit)));
  const ServerMetrics::CacheConfig& cache = inputs.cache;
  const std::string granule = format_uint(cache.granule_bytes);
  const std::string slots = format_uint(cache.num_slots);
  const std::string context = format_uint(cache.max_context);
  const std::string budget = format_uint(inputs.tier.limit);
  const std::string block_size = format_uint(cache.blocks.block_size);
  const std::string num_blocks = format_uint(cache.blocks.num_gpu_blocks);
  w.single("vllm:cache_config_info", "gauge",
           "The KV cache's configuration, in the labels (value 1): vLLM's block_size (tokens the "
           "prefix cache matches in) and num_gpu_blocks (such blocks the budget holds), layout, "
           "element type, the weights' quantization, granule, slots, tokens a slot holds, byte "
           "budget and whether prefixes are cached.",
           {{"model_name", inputs.model_name},
            {"block_size", block_size},
            {"num_gpu_blocks", num_blocks},
            {"layout", cache.layout},
            {"cache_dtype", cache.cache_dtype},
            {"quantization", cache.quantization},
            {"granule_bytes", granule},
            {"num_slots", slots},
            {"max_context", context},
            {"budget_bytes", budget},
            {"enable_prefix_caching", cache.prefix_caching ? "True" : "False"}},
           std::uint64_t{1});
  // vLLM's labels, without model_name as vLLM writes them; an endpoint picker takes the sample
  // with the latest time and reads the adapters from it.
  w.single("vllm:lora_requests_info", "gauge",
           "LoRA adapters, in the labels: kvvm serves none (max_lora 0, no adapter running or "
           "waiting); the value is when this was read, seconds since the epoch.",
           {{"max_lora", "0"}, {"running_lora_adapters", ""}, {"waiting_lora_adapters", ""}},
           inputs.unix_time);
  w.single("vllm:prefix_cache_queries_total", "counter",
           "Prompt tokens looked up in the prefix cache.", model, engine.prefix.queries);
  w.single("vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
           model, engine.prefix.hits);
  w.single("vllm:prompt_tokens_total", "counter", "Prompt tokens processed.", model,
           engine.prompt_tokens);
  w.single("vllm:generation_tokens_total", "counter", "Tokens generated.", model,
           engine.generated_tokens);
  w.single("vllm:num_preemptions_total", "counter", "Requests preempted by the engine.", model,
           engine.preemptions);
  // Speculative decoding, as vLLM's v1 names its counters (0 while speculation is off).
  w.single("vllm:spec_decode_num_drafts_total", "counter",
           "Verifications: a sequence's step with proposed tokens.", model, engine.spec_drafts);
  w.single("vllm:spec_decode_num_draft_tokens_total", "counter", "Tokens proposed.", model,
           engine.spec_draft_tokens);
  w.single("vllm:spec_decode_num_accepted_tokens_total", "counter",
           "Proposed tokens kept (each equal to the model's own draw).", model,
           engine.spec_accepted_tokens);

  w.family("vllm:request_success_total", "counter",
           "Requests finished, by finished_reason (stop or length).");
  for (const auto& [reason, count] : successes) {
    w.sample("vllm:request_success_total",
             {{"model_name", inputs.model_name}, {"finished_reason", reason}}, count);
  }

  w.histogram("vllm:time_to_first_token_seconds",
              "Time from submit to the first generated token, seconds.", model, ttft_.snapshot());
  w.histogram("vllm:time_per_output_token_seconds",
              "Mean gap between output tokens after the first, seconds.", model, tpot_.snapshot());
  w.histogram("vllm:inter_token_latency_seconds",
              "Time between consecutive output tokens of finished requests, seconds.", model,
              itl_.snapshot());
  w.histogram("vllm:e2e_request_latency_seconds",
              "Time from submit to finish of finished requests, seconds.", model, e2e_.snapshot());
  w.histogram("vllm:request_queue_time_seconds", "Time from submit to first admission, seconds.",
              model, queue_.snapshot());
  w.histogram("vllm:request_prefill_time_seconds",
              "Time from first admission to the first token of finished requests, seconds.", model,
              prefill_.snapshot());
  w.histogram("vllm:request_decode_time_seconds",
              "Time from the first token to the finish of finished requests, seconds.", model,
              decode_.snapshot());
  w.histogram("vllm:request_params_n", "The n (choices) of finished requests.", model,
              params_n_.snapshot());
  w.histogram("vllm:request_prompt_tokens", "Prompt tokens of finished requests.", model,
              prompt_tokens_.snapshot());
  w.histogram("vllm:request_generation_tokens", "Generated tokens of finished requests.", model,
              generation_tokens_.snapshot());
  w.histogram("vllm:iteration_tokens_total",
              "Tokens each engine step computed (prompt and generated, every sequence).", model,
              step_token_snapshot(engine.step_tokens));

  w.family("kvvm_driver_calls_total", "counter", "Memory driver calls, by operation.");
  for (std::size_t i = 0; i < kDriverOpCount; ++i) {
    const auto op = static_cast<DriverOp>(i);
    w.sample("kvvm_driver_calls_total", {{"op", to_string(op)}}, inputs.driver.of(op));
  }
  w.family("kvvm_driver_seconds_total", "counter",
           "Wall time spent in memory driver calls, by operation (summed over threads).");
  for (std::size_t i = 0; i < kDriverOpCount; ++i) {
    const auto op = static_cast<DriverOp>(i);
    w.sample("kvvm_driver_seconds_total", {{"op", to_string(op)}}, inputs.driver.seconds(op));
  }
  w.single("kvvm_weights_resident_bytes", "gauge",
           "Device bytes the weights hold (physical: the store's handles, ring slots included).",
           {}, inputs.weights.physical_bytes);
  w.single("kvvm_weights_streamed_bytes_per_step", "gauge",
           "Weight bytes copied from host memory into the ring in every step (0: all resident).",
           {}, inputs.weights.split.streamed_bytes_per_step);
  w.single("kvvm_weights_streamed_layers", "gauge", "Layers streamed through the ring.", {},
           std::uint64_t{inputs.weights.split.streamed_layers});
  const model::ExpertCacheStats& experts = inputs.weights.experts;
  w.single(
      "kvvm_expert_cache_slots", "gauge",
      "Slots of a mixture's expert cache (0: every expert resident or streamed with its layer).",
      {}, std::uint64_t{experts.slots});
  w.single("kvvm_expert_cache_lookups_total", "counter",
           "Experts of a layer a step wanted from the expert experts.", {}, experts.lookups);
  w.single("kvvm_expert_cache_hits_total", "counter",
           "Expert cache lookups that found the expert resident.", {}, experts.hits);
  w.single("kvvm_expert_cache_misses_total", "counter",
           "Expert cache lookups that copied the expert in from host memory.", {}, experts.misses);
  w.single("kvvm_expert_cache_copied_bytes_total", "counter",
           "Expert bytes copied from host memory on misses (divide by tokens for bytes per token).",
           {}, experts.bytes_copied);
  w.single("kvvm_expert_cache_copy_seconds_total", "counter",
           "Time steps spent waiting on expert copies.", {}, experts.copy_seconds);
  w.single("kvvm_kv_committed_bytes", "gauge",
           "KV bytes mapped under the arena, every mapping counted.", {}, arena.committed_bytes);
  w.single("kvvm_kv_physical_bytes", "gauge",
           "KV bytes of physical memory mapped, each shared handle counted once.", {},
           arena.physical_bytes);
  w.single("kvvm_kv_reclaimable_bytes", "gauge",
           "KV bytes finished sequences keep mapped for reuse (reclaimed when memory is short), "
           "less the prefix windows they map read-only (a sharer's or the prefix cache's).",
           {}, arena.reclaimable_bytes);
  w.single("kvvm_kv_budget_bytes", "gauge", "The KV tier's byte budget.", {}, inputs.tier.limit);
  w.single("kvvm_kv_unconfirmed_bytes", "gauge",
           "KV bytes kept mapped and charged because a copy into or out of them was queued and "
           "its fence failed (completion unknown); released once a later fence completes.",
           {}, arena.unconfirmed_bytes);
  w.single("kvvm_kv_unconfirmed_copies_total", "counter",
           "Copies (prefix boundary, copy-on-write) whose fence failed after they were queued.", {},
           arena.unconfirmed_copies);
  w.single("kvvm_kv_quarantined_slots", "gauge",
           "Slots never reused because an unmap under them failed (poisoned windows).", {},
           std::uint64_t{arena.quarantined_slots});
  // Not the driver's map count: that also counts the mappings of shared prefixes, copy-on-write
  // and the dummy tail page, which commit nothing new.
  w.single("kvvm_kv_commits_total", "counter",
           "KV commits: arena ensure calls that had to map memory plus the commit-ahead "
           "worker's commits (not driver map calls).",
           {}, arena.ensures_committing + arena.ahead_commits);
  w.single("kvvm_kv_reclaimed_bytes_total", "counter",
           "KV bytes reclaimed from finished sequences by the arena.", {}, arena.reclaimed_bytes);

  // The engine's overload refusals by when: a client refused at once lost nothing, one refused
  // in the queue waited the whole bound first.
  const std::uint64_t full_queue =
      engine.refused_overloaded - engine.refused_predicted_wait - engine.refused_in_queue;
  w.family("kvvm_engine_overloaded_total", "counter",
           "Requests the engine refused as overloaded, by when: at arrival for a full queue "
           "(full_queue) or a predicted wait past the bound (predicted_wait), or after "
           "waiting past it (in_queue).");
  w.sample("kvvm_engine_overloaded_total", {{"when", "full_queue"}}, full_queue);
  w.sample("kvvm_engine_overloaded_total", {{"when", "predicted_wait"}},
           engine.refused_predicted_wait);
  w.sample("kvvm_engine_overloaded_total", {{"when", "in_queue"}}, engine.refused_in_queue);
  w.single("kvvm_queue_wait_margin", "gauge",
           "The factor predicted queue waits are multiplied by before the wait bound: the "
           "largest wait / prediction of the last 32 admissions, 1 to 8.",
           {}, engine.wait_margin);
  w.family("kvvm_requests_refused_total", "counter",
           "Requests refused by the server, by reason (overloaded = the 429s).");
  for (const auto& [reason, count] : refusals) {
    w.sample("kvvm_requests_refused_total", {{"reason", reason}}, count);
  }
  w.family("kvvm_http_responses_total", "counter", "HTTP responses, by endpoint and status.");
  for (const auto& [key, count] : responses) {
    const std::string status = std::to_string(key.second);
    w.sample("kvvm_http_responses_total", {{"endpoint", key.first}, {"status", status}}, count);
  }
  w.family("kvvm_ignored_fields_total", "counter",
           "Request fields kvvm does not know and ignored, by name (at most 64 names; the "
           "rest are \"other\").");
  for (const auto& [field, count] : ignored) {
    w.sample("kvvm_ignored_fields_total", {{"field", field}}, count);
  }
  const grammar::GrammarCacheStats& grammars = inputs.grammar_cache;
  w.single("kvvm_constrained_requests_total", "counter",
           "Requests submitted with a structured-output grammar (each choice of n counted).", {},
           engine.grammar.constrained_requests);
  w.single("kvvm_grammar_compiles_total", "counter",
           "Structured-output constraints compiled to a grammar (cache misses that succeeded).", {},
           grammars.compiled);
  w.single("kvvm_grammar_compile_seconds_total", "counter",
           "Time spent compiling constraints on the HTTP threads, refused ones included, seconds.",
           {}, grammars.compile_seconds);
  w.single("kvvm_grammar_cache_hits_total", "counter",
           "Constraints whose compiled grammar was found in the cache.", {}, grammars.hits);
  w.single("kvvm_grammar_refused_total", "counter",
           "Constraints refused by the compiler (a 400 naming the field).", {}, grammars.refused);
  w.single("kvvm_grammar_cache_entries", "gauge", "Compiled grammars the cache keeps.", {},
           std::uint64_t{grammars.entries});
  w.single("kvvm_grammar_cache_bytes", "gauge",
           "Host bytes of the kept grammars' precomputed token masks.", {}, grammars.bytes);
  w.histogram("kvvm_grammar_mask_seconds",
              "Host time of each constrained draw's token mask, seconds.", {},
              mask_seconds_snapshot(engine.grammar));
  w.single("kvvm_draining", "gauge", "1 while the server drains (refusing new requests).", {},
           std::uint64_t{inputs.draining ? 1u : 0u});
  w.single("kvvm_engine_context_lost", "gauge",
           "1 once the GPU context was lost (a sticky CUDA error): every request ended, new ones "
           "get 503, and the process exits for a supervisor to restart it.",
           {}, std::uint64_t{inputs.engine.context_lost ? 1u : 0u});
  return w.take();
}

}  // namespace kvvm::server
