#include "bench/drivers/engine/engine.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/drivers/engine/engine_choices.h"
#include "bench/drivers/engine/engine_decode.h"
#include "bench/drivers/engine/engine_offline.h"
#include "bench/drivers/engine/engine_trace.h"
#include "kit/byte_size.h"
#include "kit/cli_common.h"
#include "kit/kv_dtype_flag.h"
#include "kit/model_loading.h"
#include "kit/speculative_flag.h"
#include "kit/svg_plot.h"
#include "kit/text_table.h"
#include "kit/value_parsers.h"
#include "kvvm/base/dtype.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/grammar/constraint.h"
#include "kvvm/grammar/grammar_cache.h"
#include "kvvm/kernels/model_kernels.h"
#include "kvvm/model/config.h"
#include "kvvm/model/model.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "kvvm/vmm/cuda_driver.h"
#include "sim/trace.h"

namespace kvvm::cli {
namespace {

constexpr const char* kBenchEngine = "kvvm bench engine";
constexpr std::uint64_t kMaxBatch = 4096;
constexpr double kMaxDurationLimit = 1e7;
constexpr double kMaxQueueWaitSeconds = 86400;

Result<std::unique_ptr<model::Model>> make_model(const BenchEngineOptions& options,
                                                 const model::ModelConfig& config,
                                                 const model::ModelWeights& weights,
                                                 const model::ModelLimits& limits,
                                                 std::ostream* progress) {
  if (options.backend == "cuda" || (options.backend == "auto" && cuda_available())) {
    model::CudaModelOptions cuda_options;
    cuda_options.limits = limits;
    cuda_options.weights = weight_options(options.weights);
    cuda_options.fused = !options.unfused;
    set_overlapped_launches(!options.in_order_launches);
    Result<std::unique_ptr<model::Model>> cuda =
        model::make_cuda_model(config, weights, cuda_options);
    if (cuda.ok() || options.backend == "cuda" ||
        cuda.status().code() == StatusCode::kResourceExhausted) {
      return cuda.ok() ? std::move(cuda) : cuda.status().with_context("--backend cuda");
    }
    if (progress != nullptr) {
      *progress << kBenchEngine << ": note: a GPU is present but the CUDA model could not be made ("
                << cuda.status().to_string() << "); running on the CPU\n";
    }
  }
  model::CpuModelOptions cpu_options;
  cpu_options.limits = limits;
  cpu_options.weights = weight_options(options.weights);
  return model::make_cpu_model(config, weights, cpu_options);
}

// The draft model of --speculative-config's "model", made as the model is (on its backend, with
// dummy weights when the model's are); InvalidArgument naming the flag for a folder that is not
// a checkpoint or another vocabulary.
Result<std::unique_ptr<model::Model>> make_draft(const BenchEngineOptions& options,
                                                 const std::string& dir,
                                                 const model::ModelConfig& target,
                                                 const model::ModelLimits& limits,
                                                 std::ostream* progress) {
  const std::string flag = "--speculative-config \"model\" " + dir;
  const bool dummy = dummy_weights(options.weights);
  KVVM_RETURN_IF_ERROR(check_model_dir(dir, !dummy).with_context(flag));
  Result<model::ModelConfig> config = model::load_model_config(dir);
  if (!config.ok()) return config.status().with_context(flag);
  if (config->vocab_size != target.vocab_size) {
    return Status::InvalidArgument(flag + ": vocab_size " + str(config->vocab_size) +
                                   ", the model's is " + str(target.vocab_size));
  }
  std::unique_ptr<model::WeightFiles> files;
  model::ModelWeights weights;
  if (!dummy) {
    Result<std::unique_ptr<model::WeightFiles>> opened = model::WeightFiles::open_dir(dir);
    if (!opened.ok()) return opened.status().with_context(flag);
    files = std::move(opened).value();
    Result<model::ModelWeights> bound = model::bind_weights(*config, *files);
    if (!bound.ok()) return bound.status().with_context(flag);
    weights = std::move(bound).value();
  }
  Result<std::unique_ptr<model::Model>> made =
      make_model(options, *config, weights, limits, progress);
  if (!made.ok()) return made.status().with_context(flag);
  if (progress != nullptr) {
    *progress << kBenchEngine << ": draft model " << config->architecture << " from " << dir << ": "
              << (*made)->weight_stats().split.describe() << "\n";
  }
  return made;
}

// A preallocated engine running more sequences than the budget holds at max context has
// lost its commitments (the budget reclaimed them): its figures are not the baseline's.
std::string over_capacity(std::uint32_t peak, std::uint64_t capacity) {
  if (peak <= capacity) return {};
  return "peak " + str(peak) + " is above the " + str(capacity) +
         " max-context sequences the budget holds: preallocated KV was reclaimed";
}

std::string join_notes(const std::string& a, const std::string& b) {
  return a.empty() ? b : b.empty() ? a : a + "; " + b;
}

// The parsed and checked options.
struct Plan {
  std::vector<std::uint32_t> batches;
  std::vector<double> rates;
  std::vector<bool> preallocate;  // the trace's systems in order: false arena, true preallocated
  std::uint32_t max_running = 0;
  std::vector<OfflineSpec> offline;
};

Result<Plan> plan_options(const BenchEngineOptions& options) {
  Plan plan;
  if (!options.skip_decode) {
    KVVM_ASSIGN_OR_RETURN(std::vector<std::uint32_t> batches,
                          parse_count_list(options.batches, "--batches", kMaxBatch));
    plan.batches = std::move(batches);
    if (options.decode_tokens < 2) {
      return Status::InvalidArgument(
          "--decode-tokens must be at least 2 (one first token, then "
          "decode steps), got " +
          str(options.decode_tokens));
    }
  }
  if (!options.skip_trace) {
    KVVM_ASSIGN_OR_RETURN(std::vector<double> rates,
                          parse_rate_list(options.rates, "--rates", kMaxRate));
    plan.rates = std::move(rates);
    KVVM_ASSIGN_OR_RETURN(
        std::vector<std::string> systems,
        parse_choice_list(options.trace_systems, "--trace-systems", {"arena", "preallocated"}));
    for (const std::string& system : systems) plan.preallocate.push_back(system == "preallocated");
  }
  plan.max_running = options.max_running != 0 ? options.max_running : kDefaultMaxRunning;
  if (!options.offline.empty()) {
    KVVM_ASSIGN_OR_RETURN(
        plan.offline,
        parse_offline_lengths(options.offline, options.offline_requests, "--offline"));
  }
  if (!options.offline_dataset.empty()) {
    KVVM_ASSIGN_OR_RETURN(OfflineSpec spec, read_offline_dataset(options.offline_dataset));
    plan.offline.push_back(std::move(spec));
  }
  if (options.skip_decode && options.skip_trace && plan.offline.empty() && options.choices == 0) {
    return Status::InvalidArgument(
        "--no-decode and --no-trace leave nothing to run: add --offline or --choices");
  }
  return plan;
}

// The constrained mode's grammar: the schema (or the regex) compiled over the tokenizer's
// vocabulary, with the model's end tokens.
Result<std::shared_ptr<const grammar::CompiledGrammar>> compile_constraint(
    const BenchEngineOptions& options, const model::ModelConfig& config, std::ostream* progress) {
  KVVM_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                        tokenizer::Tokenizer::load(options.constrain_tokenizer));
  if (tok->vocab_size() > config.vocab_size) {
    return Status::InvalidArgument("--constrain-tokenizer: " + str(tok->vocab_size()) +
                                   " tokens, more than the model's " + str(config.vocab_size));
  }
  KVVM_ASSIGN_OR_RETURN(std::shared_ptr<const grammar::Vocabulary> vocabulary,
                        grammar::Vocabulary::from_tokenizer(*tok, config.eos_token_ids));
  grammar::Constraint constraint;
  if (!options.constrain_schema.empty()) {
    std::ifstream in(options.constrain_schema);
    constraint.kind = grammar::Constraint::Kind::kJsonSchema;
    constraint.text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      return Status::NotFound("--constrain-schema: cannot read " + options.constrain_schema);
    }
  } else {
    constraint.kind = grammar::Constraint::Kind::kRegex;
    constraint.text =
        options.constrain_regex.empty() ? "[A-Za-z0-9 ,.;:!?'()-]+" : options.constrain_regex;
  }
  grammar::GrammarCacheOptions one;
  one.entries = 1;
  grammar::GrammarCache cache(vocabulary, one);
  Result<std::shared_ptr<const grammar::CompiledGrammar>> compiled = cache.get(constraint);
  if (!compiled.ok()) {
    return compiled.status().with_context(options.constrain_schema.empty() ? "--constrain-regex"
                                                                           : "--constrain-schema");
  }
  if (progress != nullptr) {
    *progress << kBenchEngine << ": constraint compiled in "
              << format_duration(cache.stats().compile_seconds) << " ("
              << (*compiled)->stats().partial_stacks << " partial stacks)\n"
              << std::flush;
  }
  return compiled;
}

}  // namespace

CLI::App* add_bench_engine_command(CLI::App& bench, BenchEngineOptions& options) {
  CLI::App* cmd = bench.add_subcommand(
      "engine",
      "Measure the batched engine on a Hugging Face checkpoint: (a) decode tokens/s and ms per "
      "step at each --batches size (random prompts submitted together, greedy, end tokens "
      "ignored, timed after every sequence has its first token) for kvvm with CUDA graphs, "
      "without them, and with preallocated KV (max context per sequence, same engine and "
      "kernels); (b) an open-loop replay of `kvvm simulate`'s generated trace (ShareGPT-like "
      "lengths, tenants with system prompts) at each --rates value through the arena engine "
      "and the preallocated one at the same KV budget: output tokens/s, time to first token "
      "and per output token (p50, p99), peak concurrency, prefix-cache hits, refusals, "
      "preemptions; (c) with --choices N, one prompt answered N times as one request of N "
      "choices (forked KV) and as N requests at once (prefix cache on): peak KV bytes and "
      "time to the last token. --logprobs K adds a decode mode reporting K alternatives per "
      "token.");
  cmd->add_option("--model", options.model_dir,
                  "Checkpoint directory: config.json and model.safetensors (or "
                  "model.safetensors.index.json and its shards); prompts are random token ids, "
                  "so no tokenizer is needed")
      ->required();
  cmd->add_option("--backend", options.backend,
                  "auto, cpu or cuda (default auto: cuda when a GPU is usable, else cpu; graphs "
                  "are skipped on the cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--max-context", options.max_context,
                  "Tokens per sequence: the slot size, and what the preallocated engine commits "
                  "per sequence (default: the config's max_position_embeddings, at most 8192)")
      ->transform(count_validator(2, kMaxTokens));
  cmd->add_option("--max-running", options.max_running,
                  "Sequences in one step for the trace replay (default 64); the decode runs use "
                  "their batch size")
      ->transform(count_validator(1, kMaxBatch));
  cmd->add_option("--kv-budget", options.kv_budget,
                  "KV memory budget of every engine, e.g. 40GiB (default: the KV space's, 9/10 "
                  "of the GPU's free memory once the model is loaded, on the host 1 GiB; "
                  "resolved once, so every engine gets the same)")
      ->transform(byte_size_validator(kMaxBudgetBytes, "the most a budget may be"));
  add_weight_flags(*cmd, options.weights);
  add_kv_dtype_flag(*cmd, options.kv_dtype);
  cmd->add_flag("--unfused-kernels", options.unfused,
                "CUDA: one kernel per op and cuBLAS for every projection, without the fused "
                "q|k|v projection, RoPE-in-append, small-batch GEMV and multi-block argmax "
                "(the baseline they are measured against)");
  cmd->add_flag("--in-order-launches", options.in_order_launches,
                "CUDA: launch every kernel in plain stream order instead of overlapping the "
                "kernel before it (programmatic dependent launch; the baseline the overlap is "
                "measured against)");
  add_kv_scales_flag(*cmd, options.kv_scales);
  cmd->add_option("--batches", options.batches,
                  "Decode batch sizes, comma-separated (default 1,32)");
  cmd->add_option("--prompt-tokens", options.prompt_tokens,
                  "Prompt length of the decode runs (default 128)")
      ->transform(count_validator(1, kMaxTokens));
  cmd->add_option("--decode-tokens", options.decode_tokens,
                  "Tokens each decode-run sequence generates, at least 2 (default 128)")
      ->transform(count_validator(1, kMaxTokens));
  cmd->add_option("--rates", options.rates,
                  "Trace replay arrival rates, requests per second, comma-separated (default "
                  "1,2,4,8)");
  cmd->add_option("--trace-systems", options.trace_systems,
                  "Trace replay engines, comma-separated, in this order: arena (the KV in "
                  "virtual memory) and preallocated (max context per sequence) (default "
                  "arena,preallocated; one alone halves the replay's time)");
  cmd->add_option("--requests", options.requests, "Requests of each rate's trace (default 100)")
      ->transform(count_validator(1, kMaxRequests));
  cmd->add_option("--duration-limit", options.duration_limit_s,
                  "Seconds one replay may take: later arrivals are not submitted and requests "
                  "still running at the limit are cancelled (default 0: none)")
      ->transform(number_validator(0, kMaxDurationLimit));
  cmd->add_option("--max-queue-wait", options.max_queue_wait_s,
                  "Trace replay: seconds a request may wait to start before it is refused "
                  "(429), and the bound its predicted wait is refused at arrival against; 0: no "
                  "limit (default 30, as kvvm serve)")
      ->transform(number_validator(0, kMaxQueueWaitSeconds));
  cmd->add_option("--parked-slots", options.parked_slots,
                  "Trace replay: the arena engine's KV slots beyond --max-running where ended "
                  "requests stay mapped, so the next request of the same system prompt finds it "
                  "mapped (as kvvm serve; default: as many as --max-running; 0: none)")
      ->transform(count_validator(0, kMaxBatch));
  cmd->add_flag("--no-early-refusal", options.no_early_refusal,
                "Trace replay: refuse a request only after it waited --max-queue-wait, not at "
                "once when its predicted wait exceeds it");
  cmd->add_flag("--no-wait-forecast", options.no_wait_forecast,
                "Trace replay: predict a request's wait at arrival from the measured admission "
                "rate alone, without the forecast played out from the work the running answers "
                "and the queue have left (the baseline of that forecast)");
  cmd->add_option("--max-prefill-tokens-while-decoding", options.max_prefill_tokens_while_decoding,
                  "Trace replay: prefill tokens of a step that also decodes, at most, at most the "
                  "model's step token budget; bounds the time per output token under new "
                  "prompts (default 0: no bound but the step's)")
      ->transform(count_validator(0, kMaxTokens));
  cmd->add_option("--tpot-target-ms", options.tpot_target_ms,
                  "Trace replay: time per output token, in milliseconds, the engines keep "
                  "decoding steps within by computing only the prompt tokens it leaves (each "
                  "step's time fitted as a fixed part plus a part per token; at least 16) "
                  "(default 0: no target)")
      ->transform(number_validator(0, kMaxTpotTargetMs));
  cmd->add_option("--ttft-target-ms", options.ttft_target_ms,
                  "Trace replay: time to first token, in milliseconds, the engines aim for by "
                  "letting a decoding step compute more prompt tokens than --tpot-target-ms "
                  "leaves when waiting prompts would otherwise miss it; needs --tpot-target-ms "
                  "(default 0: no target)")
      ->transform(number_validator(0, kMaxTpotTargetMs));
  cmd->add_option("--tenants", options.tenants,
                  "Tenants of the trace; each request starts with its tenant's system prompt, "
                  "shared through the prefix cache (default 4; 0: none)")
      ->transform(count_validator(0, kMaxPrefixGroups));
  cmd->add_option("--system-prompt-tokens", options.system_prompt_tokens,
                  "Tokens of each tenant's system prompt (default 512)")
      ->transform(count_validator(1, kMaxTokens));
  cmd->add_option("--seed", options.seed, "Seed of the trace and of the random prompts (default 1)")
      ->transform(count_validator(0, std::numeric_limits<std::uint64_t>::max()));
  cmd->add_option("--logprobs", options.logprobs,
                  "Add a decode mode whose requests report this many log-probability "
                  "alternatives per token (with the graphs where there are any), to compare with "
                  "the graphs mode (default 0: not run)")
      ->transform(count_validator(0, model::kMaxTopLogprobs));
  cmd->add_option("--constrain-tokenizer", options.constrain_tokenizer,
                  "Add a decode mode (with the graphs where there are any) whose requests are held "
                  "to a grammar over this tokenizer.json's vocabulary (at most the model's): "
                  "--constrain-schema FILE, or --constrain-regex R (default: letters, digits, "
                  "spaces and punctuation, which never ends, so every request runs its tokens)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--constrain-schema", options.constrain_schema,
                  "The constrained mode's JSON Schema (a file); answers that complete the schema "
                  "end early, and the report counts the tokens generated")
      ->check(CLI::ExistingFile);
  cmd->add_option("--constrain-regex", options.constrain_regex,
                  "The constrained mode's regular expression (matched whole)");
  cmd->add_option("--choices", options.choices,
                  "(c) Answer one random prompt this many times, as one request of n choices "
                  "(one prefill, the KV forked) and as n requests at once with the prefix "
                  "cache: peak KV bytes and time to the last token (default 0: not run)")
      ->transform(count_validator(0, kMaxBatch));
  cmd->add_option("--choices-prompt-tokens", options.choices_prompt_tokens,
                  "Prompt length of the choices part (default 2048)")
      ->transform(count_validator(1, kMaxTokens));
  cmd->add_option("--choices-tokens", options.choices_tokens,
                  "Tokens each answer of the choices part generates (default 256)")
      ->transform(count_validator(1, kMaxTokens));
  cmd->add_option("--offline", options.offline,
                  "(d) Offline throughput as `trtllm-bench throughput` measures it: for each "
                  "INPUT/OUTPUT pair (comma-separated, e.g. 128/128,1000/1000), "
                  "--offline-requests random prompts of INPUT tokens submitted at once, each "
                  "answered with exactly OUTPUT tokens; output and total tokens/s, requests/s, "
                  "latency, TTFT and TPOT per request over the whole run (default: not run)");
  cmd->add_option("--offline-dataset", options.offline_dataset,
                  "(d) One offline run of a dataset file's requests: a line each, its input and "
                  "output token counts (\"128 256\", \"128,256\" or \"128/256\"; '#' "
                  "starts a comment)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--offline-requests", options.offline_requests,
                  "Requests of each --offline pair (default 1000)")
      ->transform(count_validator(1, kMaxRequests));
  cmd->add_option("--offline-max-running", options.offline_max_running,
                  "Sequences the offline engine runs at once (default: as many as the KV budget "
                  "holds at the run's longest request, at most 2048)")
      ->transform(count_validator(1, kMaxBatch));
  cmd->add_option("--offline-warmup", options.offline_warmup,
                  "Requests of the first lengths (answers cut to 16 tokens) run through the "
                  "offline engine first and left out of its figures (default 8)")
      ->transform(count_validator(0, kMaxBatch));
  add_speculative_flag(*cmd, options.speculative_config);
  cmd->add_flag("--no-decode", options.skip_decode, "Skip the decode part (a)");
  cmd->add_flag("--no-trace", options.skip_trace, "Skip the trace replay (b)");
  cmd->add_flag("--json", options.json, "Machine-readable report (JSON, ordered keys) on stdout");
  cmd->add_option("--plot", options.plot,
                  "Write an SVG line chart of output tokens/s against request rate, arena vs "
                  "preallocated, to this file");
  cmd->footer("Progress lines go to stderr. Exit status: 0 ok, 1 a run failed, 2 bad usage.");
  return cmd;
}

Result<BenchEngineReport> make_bench_engine(const BenchEngineOptions& options,
                                            std::ostream* progress) {
  const auto started = std::chrono::steady_clock::now();
  KVVM_ASSIGN_OR_RETURN(Plan plan, plan_options(options));
  std::error_code ec;
  if (!std::filesystem::is_directory(options.model_dir, ec)) {
    return Status::InvalidArgument("--model " + options.model_dir + ": no such directory");
  }
  Result<model::ModelConfig> config = model::load_model_config(options.model_dir);
  if (!config.ok()) return config.status().with_context("--model " + options.model_dir);

  BenchEngineReport report;
  report.model_dir = options.model_dir;
  report.architecture = config->architecture;
  report.layers = config->layers;
  report.vocab_size = config->vocab_size;
  report.max_context =
      options.max_context != 0
          ? options.max_context
          : std::min<std::uint64_t>(config->max_position_embeddings, kDefaultBenchContext);
  if (report.max_context > config->max_position_embeddings) {
    return Status::InvalidArgument("--max-context " + str(report.max_context) +
                                   " is beyond the config's max_position_embeddings " +
                                   str(config->max_position_embeddings));
  }
  if (!options.skip_decode && options.prompt_tokens + options.decode_tokens > report.max_context) {
    return Status::InvalidArgument(
        "--prompt-tokens " + str(options.prompt_tokens) + " + --decode-tokens " +
        str(options.decode_tokens) + " = " + str(options.prompt_tokens + options.decode_tokens) +
        " tokens do not fit in --max-context " + str(report.max_context));
  }
  for (const OfflineSpec& spec : plan.offline) {
    for (std::size_t i = 0; i < spec.lengths.size(); ++i) {
      const std::uint64_t tokens = std::uint64_t{spec.lengths[i].first} + spec.lengths[i].second;
      if (tokens > report.max_context) {
        return Status::InvalidArgument(
            "offline " + spec.label + ": request " + str(i) + " of " + str(tokens) +
            " tokens (input and output) does not fit in --max-context " + str(report.max_context));
      }
    }
  }
  if (options.choices == 1) {
    return Status::InvalidArgument("--choices 1: the choices part compares n > 1 answers");
  }
  if (options.choices > 1 &&
      options.choices_prompt_tokens + options.choices_tokens > report.max_context) {
    return Status::InvalidArgument("--choices-prompt-tokens " + str(options.choices_prompt_tokens) +
                                   " + --choices-tokens " + str(options.choices_tokens) +
                                   " do not fit in --max-context " + str(report.max_context));
  }
  report.max_running = plan.max_running;
  report.logprobs = options.logprobs;
  report.prompt_tokens = options.prompt_tokens;
  report.decode_tokens = options.decode_tokens;
  report.trace_requests = options.requests;
  report.tenants = options.tenants;
  report.system_prompt_tokens = options.system_prompt_tokens;
  report.seed = options.seed;
  report.duration_limit_s = options.duration_limit_s;
  report.max_queue_wait_s = options.max_queue_wait_s;
  report.parked_slots = options.parked_slots.value_or(plan.max_running);

  // The traces first: a generator option that makes no sense is refused before the model loads.
  std::vector<Trace> traces;
  for (double rate : plan.rates) {
    TraceGeneratorOptions generator;
    generator.requests = options.requests;
    generator.rate = rate;
    generator.tenants = options.tenants;
    generator.system_prompt_tokens = options.system_prompt_tokens;
    generator.max_context = report.max_context;
    generator.seed = options.seed;
    Result<Trace> trace = generate_trace(generator);
    if (!trace.ok()) {
      return trace.status().with_context("the trace (--system-prompt-tokens " +
                                         str(options.system_prompt_tokens) + ", --max-context " +
                                         str(report.max_context) + ")");
    }
    synthesize_ids(*trace);
    traces.push_back(std::move(trace).value());
  }

  // Each step holds every running sequence: the model's activations are sized for the most.
  model::ModelLimits limits;
  std::uint32_t chunks = plan.max_running;
  for (std::uint32_t batch : plan.batches) chunks = std::max(chunks, batch);
  chunks = std::max(chunks, options.choices);
  if (!plan.offline.empty()) {
    chunks = std::max(chunks, options.offline_max_running != 0 ? options.offline_max_running
                                                               : kDefaultOfflineChunks);
  }
  limits.max_chunks = std::max(limits.max_chunks, chunks);
  limits.max_step_tokens = std::max(limits.max_step_tokens, limits.max_chunks);
  if (options.max_prefill_tokens_while_decoding > limits.max_step_tokens) {
    return Status::InvalidArgument(
        "--max-prefill-tokens-while-decoding " + str(options.max_prefill_tokens_while_decoding) +
        ": exceeds the step token budget of " + str(limits.max_step_tokens));
  }
  {
    std::unique_ptr<model::WeightFiles> files;
    model::ModelWeights weights;
    report.dummy_weights = dummy_weights(options.weights);
    if (!report.dummy_weights) {
      Result<std::unique_ptr<model::WeightFiles>> opened =
          model::WeightFiles::open_dir(options.model_dir);
      if (!opened.ok()) return opened.status().with_context("--model " + options.model_dir);
      files = std::move(opened).value();
      Result<model::ModelWeights> bound = model::bind_weights(*config, *files);
      if (!bound.ok()) return bound.status().with_context("--model " + options.model_dir);
      weights = std::move(bound).value();
    }
    KVVM_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> made,
                          make_model(options, *config, weights, limits, progress));
    files.reset();  // the model holds its own copy
    report.backend = std::string(model::to_string(made->backend()));
    if (made->backend() == model::Backend::kCuda)
      report.kernels = std::string(options.unfused ? "unfused" : "fused") +
                       (options.in_order_launches ? ", in-order launches" : "");
    std::unique_ptr<model::Model> model = std::move(made);
    const model::WeightStats placed = model->weight_stats();
    report.weights = placed.split.describe();
    report.weights_device_bytes = placed.physical_bytes;
    report.weights_streamed_bytes_per_step = placed.split.streamed_bytes_per_step;
    report.weights_streamed_layers = placed.split.streamed_layers;
    report.weights_ring_slots = placed.split.ring_slots;
    report.load_bytes = placed.load_bytes;
    report.load_seconds = placed.load_seconds;
    if (progress != nullptr) {
      *progress << kBenchEngine << ": " << report.weights << "; loaded in "
                << format_duration(report.load_seconds) << "\n"
                << std::flush;
    }

    KVVM_RETURN_IF_ERROR(check_kv_dtype(options.kv_dtype, *model, *config));
    engine::KvSpaceOptions kv;
    kv.backend = model->backend();
    kv.kv_dtype = options.kv_dtype;
    kv.max_context = report.max_context;
    kv.budget_bytes = options.kv_budget;
    {
      // The budget and KV element type the space resolves, fixed once so every engine gets the
      // same (a GPU's free memory, the default, moves as the runs allocate).
      kv.max_slots = 1;
      Result<std::unique_ptr<engine::KvSpace>> probe = engine::KvSpace::create(*config, kv);
      if (!probe.ok()) return probe.status().with_context("KV space");
      kv = (*probe)->options();
      report.kv_budget = kv.budget_bytes;
      report.kv_bytes_per_token = config->kv_geometry(kv.kv_dtype).bytes_per_token();
      report.kv_dtype = std::string(to_string(kv.kv_dtype));
      KVVM_RETURN_IF_ERROR(apply_kv_scales(options.kv_scales, kv.kv_dtype, *model));
      if (progress != nullptr) print_kv_scales(kv.kv_dtype, *model, kBenchEngine, *progress);
      const std::uint64_t per_sequence = report.kv_bytes_per_token * report.max_context;
      report.preallocated_capacity = per_sequence == 0 ? 0 : report.kv_budget / per_sequence;
    }
    std::vector<DecodeMode> modes = {DecodeMode::kGraphs, DecodeMode::kEager,
                                     DecodeMode::kPreallocated};
    if (options.logprobs > 0) modes.insert(modes.begin() + 1, DecodeMode::kLogprobs);
    std::shared_ptr<const grammar::CompiledGrammar> grammar;
    if (!options.constrain_tokenizer.empty()) {
      KVVM_ASSIGN_OR_RETURN(grammar, compile_constraint(options, model->config(), progress));
      modes.insert(modes.begin() + 1, DecodeMode::kConstrained);
    }
    for (std::uint32_t batch : plan.batches) {
      for (DecodeMode mode : modes) {
        if (progress != nullptr) {
          *progress << kBenchEngine << ": decode, batch " << batch << ", " << to_string(mode)
                    << "\n"
                    << std::flush;
        }
        DecodeParams params{batch,        options.prompt_tokens, options.decode_tokens,
                            options.seed, options.logprobs,      grammar};
        Result<DecodeRun> run = measure_decode(*model, kv, mode, params);
        if (!run.ok()) {
          return run.status().with_context(std::string("decode, batch ") + str(batch) + ", " +
                                           to_string(mode));
        }
        if (mode == DecodeMode::kPreallocated) {
          run->note =
              join_notes(run->note, over_capacity(run->peak_running, report.preallocated_capacity));
        }
        report.decode.push_back(std::move(run).value());
      }
    }
    if (options.choices > 1) {
      if (progress != nullptr) {
        *progress << kBenchEngine << ": choices, n " << options.choices << "\n" << std::flush;
      }
      report.choices_prompt_tokens = options.choices_prompt_tokens;
      report.choices_tokens = options.choices_tokens;
      Result<std::vector<ChoicesRun>> runs =
          measure_choices(*model, kv,
                          ChoicesParams{.n = options.choices,
                                        .prompt_tokens = options.choices_prompt_tokens,
                                        .max_tokens = options.choices_tokens,
                                        .seed = options.seed});
      if (!runs.ok()) return runs.status().with_context("choices");
      report.choices = std::move(runs).value();
    }
    engine::SpeculativeOptions speculative;
    std::unique_ptr<model::Model> draft;
    if (!options.speculative_config.empty() && !plan.offline.empty()) {
      KVVM_ASSIGN_OR_RETURN(speculative,
                            engine::parse_speculative_config(options.speculative_config));
      if (speculative.method == engine::SpeculativeMethod::kDraftModel) {
        KVVM_ASSIGN_OR_RETURN(
            draft, make_draft(options, speculative.draft_model, *config, limits, progress));
      }
    }
    for (const OfflineSpec& spec : plan.offline) {
      if (progress != nullptr) {
        *progress << kBenchEngine << ": offline " << spec.label << " (" << spec.lengths.size()
                  << " requests)\n"
                  << std::flush;
      }
      Result<OfflineRun> run =
          measure_offline(*model, kv, spec,
                          OfflineParams{.max_running = options.offline_max_running,
                                        .max_chunks = limits.max_chunks,
                                        .warmup = options.offline_warmup,
                                        .seed = options.seed,
                                        .graphs = true,
                                        .speculative = speculative,
                                        .draft = draft.get()});
      if (!run.ok()) return run.status().with_context("offline " + spec.label);
      report.offline.push_back(std::move(run).value());
    }
    for (std::size_t r = 0; r < plan.rates.size(); ++r) {
      for (const bool preallocate : plan.preallocate) {
        if (progress != nullptr) {
          *progress << kBenchEngine << ": trace at " << fixed(plan.rates[r], 2) << " req/s, "
                    << (preallocate ? "preallocated" : "arena") << " (" << traces[r].requests.size()
                    << " requests)\n"
                    << std::flush;
        }
        ReplayParams params{
            .preallocate = preallocate,
            .max_running = plan.max_running,
            .duration_limit_s = options.duration_limit_s,
            .refuse_predicted_wait = !options.no_early_refusal,
            .wait_forecast = !options.no_wait_forecast,
            .max_queue_wait = seconds_to_millis(options.max_queue_wait_s),
            .parked_slots = preallocate ? 0 : report.parked_slots,
            .max_prefill_tokens_while_decoding = options.max_prefill_tokens_while_decoding,
            .tpot_target = tpot_target(options.tpot_target_ms),
            .ttft_target = tpot_target(options.ttft_target_ms),
            .progress = progress};
        Result<TraceRun> run = replay_trace(*model, kv, traces[r], plan.rates[r], params);
        if (!run.ok()) {
          return run.status().with_context("trace at " + fixed(plan.rates[r], 2) + " req/s (" +
                                           (preallocate ? "preallocated" : "arena") + ")");
        }
        if (preallocate) {
          run->note = over_capacity(run->peak_running, report.preallocated_capacity);
        }
        report.trace.push_back(std::move(run).value());
      }
    }
  }
  report.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

int run_bench_engine(const BenchEngineOptions& options, std::ostream& out, std::ostream& err) {
  const auto fail = [&err](const Status& status, int code) {
    err << kBenchEngine << ": " << status.to_string() << "\n";
    return code;
  };
  if (!options.plot.empty() && options.skip_trace) {
    return fail(Status::InvalidArgument("--plot " + options.plot +
                                        " draws the trace replay, which --no-trace skips"),
                kExitUsage);
  }
  Result<BenchEngineReport> report = make_bench_engine(options, &err);
  if (!report.ok()) {
    const StatusCode code = report.status().code();
    const bool usage = code == StatusCode::kInvalidArgument || code == StatusCode::kUnavailable ||
                       code == StatusCode::kNotFound;
    return fail(report.status(), usage ? kExitUsage : kExitFailure);
  }
  if (options.json) {
    out << dump_json(bench_engine_json(*report)) << "\n";
  } else {
    print_bench_engine(*report, out);
  }
  if (!options.plot.empty()) {
    Status written = write_file(options.plot, "--plot",
                                [&report](std::ostream& svg) { svg << bench_engine_svg(*report); });
    if (!written.ok()) {
      return fail(written,
                  written.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure);
    }
  }
  return kExitOk;
}

}  // namespace kvvm::cli
