// generate(): the single-sequence loop. The slot is held by a guard so that every return,
// an error mid-prefill included, gives it back to the arena.
#include "kvvm/engine/generate.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>

namespace kvvm::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Releases the slot when generation ends, however it ends.
class SlotGuard {
 public:
  SlotGuard(Arena& arena, SlotId slot) : arena_(arena), slot_(slot) {}
  SlotGuard(const SlotGuard&) = delete;
  SlotGuard& operator=(const SlotGuard&) = delete;
  // A failed release leaves the arena to report it (it quarantines what it cannot undo);
  // the generation's own result stands.
  ~SlotGuard() { arena_.release(slot_).ignore(); }

 private:
  Arena& arena_;
  SlotId slot_;
};

Status check_request(const model::Model& model, const KvSpace& kv, const GenerateRequest& r) {
  if (r.prompt.empty()) return Status::InvalidArgument("prompt: empty (at least one token)");
  KVVM_RETURN_IF_ERROR(check_sampling(r.sampling));
  // Positions travel as 32-bit numbers in a step's chunks.
  if (r.prompt.size() + std::uint64_t{r.max_tokens} > std::numeric_limits<std::uint32_t>::max()) {
    return Status::InvalidArgument("prompt of " + std::to_string(r.prompt.size()) +
                                   " tokens + max_tokens " + std::to_string(r.max_tokens) +
                                   ": positions past 2^32 - 1");
  }
  const std::uint64_t context = kv.options().max_context;
  const std::uint64_t needed = r.prompt.size() + std::uint64_t{r.max_tokens};
  if (needed > context) {
    return Status::InvalidArgument("prompt of " + std::to_string(r.prompt.size()) +
                                   " tokens + max_tokens " + std::to_string(r.max_tokens) + " = " +
                                   std::to_string(needed) + " tokens exceed the context of " +
                                   std::to_string(context) + " tokens");
  }
  if (model.limits().max_step_tokens == 0) {
    return Status::InvalidArgument("the model's max_step_tokens is 0: no step can run");
  }
  return Status::Ok();
}

}  // namespace

Result<GenerateResult> generate(model::Model& model, KvSpace& kv, const GenerateRequest& request,
                                const TokenCallback& on_token) {
  KVVM_RETURN_IF_ERROR(check_request(model, kv, request));
  const std::uint32_t vocab = model.config().vocab_size;
  const std::uint32_t step_limit = model.limits().max_step_tokens;
  const std::uint32_t chunk_tokens =
      request.prefill_chunk == 0 ? step_limit : std::min(request.prefill_chunk, step_limit);
  const auto prompt_size = static_cast<std::uint32_t>(request.prompt.size());

  GenerateResult result;
  std::vector<float> logits(vocab);
  const model::StepOutput last_output{.logits = logits.data(), .argmax = nullptr};
  Arena& arena = kv.arena();

  const Clock::time_point prefill_start = Clock::now();
  Result<SlotId> admitted = arena.admit(prompt_size);
  if (!admitted.ok()) return admitted.status().with_context("admitting the prompt");
  const SlotId slot = *admitted;
  SlotGuard guard(arena, slot);

  // Prefill: only the chunk holding the prompt's last token needs its logits.
  for (std::uint32_t start = 0; start < prompt_size; start += chunk_tokens) {
    const std::uint32_t tokens = std::min(chunk_tokens, prompt_size - start);
    KVVM_RETURN_IF_ERROR(arena.ensure(slot, start + tokens));
    const model::Chunk chunk{.slot = slot, .start = start, .tokens = tokens};
    const model::StepBatch batch{
        .token_ids = std::span<const std::int32_t>(request.prompt).subspan(start, tokens),
        .chunks = std::span<const model::Chunk>(&chunk, 1),
        .kv = kv.view(),
        .sampling = {}};
    const bool last = start + tokens == prompt_size;
    Status step = model.forward(batch, last ? last_output : model::StepOutput{});
    if (!step.ok()) {
      return step.with_context("prefill of prompt tokens [" + std::to_string(start) + ", " +
                               std::to_string(start + tokens) + ")");
    }
  }
  result.timings.prefill_seconds = seconds_since(prefill_start);
  if (request.keep_prompt_logits) result.prompt_logits = logits;

  const Clock::time_point decode_start = Clock::now();
  std::uint32_t position = prompt_size;  // where the next fed-back token goes
  for (std::uint32_t n = 0; n < request.max_tokens; ++n) {
    const std::int32_t token = sample_token(logits, request.sampling, n);
    if (std::find(request.stop_ids.begin(), request.stop_ids.end(), token) !=
        request.stop_ids.end()) {
      result.finish = FinishReason::kStop;
      break;
    }
    result.tokens.push_back(token);
    if (on_token && !on_token(token)) {
      result.finish = FinishReason::kStop;
      break;
    }
    if (n + 1 == request.max_tokens) break;  // the last token needs no forward pass

    KVVM_RETURN_IF_ERROR(arena.ensure(slot, position + 1));
    const model::Chunk chunk{.slot = slot, .start = position, .tokens = 1};
    const model::StepBatch batch{.token_ids = std::span<const std::int32_t>(&token, 1),
                                 .chunks = std::span<const model::Chunk>(&chunk, 1),
                                 .kv = kv.view(),
                                 .sampling = {}};
    Status step = model.forward(batch, last_output);
    if (!step.ok()) {
      return step.with_context("decode step at position " + std::to_string(position));
    }
    ++position;
    ++result.timings.decode_steps;
  }
  result.timings.decode_seconds = seconds_since(decode_start);
  return result;
}

}  // namespace kvvm::engine
