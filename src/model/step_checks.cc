// The backend-independent step checks (step_checks.h).
#include "model/step_checks.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "base/format.h"  // str

namespace kvvm::model::detail {

Status check_step(const StepBatch& batch, const StepOutput& out, const ModelConfig& config,
                  const ModelLimits& limits, std::string_view who) {
  const std::string prefix = std::string(who) + ": ";
  if (batch.chunks.size() > limits.max_chunks) {
    return Status::InvalidArgument(prefix + str(batch.chunks.size()) +
                                   " chunks, above max_chunks " + str(limits.max_chunks));
  }
  if (batch.token_ids.size() > limits.max_step_tokens) {
    return Status::InvalidArgument(prefix + str(batch.token_ids.size()) +
                                   " tokens, above max_step_tokens " + str(limits.max_step_tokens));
  }
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < batch.chunks.size(); ++i) {
    const Chunk& chunk = batch.chunks[i];
    if (chunk.tokens == 0) {
      return Status::InvalidArgument(prefix + "chunk " + str(i) + " has 0 tokens");
    }
    const std::uint64_t end = std::uint64_t{chunk.start} + chunk.tokens;
    if (end > config.max_position_embeddings) {
      return Status::InvalidArgument(prefix + "chunk " + str(i) + " reaches position " +
                                     str(end - 1) + ", beyond max_position_embeddings " +
                                     str(config.max_position_embeddings));
    }
    sum += chunk.tokens;
  }
  if (sum != batch.token_ids.size()) {
    return Status::InvalidArgument(prefix + "the chunks hold " + str(sum) +
                                   " tokens but token_ids has " + str(batch.token_ids.size()));
  }
  for (std::size_t i = 0; i < batch.token_ids.size(); ++i) {
    const std::int32_t id = batch.token_ids[i];
    if (id < 0 || static_cast<std::uint32_t>(id) >= config.vocab_size) {
      return Status::InvalidArgument(prefix + "token_ids[" + str(i) + "] = " + std::to_string(id) +
                                     " is outside the vocabulary of " + str(config.vocab_size));
    }
  }
  if (out.sampled != nullptr && batch.sampling.size() != batch.chunks.size()) {
    return Status::InvalidArgument(prefix + "sampled tokens asked for but the batch has " +
                                   str(batch.sampling.size()) + " sampling entries for " +
                                   str(batch.chunks.size()) + " chunks");
  }
  if (out.sampled != nullptr) {
    for (std::size_t i = 0; i < batch.sampling.size(); ++i) {
      const Status valid = check_sampling(batch.sampling[i].params);
      if (!valid.ok())
        return Status::InvalidArgument(prefix + "sampling[" + str(i) + "]: " + valid.message());
    }
  }
  KVVM_RETURN_IF_ERROR(check_adjustments(batch, config, limits, prefix));
  KVVM_RETURN_IF_ERROR(check_token_masks(batch, config, limits, prefix));
  return check_logprobs(batch, out, config, prefix);
}

Status check_adjustments(const StepBatch& batch, const ModelConfig& config,
                         const ModelLimits& limits, const std::string& prefix) {
  if (batch.adjustments.size() > limits.max_logit_adjustments) {
    return Status::InvalidArgument(prefix + str(batch.adjustments.size()) +
                                   " logit adjustments, above max_logit_adjustments " +
                                   str(limits.max_logit_adjustments));
  }
  for (std::size_t i = 0; i < batch.sampling.size(); ++i) {
    const ChunkSampling& s = batch.sampling[i];
    const std::string field = prefix + "sampling[" + str(i) + "].adjust";
    if (std::uint64_t{s.adjust_begin} + s.adjust_count > batch.adjustments.size()) {
      return Status::InvalidArgument(field + " [" + str(s.adjust_begin) + ", +" +
                                     str(s.adjust_count) + ") is past the batch's " +
                                     str(batch.adjustments.size()) + " adjustments");
    }
    std::int64_t previous = -1;
    for (std::uint32_t k = s.adjust_begin; k < s.adjust_begin + s.adjust_count; ++k) {
      const LogitAdjustment& a = batch.adjustments[k];
      if (a.id <= previous || static_cast<std::uint32_t>(a.id) >= config.vocab_size) {
        return Status::InvalidArgument(
            prefix + "adjustments[" + str(k) + "].id " + std::to_string(a.id) +
            " is outside the vocabulary of " + str(config.vocab_size) +
            " or not above the chunk's previous id (ascending, each once)");
      }
      if (std::isnan(a.bias) || a.bias == std::numeric_limits<float>::infinity()) {
        return Status::InvalidArgument(prefix + "adjustments[" + str(k) + "].bias " +
                                       std::to_string(a.bias) + " (finite, or -inf to ban)");
      }
      previous = a.id;
    }
  }
  return Status::Ok();
}

Status check_token_masks(const StepBatch& batch, const ModelConfig& config,
                         const ModelLimits& limits, const std::string& prefix) {
  const std::size_t words = token_mask_words(config.vocab_size);
  if (batch.token_masks.size() % words != 0 ||
      batch.token_masks.size() / words > limits.max_chunks) {
    return Status::InvalidArgument(prefix + "token_masks of " + str(batch.token_masks.size()) +
                                   " words: whole rows of " + str(words) + " words, at most " +
                                   str(limits.max_chunks) + " rows");
  }
  const std::size_t rows = batch.token_masks.size() / words;
  for (std::size_t i = 0; i < batch.sampling.size(); ++i) {
    const std::int32_t row = batch.sampling[i].mask_row;
    if (row < 0) continue;
    if (static_cast<std::size_t>(row) >= rows) {
      return Status::InvalidArgument(prefix + "sampling[" + str(i) + "].mask_row " +
                                     std::to_string(row) + " is past the batch's " + str(rows) +
                                     " token mask rows");
    }
    const std::uint32_t* bits = batch.token_masks.data() + static_cast<std::size_t>(row) * words;
    bool any = false;
    for (std::size_t w = 0; w < words && !any; ++w) any = bits[w] != 0;
    if (!any) {
      return Status::InvalidArgument(prefix + "sampling[" + str(i) + "].mask_row " +
                                     std::to_string(row) + " allows no token");
    }
  }
  return Status::Ok();
}

Status check_logprobs(const StepBatch& batch, const StepOutput& out, const ModelConfig& config,
                      const std::string& prefix) {
  std::size_t asking = batch.sampling.size();  // the first chunk that asks, if any
  for (std::size_t i = 0; i < batch.sampling.size(); ++i) {
    const ChunkSampling& s = batch.sampling[i];
    if (s.logprob_rows != LogprobRows::kNone && s.logprob_rows != LogprobRows::kLast &&
        s.logprob_rows != LogprobRows::kAll) {
      return Status::InvalidArgument(prefix + "sampling[" + str(i) + "].logprob_rows " +
                                     str(static_cast<std::uint8_t>(s.logprob_rows)) +
                                     " is not kNone, kLast or kAll");
    }
    if (s.top_logprobs > kMaxTopLogprobs) {
      return Status::InvalidArgument(prefix + "sampling[" + str(i) + "].top_logprobs " +
                                     str(s.top_logprobs) + " is above kMaxTopLogprobs " +
                                     str(kMaxTopLogprobs));
    }
    if (s.last_target < -1 ||
        (s.last_target >= 0 && static_cast<std::uint32_t>(s.last_target) >= config.vocab_size)) {
      return Status::InvalidArgument(
          prefix + "sampling[" + str(i) + "].last_target " + std::to_string(s.last_target) +
          " is neither -1 (the drawn token) nor in the vocabulary of " + str(config.vocab_size));
    }
    if (s.logprob_rows != LogprobRows::kNone && asking == batch.sampling.size()) asking = i;
  }
  if (asking == batch.sampling.size()) return Status::Ok();
  // The last row of a chunk scores its drawn token, which only the sampled output holds.
  const char* missing = out.logprobs == nullptr  ? "logprobs"
                        : out.sampled == nullptr ? "sampled"
                                                 : nullptr;
  if (missing != nullptr) {
    return Status::InvalidArgument(prefix + "sampling[" + str(asking) +
                                   "] asks for log-probabilities but out." + missing + " is null");
  }
  return Status::Ok();
}

}  // namespace kvvm::model::detail
