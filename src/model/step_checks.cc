// The backend-independent step checks (step_checks.h).
#include "model/step_checks.h"

#include <cstdint>
#include <string>

namespace kvvm::model::detail {
namespace {

std::string str(std::uint64_t value) { return std::to_string(value); }

}  // namespace

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
  return Status::Ok();
}

}  // namespace kvvm::model::detail
