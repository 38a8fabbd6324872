// generate(): one request through an Engine of one running sequence, stepped on the caller's
// thread until idle. The engine is the one inference loop; this only maps the request in and
// the events back to one result.
#include "kvvm/engine/generate.h"

#include <chrono>
#include <memory>
#include <optional>
#include <utility>

#include "kvvm/engine/engine.h"

namespace kvvm::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

EngineRequest engine_request(const GenerateRequest& r) {
  EngineRequest request;
  request.prompt = r.prompt;
  request.max_tokens = r.max_tokens;
  request.sampling = r.sampling;
  request.stop_ids = r.stop_ids;
  request.use_model_eos = false;  // generate() stops at its stop_ids only
  request.keep_prompt_logits = r.keep_prompt_logits;
  request.grammar = r.grammar;
  return request;
}

}  // namespace

Result<GenerateResult> generate(model::Model& model, KvSpace& kv, const GenerateRequest& request,
                                const TokenCallback& on_token) {
  EngineRequest submitted = engine_request(request);
  // Before the engine: a refused request costs no graph capture.
  KVVM_RETURN_IF_ERROR(check_request_limits(submitted, request_limits(model, kv)));
  EngineOptions options;
  options.max_running = 1;
  options.prefill_chunk = request.prefill_chunk;          // 0 or past the step budget: the budget
  options.max_queue_wait = std::chrono::milliseconds{0};  // the caller's thread steps at once
  options.prefix_cache = false;  // one request: nothing to share, nothing left held after
  options.graphs = request.graphs;
  options.speculative = request.speculative;
  options.draft = request.draft;
  KVVM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> created,
                        Engine::create(model, kv, std::move(options)));
  Engine& engine = *created;

  GenerateResult result;
  Status error;
  bool cancelled = false;
  std::optional<RequestId> id;
  std::optional<Clock::time_point> first_token;
  std::uint64_t steps_at_first_token = 0;
  const Clock::time_point start = Clock::now();
  const auto on_event = [&](const RequestEvent& event) {
    for (const std::int32_t token : event.tokens) {
      if (!first_token) {
        first_token = Clock::now();
        steps_at_first_token = engine.stats().steps;
      }
      result.tokens.push_back(token);
      // Cancelled: the engine ends the request at the next step, before any model step.
      if (!cancelled && on_token && !on_token(token)) {
        cancelled = true;
        if (id) engine.cancel(*id);
      }
    }
    if (!event.finished) return;
    result.prompt_logits.assign(event.prompt_logits.begin(), event.prompt_logits.end());
    switch (event.end) {
      case RequestEnd::kStop:
      case RequestEnd::kCancelled:
        result.finish = FinishReason::kStop;
        break;
      case RequestEnd::kLength:
        result.finish = FinishReason::kLength;
        break;
      case RequestEnd::kError:
        error = event.error;
        break;
    }
  };
  KVVM_ASSIGN_OR_RETURN(RequestId queued, engine.submit(std::move(submitted), on_event));
  id = queued;
  KVVM_RETURN_IF_ERROR(engine.run_until_idle());
  if (!error.ok()) return error;

  const Clock::time_point end = Clock::now();
  const Clock::time_point prefilled = first_token.value_or(end);
  result.timings.prefill_seconds = seconds_between(start, prefilled);
  result.timings.decode_seconds = seconds_between(prefilled, end);
  if (first_token) {
    const EngineStats stats = engine.stats();
    result.timings.decode_steps = static_cast<std::uint32_t>(stats.steps - steps_at_first_token);
    result.timings.decode_tokens = static_cast<std::uint32_t>(result.tokens.size() - 1);
    result.timings.draft_tokens = stats.spec_draft_tokens;
    result.timings.accepted_tokens = stats.spec_accepted_tokens;
  }
  return result;
}

}  // namespace kvvm::engine
