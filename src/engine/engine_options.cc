// Engine options and requests checked against the model, the KV space and the context.
#include "engine_options.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "engine_impl.h"

namespace kvvm::engine {

std::vector<std::uint32_t> default_buckets(std::uint32_t max_running) {
  std::vector<std::uint32_t> buckets;
  for (std::uint32_t b = 1; b < max_running; b *= 2) buckets.push_back(b);
  buckets.push_back(max_running);
  return buckets;
}

Status check_buckets(const std::vector<std::uint32_t>& buckets, std::uint32_t max_chunks) {
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i] == 0 || buckets[i] > max_chunks) {
      return Status::InvalidArgument(
          "graph_batch_sizes[" + std::to_string(i) + "] = " + std::to_string(buckets[i]) +
          ": outside [1, the model's max_chunks " + std::to_string(max_chunks) + "]");
    }
    if (i > 0 && buckets[i] <= buckets[i - 1]) {
      return Status::InvalidArgument("graph_batch_sizes[" + std::to_string(i) +
                                     "] = " + std::to_string(buckets[i]) + ": not ascending");
    }
  }
  return Status::Ok();
}

Status resolve_options(const model::Model& model, const KvSpace& kv, bool pad, EngineOptions& o) {
  KVVM_RETURN_IF_ERROR(check_speculative_options(o.speculative).with_context("speculative"));
  const model::ModelLimits& limits = model.limits();
  const std::uint32_t slots = kv.options().max_slots - (pad ? kPadSlots : 0);
  // A space sized for its sequences runs that many (its padding slot stays idle without graphs).
  const std::uint32_t sequences =
      kv.options().sequences == 0 ? slots : std::min(kv.options().sequences, slots);
  if (o.step_tokens == 0) o.step_tokens = limits.max_step_tokens;
  if (o.step_tokens == 0 || o.step_tokens > limits.max_step_tokens) {
    return Status::InvalidArgument("step_tokens " + std::to_string(o.step_tokens) +
                                   ": outside [1, the model's max_step_tokens " +
                                   std::to_string(limits.max_step_tokens) + "]");
  }
  // Every running sequence's decode token must fit a step, or the newest would starve.
  if (o.max_running == 0) o.max_running = std::min({limits.max_chunks, sequences, o.step_tokens});
  if (o.max_running == 0) {
    return Status::InvalidArgument("max_running 0: no slot left for a sequence (max_slots " +
                                   std::to_string(kv.options().max_slots) + ")");
  }
  if (o.max_running > limits.max_chunks) {
    return Status::InvalidArgument("max_running " + std::to_string(o.max_running) +
                                   " exceeds the model's max_chunks " +
                                   std::to_string(limits.max_chunks));
  }
  if (o.max_running > o.step_tokens) {
    return Status::InvalidArgument("max_running " + std::to_string(o.max_running) +
                                   " exceeds step_tokens " + std::to_string(o.step_tokens) +
                                   ": every running sequence's decode token must fit a step");
  }
  if (o.max_running > slots) {
    return Status::InvalidArgument(
        "max_running " + std::to_string(o.max_running) + " exceeds the KV space's " +
        std::to_string(slots) + " slots for sequences" +
        (pad ? " (one of max_slots is the decode graphs' padding)" : ""));
  }
  if (o.prefill_chunk == 0 || o.prefill_chunk > o.step_tokens) o.prefill_chunk = o.step_tokens;
  if (o.max_prefill_tokens_while_decoding > o.step_tokens) {
    return Status::InvalidArgument("max_prefill_tokens_while_decoding " +
                                   std::to_string(o.max_prefill_tokens_while_decoding) +
                                   ": exceeds step_tokens " + std::to_string(o.step_tokens) +
                                   " (0: no bound but step_tokens)");
  }
  if (o.tpot_target.count() < 0) {
    return Status::InvalidArgument("tpot_target " + std::to_string(o.tpot_target.count()) +
                                   " us: negative (0: no target)");
  }
  if (o.ttft_target.count() < 0) {
    return Status::InvalidArgument("ttft_target " + std::to_string(o.ttft_target.count()) +
                                   " us: negative (0: no target)");
  }
  // A shared window is read-only and would need an ensure to be written: the preallocated
  // baseline never grows, so it never shares.
  if (o.preallocate) o.prefix_cache = false;
  if (o.max_queue == 0) {
    return Status::InvalidArgument("max_queue 0: no request could ever be queued");
  }
  if (o.max_queue_wait.count() < 0) {
    return Status::InvalidArgument("max_queue_wait " + std::to_string(o.max_queue_wait.count()) +
                                   " ms: negative");
  }
  if (o.idle_release.count() < 0) {
    return Status::InvalidArgument("idle_release " + std::to_string(o.idle_release.count()) +
                                   " ms: negative");
  }
  if (o.model_identity.empty()) o.model_identity = model.config().architecture;
  return Status::Ok();
}

std::string cache_identity(const model::Model& model, const KvSpace& kv,
                           const EngineOptions& options) {
  // K / V written under one element type or scale set are never read under another: both
  // are part of every cache key.
  const DType element = kv.options().kv_dtype;
  std::string identity = options.model_identity + '\0' + "kv " + std::string(to_string(element));
  if (element == DType::kFp8) identity += '\0' + model.kv_scales().fingerprint();
  // Scales yet to be measured by the first prefill: no K / V exists before that step, and the
  // scales never change after it, so every entry of this engine's cache has the measured ones.
  if (element == DType::kFp8 && model.kv_calibration_pending()) identity += "\0calibrated";
  return identity;
}

RequestLimits request_limits(const model::Model& model, const KvSpace& kv) {
  const std::uint64_t space = kv.options().max_context;
  const std::uint64_t positions = model.config().max_position_embeddings;
  return RequestLimits{.context = positions == 0 ? space : std::min(space, positions),
                       .vocab_size = model.config().vocab_size};
}

Status check_request_limits(const EngineRequest& r, const RequestLimits& limits) {
  const std::uint32_t vocab = limits.vocab_size;
  const auto check_ids = [vocab](const std::vector<std::int32_t>& ids,
                                 const char* field) -> Status {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || static_cast<std::uint32_t>(ids[i]) >= vocab) {
        return Status::InvalidArgument(std::string(field) + "[" + std::to_string(i) + "]: id " +
                                       std::to_string(ids[i]) + " outside the vocabulary of " +
                                       std::to_string(vocab));
      }
    }
    return Status::Ok();
  };
  if (r.prompt.empty()) return Status::InvalidArgument("prompt: empty (at least one token)");
  KVVM_RETURN_IF_ERROR(check_ids(r.prompt, "prompt"));
  KVVM_RETURN_IF_ERROR(check_sampling(r.sampling));
  // Zero tokens is an answer only when the prompt's logits or log-probabilities are.
  if (r.max_tokens == 0 && !r.keep_prompt_logits && !r.prompt_logprobs) {
    return Status::InvalidArgument(
        "max_tokens: 0 (at least 1; 0 only to prefill with keep_prompt_logits or "
        "prompt_logprobs)");
  }
  if (r.n == 0) return Status::InvalidArgument("n: 0 (at least one sequence)");
  if (r.n > 1 && r.max_tokens == 0) {
    return Status::InvalidArgument("n: " + std::to_string(r.n) +
                                   " with max_tokens 0 (a prefill has one answer; n must be 1)");
  }
  for (std::size_t i = 0; i < r.logit_bias.size(); ++i) {
    const auto& [id, bias] = r.logit_bias[i];
    const std::string field = "logit_bias[" + std::to_string(i) + "]";
    if (id < 0 || static_cast<std::uint32_t>(id) >= vocab) {
      return Status::InvalidArgument(field + ": id " + std::to_string(id) +
                                     " outside the vocabulary of " + std::to_string(vocab));
    }
    if (std::isnan(bias) || bias == std::numeric_limits<float>::infinity()) {
      return Status::InvalidArgument(field + ": bias " + std::to_string(bias) +
                                     " (finite, or -inf to ban the token)");
    }
  }
  const DryPenalty& dry = r.dry;
  if (!std::isfinite(dry.multiplier) || dry.multiplier < 0) {
    return Status::InvalidArgument("dry_multiplier: " + std::to_string(dry.multiplier) +
                                   " (finite and >= 0; 0: off)");
  }
  if (dry.multiplier > 0 && !(std::isfinite(dry.base) && dry.base > 1)) {
    return Status::InvalidArgument("dry_base: " + std::to_string(dry.base) + " (finite and > 1)");
  }
  for (std::size_t i = 0; i < dry.breakers.size(); ++i) {
    const std::int32_t id = dry.breakers[i];
    if (id < 0 || static_cast<std::uint32_t>(id) >= vocab || (i > 0 && id <= dry.breakers[i - 1])) {
      return Status::InvalidArgument("dry breakers[" + std::to_string(i) + "]: id " +
                                     std::to_string(id) + " (ascending ids of the vocabulary of " +
                                     std::to_string(vocab) + ")");
    }
  }
  if (r.min_tokens > r.max_tokens) {
    return Status::InvalidArgument("min_tokens: " + std::to_string(r.min_tokens) +
                                   " exceeds max_tokens " + std::to_string(r.max_tokens));
  }
  if (r.logprobs && *r.logprobs > model::kMaxTopLogprobs) {
    return Status::InvalidArgument("logprobs: " + std::to_string(*r.logprobs) +
                                   " alternatives (at most " +
                                   std::to_string(model::kMaxTopLogprobs) + ")");
  }
  const std::uint64_t prompt = r.prompt.size();
  const std::uint64_t needed = prompt + std::uint64_t{r.max_tokens};
  if (needed > limits.context) {
    const std::string room =
        prompt >= limits.context
            ? "the prompt alone fills it"
            : "at most " + std::to_string(limits.context - prompt) + " after this prompt";
    return Status::InvalidArgument("max_tokens: " + std::to_string(r.max_tokens) +
                                   " + the prompt's " + std::to_string(prompt) + " tokens = " +
                                   std::to_string(needed) + " tokens exceed the context of " +
                                   std::to_string(limits.context) + " tokens (" + room + ")");
  }
  return check_ids(r.stop_ids, "stop_ids");
}

Status Engine::Impl::validate(const EngineRequest& r) const {
  KVVM_RETURN_IF_ERROR(check_request_limits(
      r, RequestLimits{.context = context_, .vocab_size = model_.config().vocab_size}));
  if (!r.stop_strings.empty() && options_.tokenizer == nullptr) {
    return Status::InvalidArgument(
        "stop_strings: the engine has no tokenizer (EngineOptions::tokenizer) to read text with");
  }
  if (r.grammar && r.grammar->vocabulary().size() > model_.config().vocab_size) {
    return Status::InvalidArgument(
        "grammar: compiled over a vocabulary of " + std::to_string(r.grammar->vocabulary().size()) +
        " tokens, more than the model's " + std::to_string(model_.config().vocab_size));
  }
  if (!r.grammar_trigger.empty() && (!r.grammar || options_.tokenizer == nullptr)) {
    return Status::InvalidArgument(
        r.grammar ? "grammar_trigger: the engine has no tokenizer (EngineOptions::tokenizer) to "
                    "read the output's text with"
                  : "grammar_trigger: given without a grammar to start");
  }
  for (std::size_t i = 0; i < r.stop_strings.size(); ++i) {
    if (r.stop_strings[i].empty()) {
      return Status::InvalidArgument("stop_strings[" + std::to_string(i) + "]: empty");
    }
  }
  return Status::Ok();
}

}  // namespace kvvm::engine
