#include "bench/drivers/engine/engine_trace.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "bench/drivers/engine/steady_rate.h"
#include "kit/op_timing.h"  // percentile
#include "kit/text_table.h"
#include "kvvm/engine/engine.h"

namespace kvvm::cli {
namespace {

using Clock = std::chrono::steady_clock;

// What happened to one request. Written by the submitter (refusals at submit) or by the
// engine's thread (events), never both; read after drain() has stopped that thread.
struct RequestRecord {
  bool submitted = false;
  bool accepted = false;
  bool finished = false;
  engine::RequestEnd end = engine::RequestEnd::kLength;
  Status error;
  engine::RequestStats stats;
};

// A day: "no limit" for drain().
constexpr std::chrono::milliseconds kNoLimit{24LL * 3600 * 1000};
constexpr std::chrono::seconds kProgressEvery{5};
// How often the replay samples its tokens and running requests (for the loaded rate, whose
// window is seconds long: the engine's stats are read no more often than this), and the
// shortest loaded window it reports a rate for.
constexpr std::chrono::milliseconds kSampleEvery{100};
constexpr double kLeastSteadySeconds = 1.0;

std::vector<std::int32_t> prompt_of(const TraceRequest& request, std::uint32_t vocab) {
  std::vector<std::int32_t> prompt(request.prompt_tokens);
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    prompt[i] = static_cast<std::int32_t>((*request.ids)[i] % vocab);
  }
  return prompt;
}

bool overloaded(const Status& status) { return status.code() == StatusCode::kResourceExhausted; }

}  // namespace

Result<TraceRun> replay_trace(model::Model& model, const engine::KvSpaceOptions& kv,
                              const Trace& trace, double rate, const ReplayParams& params) {
  TraceRun run;
  run.system = params.preallocate ? "preallocated" : "arena";
  run.rate = rate;
  for (const TraceRequest& request : trace.requests) {
    if (!request.ids || request.ids->size() < request.prompt_tokens) {
      return Status::InvalidArgument("the trace's requests need token ids (synthesize_ids)");
    }
  }
  engine::KvSpaceOptions kv_options = kv;
  kv_options.sequences = params.max_running;  // the space adds the graphs' padding slot
  kv_options.parked_slots = params.parked_slots;
  Result<std::unique_ptr<engine::KvSpace>> space =
      engine::KvSpace::create(model.config(), kv_options);
  if (!space.ok()) return space.status().with_context("KV space");
  engine::EngineOptions options;
  options.max_running = params.max_running;
  options.preallocate = params.preallocate;
  options.refuse_predicted_wait = params.refuse_predicted_wait;
  options.wait_forecast = params.wait_forecast;
  options.max_queue_wait = params.max_queue_wait;
  options.max_prefill_tokens_while_decoding = params.max_prefill_tokens_while_decoding;
  options.tpot_target = params.tpot_target;
  options.ttft_target = params.ttft_target;
  options.graphs = model.backend() == model::Backend::kCuda;  // as a server runs it
  Result<std::unique_ptr<engine::Engine>> made = engine::Engine::create(model, **space, options);
  if (!made.ok()) return made.status().with_context("engine (" + run.system + ")");
  engine::Engine& engine = **made;
  // What the space and the graphs' capture cost before the first arrival is not the replay's.
  const ArenaStats arena_before = engine.stats().arena;

  const std::uint32_t vocab = model.config().vocab_size;
  std::vector<RequestRecord> records(trace.requests.size());
  std::atomic<std::uint64_t> tokens{0}, submitted{0}, finished{0};
  std::atomic<std::int64_t> last_event_ns{0};
  std::atomic<bool> done{false};
  KVVM_RETURN_IF_ERROR(engine.start());
  const Clock::time_point start = Clock::now();
  std::thread driver([&] {
    for (std::size_t i = 0; i < trace.requests.size(); ++i) {
      const TraceRequest& request = trace.requests[i];
      if (params.duration_limit_s > 0 && request.arrival_s >= params.duration_limit_s) break;
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(request.arrival_s)));
      engine::EngineRequest submit;
      submit.prompt = prompt_of(request, vocab);
      submit.max_tokens = static_cast<std::uint32_t>(request.output_tokens);
      submit.use_model_eos = false;  // the trace's lengths, as the simulator replays them
      submit.tenant = request.prefix_group == kNoPrefixGroup
                          ? 0
                          : static_cast<std::uint64_t>(request.prefix_group);
      RequestRecord& record = records[i];
      record.submitted = true;
      Result<engine::RequestId> id =
          engine.submit(std::move(submit), [&, i](const engine::RequestEvent& event) {
            tokens.fetch_add(event.tokens.size(), std::memory_order_relaxed);
            last_event_ns.store(
                std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count(),
                std::memory_order_relaxed);
            if (!event.finished) return;
            RequestRecord& r = records[i];
            r.finished = true;
            r.end = event.end;
            r.error = event.error;
            if (event.stats != nullptr) r.stats = *event.stats;
            finished.fetch_add(1, std::memory_order_relaxed);
          });
      submitted.fetch_add(1, std::memory_order_relaxed);
      if (id.ok()) {
        record.accepted = true;
      } else {
        record.error = id.status();
      }
    }
    std::chrono::milliseconds timeout = kNoLimit;
    if (params.duration_limit_s > 0) {
      const double left =
          params.duration_limit_s - std::chrono::duration<double>(Clock::now() - start).count();
      timeout = std::chrono::milliseconds(static_cast<std::int64_t>(std::max(0.0, left) * 1000));
    }
    engine.drain(timeout);
    done.store(true);
  });
  Clock::time_point next_line = start + kProgressEvery;
  Clock::time_point next_sample = start + kSampleEvery;
  std::vector<ReplaySample> samples;
  while (!done.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (Clock::now() < next_sample) continue;
    next_sample += kSampleEvery;
    const engine::EngineStats stats = engine.stats();
    samples.push_back({std::chrono::duration<double>(Clock::now() - start).count(),
                       tokens.load(std::memory_order_relaxed), stats.running});
    if (params.progress != nullptr && Clock::now() >= next_line) {
      next_line += kProgressEvery;
      *params.progress << "kvvm bench engine: trace " << run.system << " at " << fixed(rate, 2)
                       << " req/s: "
                       << fixed(std::chrono::duration<double>(Clock::now() - start).count(), 0)
                       << " s, submitted " << submitted.load() << "/" << trace.requests.size()
                       << ", finished " << finished.load() << ", running " << stats.running
                       << ", waiting " << stats.waiting << ", " << tokens.load() << " tokens\n"
                       << std::flush;
    }
  }
  driver.join();
  const engine::EngineStats stats = engine.stats();

  std::vector<double> ttft, tpot;
  for (const RequestRecord& record : records) {
    if (!record.submitted) {
      ++run.not_submitted;
      continue;
    }
    ++run.submitted;
    if (!record.accepted || !record.finished || record.end == engine::RequestEnd::kError) {
      // A refusal at submit, one in the queue, or a failure.
      if (overloaded(record.error)) {
        ++run.refused_overloaded;
        if (!record.accepted) ++run.refused_at_arrival;
      } else {
        ++run.failed;
        if (run.first_error.empty()) {
          run.first_error =
              record.finished || !record.accepted ? record.error.to_string() : "never finished";
        }
      }
      continue;
    }
    if (record.end == engine::RequestEnd::kCancelled) {
      ++run.cancelled;
      continue;
    }
    ++run.completed;
    ttft.push_back(record.stats.time_to_first_token);
    if (record.stats.generated_tokens >= 2) tpot.push_back(record.stats.time_per_output_token);
  }
  run.output_tokens = tokens.load();
  run.wall_seconds =
      std::chrono::duration<double>(std::chrono::nanoseconds(last_event_ns.load())).count();
  if (run.wall_seconds > 0) {
    run.output_tokens_per_s = static_cast<double>(run.output_tokens) / run.wall_seconds;
  }
  const SteadyRate steady = steady_rate(samples, kLeastSteadySeconds);
  run.steady_start_s = steady.start_s;
  run.steady_end_s = steady.end_s;
  run.steady_output_tokens_per_s = steady.tokens_per_s;
  if (!ttft.empty()) {
    run.ttft_p50_s = percentile(ttft, 50);
    run.ttft_p99_s = percentile(ttft, 99);
  }
  if (!tpot.empty()) {
    run.tpot_p50_s = percentile(tpot, 50);
    run.tpot_p99_s = percentile(tpot, 99);
  }
  run.peak_running = stats.peak_running;
  run.prefix_hit_tokens = stats.cached_tokens;
  run.preemptions = stats.preemptions;
  const DriverCallCounts& calls = stats.arena.driver_calls;
  const DriverCallCounts& calls_before = arena_before.driver_calls;
  const auto seconds = [&](DriverOp op) { return calls.seconds(op) - calls_before.seconds(op); };
  const auto count = [&](DriverOp op) { return calls.of(op) - calls_before.of(op); };
  run.kv_map_seconds = seconds(DriverOp::kMap) + seconds(DriverOp::kSetAccess);
  run.kv_unmap_seconds = seconds(DriverOp::kUnmap);
  run.kv_create_release_seconds = seconds(DriverOp::kCreate) + seconds(DriverOp::kRelease);
  run.kv_map_calls = count(DriverOp::kMap);
  run.kv_unmap_calls = count(DriverOp::kUnmap);
  const ArenaStats& arena = stats.arena;
  run.reused_admissions = arena.reused_admissions - arena_before.reused_admissions;
  run.shared_admissions = arena.shared_admissions - arena_before.shared_admissions;
  run.reuse_fence_pending = arena.reuse_fence_pending - arena_before.reuse_fence_pending;
  run.prefix_kept_reclaims = arena.prefix_kept_reclaims - arena_before.prefix_kept_reclaims;
  return run;
}

}  // namespace kvvm::cli
