#include "bench/drivers/engine/engine_decode.h"

#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kvvm/engine/engine.h"

namespace kvvm::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::vector<std::int32_t> random_prompt(std::mt19937_64& rng, std::uint64_t tokens,
                                        std::uint32_t vocab) {
  std::vector<std::int32_t> ids(tokens);
  for (std::int32_t& id : ids) id = static_cast<std::int32_t>(rng() % vocab);
  return ids;
}

// What one batch through the engine gave.
struct BatchTimes {
  std::uint64_t generated = 0;
  std::uint64_t decode_tokens = 0;
  std::uint64_t decode_steps = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  // The decode window's steps that ended one or more sequences (the rest ended none).
  std::uint64_t retiring_steps = 0;
  double retiring_seconds = 0;
  bool all_first = false;
};

// Counters the callbacks write; they run on this thread, inside step().
struct BatchProgress {
  std::uint64_t tokens = 0;
  std::uint32_t started = 0;  // sequences with their first token
  std::uint32_t ended = 0;    // sequences finished, however
  std::uint32_t failed = 0;
  Status first_error;
};

Result<BatchTimes> run_batch(engine::Engine& engine, std::uint32_t batch,
                             std::uint64_t prompt_tokens, std::uint64_t max_tokens,
                             std::mt19937_64& rng, std::uint32_t vocab,
                             std::optional<std::uint32_t> logprobs,
                             const std::shared_ptr<const grammar::CompiledGrammar>& grammar) {
  BatchProgress progress;
  const Clock::time_point start = Clock::now();
  for (std::uint32_t i = 0; i < batch; ++i) {
    engine::EngineRequest request;
    request.prompt = random_prompt(rng, prompt_tokens, vocab);
    request.max_tokens = static_cast<std::uint32_t>(max_tokens);
    request.use_model_eos = false;  // exactly max_tokens tokens
    request.logprobs = logprobs;
    request.grammar = grammar;
    auto seen = std::make_shared<bool>(false);
    Result<engine::RequestId> id =
        engine.submit(std::move(request), [&progress, seen](const engine::RequestEvent& event) {
          progress.tokens += event.tokens.size();
          if (!*seen && !event.tokens.empty()) {
            *seen = true;
            ++progress.started;
          }
          if (event.finished) ++progress.ended;
          if (event.finished && event.end == engine::RequestEnd::kError) {
            if (progress.failed++ == 0) progress.first_error = event.error;
          }
        });
    if (!id.ok()) return id.status().with_context("submitting request " + std::to_string(i));
  }
  BatchTimes times;
  Clock::time_point window_start = start;
  std::uint64_t tokens_at_start = 0, steps = 0, steps_at_start = 0;
  Clock::time_point last = start;
  for (;;) {
    const std::uint64_t tokens_before = progress.tokens;
    const std::uint32_t ended_before = progress.ended;
    const Clock::time_point step_start = Clock::now();
    Result<bool> more = engine.step();
    if (!more.ok()) return more.status().with_context("engine step");
    // Only steps that produced tokens count: a last step that only retires sequences (or a
    // prefill chunk that ends no prompt) is no decode step.
    if (progress.tokens > tokens_before) {
      ++steps;
      last = Clock::now();
      if (times.all_first && progress.ended > ended_before) {
        ++times.retiring_steps;
        times.retiring_seconds += seconds(last - step_start);
      }
    }
    if (!times.all_first && progress.started == batch) {
      times.all_first = true;
      window_start = last;
      tokens_at_start = progress.tokens;
      steps_at_start = steps;
    }
    if (!*more) break;
  }
  if (progress.failed > 0) {
    return progress.first_error.with_context(std::to_string(progress.failed) + " of " +
                                             std::to_string(batch) + " requests failed");
  }
  times.generated = progress.tokens;
  if (times.all_first) {
    times.prefill_seconds = seconds(window_start - start);
    times.decode_seconds = seconds(last - window_start);
    times.decode_tokens = progress.tokens - tokens_at_start;
    times.decode_steps = steps - steps_at_start;
  }
  return times;
}

}  // namespace

const char* to_string(DecodeMode mode) {
  switch (mode) {
    case DecodeMode::kGraphs:
      return "graphs";
    case DecodeMode::kEager:
      return "eager";
    case DecodeMode::kPreallocated:
      return "preallocated";
    case DecodeMode::kLogprobs:
      return "logprobs";
    case DecodeMode::kConstrained:
      return "constrained";
  }
  return "?";
}

Result<DecodeRun> measure_decode(model::Model& model, const engine::KvSpaceOptions& kv,
                                 DecodeMode mode, const DecodeParams& params) {
  DecodeRun run;
  run.mode = to_string(mode);
  run.batch = params.batch;
  if (mode == DecodeMode::kGraphs && model.backend() != model::Backend::kCuda) {
    run.skipped = "CUDA graphs need the CUDA backend; this run is on the " +
                  std::string(model::to_string(model.backend()));
    return run;
  }
  engine::KvSpaceOptions kv_options = kv;
  kv_options.sequences = params.batch;  // the space adds the graphs' padding slot
  Result<std::unique_ptr<engine::KvSpace>> space =
      engine::KvSpace::create(model.config(), kv_options);
  if (!space.ok()) return space.status().with_context("KV space");
  engine::EngineOptions options;
  options.max_running = params.batch;
  options.max_queue = std::max<std::uint32_t>(options.max_queue, params.batch);
  options.graphs = mode == DecodeMode::kGraphs || mode == DecodeMode::kLogprobs ||
                   mode == DecodeMode::kConstrained;
  options.preallocate = mode == DecodeMode::kPreallocated;
  Result<std::unique_ptr<engine::Engine>> made = engine::Engine::create(model, **space, options);
  if (!made.ok()) return made.status().with_context(std::string("engine (") + run.mode + ")");
  engine::Engine& engine = **made;
  std::optional<std::uint32_t> logprobs;
  if (mode == DecodeMode::kLogprobs) {
    logprobs = params.logprobs;
    run.mode += " " + std::to_string(params.logprobs);
  }
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  if (mode == DecodeMode::kConstrained) {
    if (!params.grammar) return Status::InvalidArgument("the constrained mode needs a grammar");
    grammar = params.grammar;
  }
  if (options.graphs && model.backend() == model::Backend::kCuda &&
      engine.stats().graphs.graphs == 0) {
    run.note = "no decode graph was captured: the steps ran eagerly";
  }

  const std::uint32_t vocab = model.config().vocab_size;
  std::mt19937_64 rng(params.seed);
  Result<BatchTimes> warm =
      run_batch(engine, params.batch, params.prompt_tokens, 2, rng, vocab, logprobs, grammar);
  if (!warm.ok()) return warm.status().with_context("warm-up");
  const engine::EngineStats before = engine.stats();
  const model::ExpertCacheStats experts_before = model.weight_stats().experts;
  KVVM_ASSIGN_OR_RETURN(BatchTimes times,
                        run_batch(engine, params.batch, params.prompt_tokens, params.decode_tokens,
                                  rng, vocab, logprobs, grammar));
  const engine::EngineStats after = engine.stats();
  const model::ExpertCacheStats experts_after = model.weight_stats().experts;
  if (experts_after.slots > 0) {
    // The timed run's share of the cache's counts.
    model::ExpertCacheStats run_share = experts_after;
    run_share.lookups -= experts_before.lookups;
    run_share.hits -= experts_before.hits;
    run_share.misses -= experts_before.misses;
    run_share.bytes_copied -= experts_before.bytes_copied;
    run_share.copy_seconds -= experts_before.copy_seconds;
    const std::uint64_t processed =
        std::uint64_t{params.batch} * params.prompt_tokens + times.generated;
    run.expert_cache = true;
    run.expert_lookups = run_share.lookups;
    run.expert_hits = run_share.hits;
    run.expert_bytes_per_token = processed == 0 ? 0
                                                : static_cast<double>(run_share.bytes_copied) /
                                                      static_cast<double>(processed);
    run.expert_copy_seconds = run_share.copy_seconds;
    // Before the others: the mode's own notes follow.
    run.note = run_share.describe(processed) + (run.note.empty() ? "" : "; " + run.note);
  }

  run.generated_tokens = times.generated;
  run.decode_tokens = times.decode_tokens;
  run.decode_steps = times.decode_steps;
  run.prefill_seconds = times.prefill_seconds;
  run.decode_seconds = times.decode_seconds;
  if (times.decode_seconds > 0) {
    run.decode_tokens_per_s = static_cast<double>(times.decode_tokens) / times.decode_seconds;
  }
  if (times.decode_steps > 0) {
    run.ms_per_step = times.decode_seconds * 1000 / static_cast<double>(times.decode_steps);
  }
  run.retiring_steps = times.retiring_steps;
  run.retiring_ms = times.retiring_seconds * 1000;
  // The window is its steps (and the loop between them): what the ending steps did not take,
  // the others did.
  if (times.decode_steps > times.retiring_steps) {
    run.ms_per_running_step = (times.decode_seconds - times.retiring_seconds) * 1000 /
                              static_cast<double>(times.decode_steps - times.retiring_steps);
  }
  run.peak_running = after.peak_running;
  run.graph_replays = after.graphs.replays - before.graphs.replays;
  run.eager_steps = after.graphs.eager_steps - before.graphs.eager_steps;
  run.masks = after.grammar.masks - before.grammar.masks;
  if (run.masks > 0) {
    run.mask_us = (after.grammar.mask_seconds - before.grammar.mask_seconds) * 1e6 /
                  static_cast<double>(run.masks);
  }
  if (after.peak_running < params.batch) {
    if (!run.note.empty()) run.note += "; ";
    // A request is admitted only with room in its step, so prompts start at the step's token
    // budget: with few decode tokens the first answers end before the last prompt starts.
    run.note += "at most " + std::to_string(after.peak_running) + " of " +
                std::to_string(params.batch) +
                " sequences ran at once (the KV budget, or the first ended before the last "
                "started: prompts start at the step's token budget; more --decode-tokens)";
  }
  return run;
}

}  // namespace kvvm::cli
