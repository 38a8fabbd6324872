#include "bench/drivers/engine/engine_offline.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kit/cli_common.h"
#include "kit/op_timing.h"
#include "kit/speculative_flag.h"
#include "kvvm/engine/engine.h"

namespace kvvm::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// "IN/OUT" or "IN OUT" or "IN,OUT" of whole positive numbers.
bool parse_pair(const std::string& text, std::uint32_t* in, std::uint32_t* out) {
  std::string spaced = text;
  std::replace(spaced.begin(), spaced.end(), '/', ' ');
  std::replace(spaced.begin(), spaced.end(), ',', ' ');
  std::istringstream stream(spaced);
  std::int64_t a = 0, b = 0;
  std::string rest;
  if (!(stream >> a >> b) || (stream >> rest)) return false;
  const auto most = static_cast<std::int64_t>(kMaxTokens);
  if (a < 1 || b < 1 || a > most || b > most) return false;
  *in = static_cast<std::uint32_t>(a);
  *out = static_cast<std::uint32_t>(b);
  return true;
}

// Per request of the measured run: when its first token came and when it ended.
struct RequestTimes {
  Clock::time_point first;
  Clock::time_point end;
  std::uint64_t tokens = 0;
  bool started = false;
  bool ended = false;
};

struct RunProgress {
  std::uint32_t ended = 0;
  std::uint32_t failed = 0;
  Status first_error;
};

// Submits requests of `lengths` (random prompts) with per-request times in `times`.
Status submit_all(engine::Engine& engine,
                  const std::vector<std::pair<std::uint32_t, std::uint32_t>>& lengths,
                  std::mt19937_64& rng, std::uint32_t vocab, std::vector<RequestTimes>& times,
                  RunProgress& progress) {
  times.assign(lengths.size(), RequestTimes{});
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    engine::EngineRequest request;
    request.prompt.resize(lengths[i].first);
    for (std::int32_t& id : request.prompt) id = static_cast<std::int32_t>(rng() % vocab);
    request.max_tokens = lengths[i].second;
    request.use_model_eos = false;  // every answer runs to its output length
    RequestTimes* mine = &times[i];
    Result<engine::RequestId> id =
        engine.submit(std::move(request), [mine, &progress](const engine::RequestEvent& event) {
          const Clock::time_point now = Clock::now();
          if (!mine->started && !event.tokens.empty()) {
            mine->started = true;
            mine->first = now;
          }
          mine->tokens += event.tokens.size();
          if (!event.finished) return;
          mine->ended = true;
          mine->end = now;
          ++progress.ended;
          if (event.end == engine::RequestEnd::kError && progress.failed++ == 0) {
            progress.first_error = event.error;
          }
        });
    if (!id.ok()) return id.status().with_context("submitting request " + std::to_string(i));
  }
  return Status::Ok();
}

Status run_to_end(engine::Engine& engine, const RunProgress& progress, std::size_t requests,
                  std::uint64_t* steps) {
  for (;;) {
    Result<bool> more = engine.step();
    if (!more.ok()) return more.status().with_context("engine step");
    ++*steps;
    if (!*more) break;
  }
  if (progress.failed > 0) {
    return progress.first_error.with_context(std::to_string(progress.failed) + " of " +
                                             std::to_string(requests) + " requests failed");
  }
  if (progress.ended != requests) {
    return Status::Internal("the engine stopped with " + std::to_string(requests - progress.ended) +
                            " of " + std::to_string(requests) + " requests unfinished");
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<OfflineSpec>> parse_offline_lengths(const std::string& text,
                                                       std::uint64_t requests,
                                                       const std::string& flag) {
  std::vector<OfflineSpec> specs;
  std::size_t from = 0;
  while (from <= text.size()) {
    std::size_t comma = text.find(',', from);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(from, comma - from);
    from = comma + 1;
    std::uint32_t in = 0, out = 0;
    if (item.find('/') == std::string::npos || !parse_pair(item, &in, &out)) {
      return Status::InvalidArgument(flag + " " + text + ": \"" + item +
                                     "\" is not INPUT/OUTPUT tokens, each 1 to " +
                                     std::to_string(kMaxTokens));
    }
    OfflineSpec spec;
    spec.label = std::to_string(in) + "/" + std::to_string(out);
    spec.lengths.assign(requests, {in, out});
    specs.push_back(std::move(spec));
  }
  if (specs.empty()) return Status::InvalidArgument(flag + ": no INPUT/OUTPUT pair given");
  return specs;
}

Result<OfflineSpec> read_offline_dataset(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument("--offline-dataset " + path + ": cannot be read");
  OfflineSpec spec;
  spec.label = std::filesystem::path(path).filename().string();
  std::string line;
  for (std::uint64_t number = 1; std::getline(in, line); ++number) {
    const std::size_t start = line.find_first_not_of(" \t\r");
    if (start == std::string::npos || line[start] == '#') continue;
    std::uint32_t input = 0, output = 0;
    if (!parse_pair(line, &input, &output)) {
      return Status::InvalidArgument(
          "--offline-dataset " + path + ", line " + std::to_string(number) + ": \"" + line +
          "\" is not two token counts (input and output), each 1 to " + std::to_string(kMaxTokens));
    }
    spec.lengths.emplace_back(input, output);
  }
  if (spec.lengths.empty()) {
    return Status::InvalidArgument("--offline-dataset " + path + ": no request in it");
  }
  return spec;
}

Result<OfflineRun> measure_offline(model::Model& model, const engine::KvSpaceOptions& kv,
                                   const OfflineSpec& spec, const OfflineParams& params) {
  OfflineRun run;
  run.label = spec.label;
  run.requests = spec.lengths.size();
  std::uint64_t longest = 0;
  for (const auto& [in, out] : spec.lengths) {
    run.input_tokens += in;
    longest = std::max<std::uint64_t>(longest, std::uint64_t{in} + out);
  }
  if (longest > kv.max_context) {
    return Status::InvalidArgument(
        "offline " + spec.label + ": a request of " + std::to_string(longest) +
        " tokens does not fit in --max-context " + std::to_string(kv.max_context));
  }
  std::uint32_t running = params.max_running;
  if (running == 0) {
    // What the KV budget holds with every sequence at the longest request's length: the
    // running limit set by memory, not a constant.
    const std::uint64_t per_sequence =
        model.config().kv_geometry(kv.kv_dtype).bytes_per_token() * longest;
    const std::uint64_t fits = per_sequence == 0 ? 1 : kv.budget_bytes / per_sequence;
    running = static_cast<std::uint32_t>(
        std::clamp<std::uint64_t>(fits, 1, std::max<std::uint32_t>(params.max_chunks, 1)));
  }
  running = static_cast<std::uint32_t>(std::min<std::uint64_t>(running, run.requests));
  run.max_running = running;

  engine::KvSpaceOptions kv_options = kv;
  kv_options.sequences = running;  // the space adds the graphs' padding slot
  Result<std::unique_ptr<engine::KvSpace>> space =
      engine::KvSpace::create(model.config(), kv_options);
  if (!space.ok()) return space.status().with_context("KV space");
  engine::EngineOptions options;
  options.max_running = running;
  options.max_queue = static_cast<std::uint32_t>(run.requests + params.warmup);
  options.max_queue_wait = std::chrono::milliseconds{0};  // offline: everything waits its turn
  options.refuse_predicted_wait = false;
  options.graphs = params.graphs;
  options.speculative = params.speculative;
  std::unique_ptr<engine::KvSpace> draft_space;  // declared before the engine: it goes after
  if (params.speculative.enabled() &&
      params.speculative.method == engine::SpeculativeMethod::kDraftModel) {
    if (params.draft == nullptr) {
      return Status::InvalidArgument("offline: a draft_model config without a draft model");
    }
    Result<std::unique_ptr<engine::KvSpace>> made_draft = engine::KvSpace::create(
        params.draft->config(), draft_kv_options(**space, params.draft->config(),
                                                 params.speculative.num_speculative_tokens));
    if (!made_draft.ok()) return made_draft.status().with_context("the draft model's KV space");
    draft_space = std::move(made_draft).value();
    options.draft = engine::DraftModel{.model = params.draft, .kv = draft_space.get()};
  }
  Result<std::unique_ptr<engine::Engine>> made = engine::Engine::create(model, **space, options);
  if (!made.ok()) return made.status().with_context("engine (offline)");
  engine::Engine& engine = **made;
  if (params.graphs && model.backend() == model::Backend::kCuda &&
      engine.stats().graphs.graphs == 0) {
    run.note = "no decode graph was captured: the steps ran eagerly";
  }
  std::mt19937_64 rng(params.seed);
  const std::uint32_t vocab = model.config().vocab_size;
  std::vector<RequestTimes> times;
  std::uint64_t steps = 0;
  // The warm-up: the first requests' lengths, their answers cut to 16 tokens.
  run.warmup = static_cast<std::uint32_t>(std::min<std::uint64_t>(params.warmup, run.requests));
  if (run.warmup > 0) {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> warm(spec.lengths.begin(),
                                                              spec.lengths.begin() + run.warmup);
    for (auto& [in, out] : warm) out = std::min<std::uint32_t>(out, 16);
    RunProgress progress;
    KVVM_RETURN_IF_ERROR(submit_all(engine, warm, rng, vocab, times, progress));
    KVVM_RETURN_IF_ERROR(run_to_end(engine, progress, warm.size(), &steps).with_context("warm-up"));
  }

  const engine::EngineStats before = engine.stats();
  RunProgress progress;
  steps = 0;
  const Clock::time_point start = Clock::now();
  KVVM_RETURN_IF_ERROR(submit_all(engine, spec.lengths, rng, vocab, times, progress));
  KVVM_RETURN_IF_ERROR(run_to_end(engine, progress, spec.lengths.size(), &steps));
  const engine::EngineStats after = engine.stats();

  Clock::time_point last = start;
  std::vector<double> latency, ttft, tpot;
  for (const RequestTimes& t : times) {
    run.output_tokens += t.tokens;
    last = std::max(last, t.end);
    latency.push_back(seconds(t.end - start));
    if (t.started) ttft.push_back(seconds(t.first - start));
    if (t.started && t.tokens > 1) {
      tpot.push_back(seconds(t.end - t.first) * 1e3 / static_cast<double>(t.tokens - 1));
    }
  }
  run.seconds = seconds(last - start);
  if (run.seconds > 0) {
    run.output_tokens_per_s = static_cast<double>(run.output_tokens) / run.seconds;
    run.total_tokens_per_s =
        static_cast<double>(run.output_tokens + run.input_tokens) / run.seconds;
    run.requests_per_s = static_cast<double>(run.requests) / run.seconds;
  }
  const auto at = [](const std::vector<double>& v, double q) {
    return v.empty() ? 0.0 : percentile(v, q);
  };
  run.latency_p50_s = at(latency, 50);
  run.latency_p99_s = at(latency, 99);
  run.ttft_p50_s = at(ttft, 50);
  run.ttft_p99_s = at(ttft, 99);
  run.tpot_p50_ms = at(tpot, 50);
  run.tpot_p99_ms = at(tpot, 99);
  run.steps = steps;
  run.peak_running = after.peak_running;
  run.graph_replays = after.graphs.replays - before.graphs.replays;
  run.preemptions = after.preemptions - before.preemptions;
  run.phases = after.phases.since(before.phases);
  run.spec_drafts = after.spec_drafts - before.spec_drafts;
  run.spec_draft_tokens = after.spec_draft_tokens - before.spec_draft_tokens;
  run.spec_accepted_tokens = after.spec_accepted_tokens - before.spec_accepted_tokens;
  return run;
}

}  // namespace kvvm::cli
