#include "bench/drivers/engine/engine_choices.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvvm/engine/engine.h"

namespace kvvm::cli {
namespace {

using Clock = std::chrono::steady_clock;

// KV bytes a running sequence holds: what finished slots keep mapped for reuse is not use.
std::uint64_t in_use(const ArenaStats& arena) {
  return arena.physical_bytes - std::min(arena.physical_bytes, arena.reclaimable_bytes);
}

// Steps until idle; returns the peak KV bytes in use seen after any step.
Result<std::uint64_t> run_to_idle(engine::Engine& engine, std::uint64_t* steps) {
  std::uint64_t peak = in_use(engine.stats().arena);
  for (;;) {
    Result<bool> more = engine.step();
    if (!more.ok()) return more.status().with_context("engine step");
    ++*steps;
    peak = std::max(peak, in_use(engine.stats().arena));
    if (!*more) return peak;
  }
}

Result<ChoicesRun> run_system(model::Model& model, const engine::KvSpaceOptions& kv,
                              const ChoicesParams& params, bool fork,
                              const std::vector<std::int32_t>& prompt,
                              const std::vector<std::int32_t>& warm_prompt) {
  ChoicesRun run;
  run.system = fork ? "fork" : "requests";
  run.n = params.n;
  engine::KvSpaceOptions kv_options = kv;
  kv_options.sequences = params.n;
  Result<std::unique_ptr<engine::KvSpace>> space =
      engine::KvSpace::create(model.config(), kv_options);
  if (!space.ok()) return space.status().with_context("KV space");
  engine::EngineOptions options;
  options.max_running = params.n;
  options.prefix_cache = true;
  Result<std::unique_ptr<engine::Engine>> made = engine::Engine::create(model, **space, options);
  if (!made.ok()) return made.status().with_context("engine (" + run.system + ")");
  engine::Engine& engine = **made;

  std::uint64_t failed = 0;
  Status first_error;
  std::uint64_t tokens = 0;
  Clock::time_point last_token{};
  const auto callback = [&](const engine::RequestEvent& event) {
    if (!event.tokens.empty()) {
      tokens += event.tokens.size();
      last_token = Clock::now();
    }
    if (event.finished && event.end == engine::RequestEnd::kError && failed++ == 0) {
      first_error = event.error;
    }
  };
  engine::EngineRequest request;
  request.max_tokens = static_cast<std::uint32_t>(params.max_tokens);
  request.use_model_eos = false;  // exactly max_tokens tokens each
  // First use (cuBLAS handles, lazy kernel loads) outside the clock, on another prompt.
  request.prompt = warm_prompt;
  request.n = fork ? params.n : 1;
  request.max_tokens = 2;
  if (Result<engine::RequestId> id = engine.submit(request, callback); !id.ok()) {
    return id.status().with_context("warm-up");
  }
  std::uint64_t steps = 0;
  if (Result<std::uint64_t> warm = run_to_idle(engine, &steps); !warm.ok()) return warm.status();
  tokens = 0;
  steps = 0;
  const engine::EngineStats before = engine.stats();

  request.prompt = prompt;
  request.max_tokens = static_cast<std::uint32_t>(params.max_tokens);
  const Clock::time_point start = Clock::now();
  for (std::uint32_t i = 0; i < (fork ? 1 : params.n); ++i) {
    Result<engine::RequestId> id = engine.submit(request, callback);
    if (!id.ok()) return id.status().with_context("submitting " + run.system);
  }
  KVVM_ASSIGN_OR_RETURN(std::uint64_t peak, run_to_idle(engine, &steps));
  if (failed > 0) {
    return first_error.with_context(std::to_string(failed) + " of " + run.system + " failed");
  }
  const engine::EngineStats stats = engine.stats();
  run.peak_kv_bytes = peak;
  run.seconds = std::chrono::duration<double>(last_token - start).count();
  run.generated_tokens = tokens;
  run.steps = steps;
  run.forks = stats.arena.forks - before.arena.forks;
  run.prefix_hit_tokens = stats.cached_tokens - before.cached_tokens;
  return run;
}

}  // namespace

Result<std::vector<ChoicesRun>> measure_choices(model::Model& model,
                                                const engine::KvSpaceOptions& kv,
                                                const ChoicesParams& params) {
  const std::uint32_t vocab = model.config().vocab_size;
  std::mt19937_64 rng(params.seed);
  const auto random_prompt = [&](std::uint64_t tokens) {
    std::vector<std::int32_t> ids(tokens);
    for (std::int32_t& id : ids) id = static_cast<std::int32_t>(rng() % vocab);
    return ids;
  };
  const std::vector<std::int32_t> prompt = random_prompt(params.prompt_tokens);
  const std::vector<std::int32_t> warm =
      random_prompt(std::min<std::uint64_t>(16, params.prompt_tokens));
  std::vector<ChoicesRun> runs;
  for (const bool fork : {true, false}) {
    KVVM_ASSIGN_OR_RETURN(ChoicesRun run, run_system(model, kv, params, fork, prompt, warm));
    runs.push_back(std::move(run));
  }
  return runs;
}

}  // namespace kvvm::cli
