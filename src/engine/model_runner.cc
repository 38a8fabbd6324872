#include "model_runner.h"

#include <chrono>
#include <string>

#include "logit_transforms.h"
#include "token_mask.h"

namespace kvvm::engine {
namespace {

// Whether the chunk of `r` ending at token `end` is the one whose logits it keeps: the end of
// its prompt, before any output (a recomputation after preemption keeps the first).
bool wants_prompt_logits(const RequestState& r, std::uint32_t end) {
  return r.request.keep_prompt_logits && r.generated == 0 && r.prompt_logits.empty() &&
         end == r.prompt_size;
}

// Which rows of the chunk [start, end) of `r` have their log-probabilities computed: every row
// while the prompt's are wanted; the last when its draw is a new token and the request asks.
model::LogprobRows logprob_rows(const RequestState& r, std::uint32_t end) {
  if (r.wants_prompt_logprobs()) return model::LogprobRows::kAll;
  if (r.request.logprobs && end == r.tokens.size()) return model::LogprobRows::kLast;
  return model::LogprobRows::kNone;
}

std::size_t rows_of(model::LogprobRows rows, std::uint32_t tokens) {
  switch (rows) {
    case model::LogprobRows::kNone:
      return 0;
    case model::LogprobRows::kLast:
      return 1;
    case model::LogprobRows::kAll:
      return tokens;
  }
  return 0;
}

}  // namespace

void ModelRunner::add_draft_row(const ScheduledChunk& c, std::size_t& logprob_rows_wanted) {
  RequestState& r = *c.request;
  const std::int32_t proposal = r.drafts[c.draft - 1];
  ids_.push_back(proposal);
  chunks_.push_back(model::Chunk{.slot = *r.slot, .start = c.start, .tokens = 1});
  // The draw after j proposals: the output counter it would have without speculation.
  model::ChunkSampling sampling{.params = r.request.sampling, .counter = r.generated + c.draft};
  if (r.request.logprobs) {
    sampling.logprob_rows = model::LogprobRows::kLast;
    sampling.top_logprobs = *r.request.logprobs;
    ++logprob_rows_wanted;
  }
  if (has_logit_transforms(r)) {
    // Built from the tokens as they would stand at that draw: the proposals before it taken.
    const std::size_t size = r.tokens.size();
    const std::uint32_t generated = r.generated;
    r.tokens.insert(r.tokens.end(), r.drafts.begin(), r.drafts.begin() + c.draft);
    r.generated += c.draft;
    sampling.adjust_begin = static_cast<std::uint32_t>(adjustments_.size());
    append_logit_transforms(r, adjustments_, adjust_scratch_);
    sampling.adjust_count = static_cast<std::uint32_t>(adjustments_.size()) - sampling.adjust_begin;
    r.tokens.resize(size);
    r.generated = generated;
  }
  if (r.constrained()) {
    // The grammar as it stands after the proposals before this row (the scheduler checked it
    // accepts them), then back.
    const auto before = std::span<const std::int32_t>(r.drafts).first(c.draft);
    std::uint32_t accepted = 0;
    for (const std::int32_t token : before) {
      if (!r.matcher->accept_token(token)) break;
      ++accepted;
    }
    add_mask(r, sampling);
    r.matcher->rollback(accepted);
  }
  sampling_.push_back(sampling);
}

void ModelRunner::add_mask(RequestState& r, model::ChunkSampling& sampling) {
  const std::size_t mask_words = model::token_mask_words(model_.config().vocab_size);
  if (masks_.size() < (mask_rows_ + 1) * mask_words) masks_.resize((mask_rows_ + 1) * mask_words);
  const auto began = std::chrono::steady_clock::now();
  fill_token_mask(r, std::span<std::uint32_t>(masks_).subspan(mask_rows_ * mask_words, mask_words));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  ++grammar_stats_.masks;
  grammar_stats_.mask_seconds += seconds;
  std::size_t bucket = 0;
  while (bucket < kMaskSecondsBounds.size() && seconds > kMaskSecondsBounds[bucket]) ++bucket;
  ++grammar_stats_.mask_buckets[bucket];
  sampling.mask_row = static_cast<std::int32_t>(mask_rows_++);
}

void ModelRunner::add_grammar_stats(GrammarStats& stats) {
  stats.masks += grammar_stats_.masks;
  stats.mask_seconds += grammar_stats_.mask_seconds;
  for (std::size_t i = 0; i < stats.mask_buckets.size(); ++i) {
    stats.mask_buckets[i] += grammar_stats_.mask_buckets[i];
  }
  grammar_stats_ = {};
}

ModelRunner::ModelRunner(model::Model& model, std::uint32_t step_tokens) : model_(model) {
  const std::size_t chunks = model.limits().max_chunks;
  chunks_.reserve(chunks);
  sampling_.reserve(chunks);
  sampled_.resize(chunks);
  outputs_.chunks.reserve(chunks);
  ids_.reserve(step_tokens);
}

const StepOutputs& ModelRunner::execute(const StepPlan& plan, const KvView& kv) {
  const auto step_began = std::chrono::steady_clock::now();
  ids_.clear();
  chunks_.clear();
  sampling_.clear();
  adjustments_.clear();
  const std::size_t mask_words = model::token_mask_words(model_.config().vocab_size);
  mask_rows_ = 0;
  bool want_logits = false;
  std::size_t logprob_rows_wanted = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    if (c.draft > 0) {
      add_draft_row(c, logprob_rows_wanted);
      continue;
    }
    const RequestState& r = *c.request;
    const std::uint32_t end = c.start + c.tokens;
    ids_.insert(ids_.end(), r.tokens.begin() + c.start, r.tokens.begin() + end);
    chunks_.push_back(model::Chunk{.slot = *r.slot, .start = c.start, .tokens = c.tokens});
    model::ChunkSampling sampling{.params = r.request.sampling, .counter = r.generated};
    sampling.logprob_rows = logprob_rows(r, end);
    if (sampling.logprob_rows != model::LogprobRows::kNone) {
      sampling.top_logprobs = r.request.logprobs.value_or(0);
      // Mid-prompt, the last row scores the next prompt token, not the (moot) draw.
      if (end < r.tokens.size()) sampling.last_target = r.tokens[end];
      logprob_rows_wanted += rows_of(sampling.logprob_rows, c.tokens);
    }
    if (end == r.tokens.size() && has_logit_transforms(r)) {
      sampling.adjust_begin = static_cast<std::uint32_t>(adjustments_.size());
      append_logit_transforms(r, adjustments_, adjust_scratch_);
      sampling.adjust_count =
          static_cast<std::uint32_t>(adjustments_.size()) - sampling.adjust_begin;
    }
    if (end == r.tokens.size() && r.constrained()) add_mask(*c.request, sampling);
    sampling_.push_back(sampling);
    want_logits = want_logits || wants_prompt_logits(r, end);
  }
  const model::StepBatch batch{
      .token_ids = ids_,
      .chunks = chunks_,
      .kv = kv,
      .sampling = sampling_,
      .adjustments = adjustments_,
      .token_masks = std::span<const std::uint32_t>(masks_.data(), mask_rows_ * mask_words)};
  model::StepOutput out;
  out.sampled = sampled_.data();
  const std::size_t vocab = model_.config().vocab_size;
  if (want_logits) {
    logits_.resize(chunks_.size() * vocab);
    out.logits = logits_.data();
  }
  if (logprob_rows_wanted > 0) {
    if (logprob_rows_.size() < logprob_rows_wanted) logprob_rows_.resize(logprob_rows_wanted);
    out.logprobs = logprob_rows_.data();
  }
  const auto forward_began = std::chrono::steady_clock::now();
  outputs_.status = model_.forward(batch, out);
  const auto forward_ended = std::chrono::steady_clock::now();
  prepare_seconds_ = std::chrono::duration<double>(forward_began - step_began).count();
  forward_seconds_ = std::chrono::duration<double>(forward_ended - forward_began).count();
  if (!outputs_.status.ok()) {
    outputs_.status =
        outputs_.status.with_context("model step of " + std::to_string(chunks_.size()) +
                                     " chunks, " + std::to_string(ids_.size()) + " tokens");
  }
  outputs_.chunks.clear();
  if (!outputs_.status.ok()) return outputs_;
  std::size_t row = 0;  // the chunk's first log-probability row
  for (std::size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    ChunkOutput chunk;
    chunk.sampled = sampled_[i];
    chunk.rows = sampling_[i].logprob_rows;
    const std::size_t rows = rows_of(chunk.rows, c.tokens);
    chunk.logprobs = std::span<const model::RowLogprobs>(logprob_rows_.data() + row, rows);
    row += rows;
    if (want_logits && wants_prompt_logits(*c.request, c.start + c.tokens)) {
      chunk.logits = std::span<const float>(logits_.data() + i * vocab, vocab);
    }
    outputs_.chunks.push_back(chunk);
  }
  return outputs_;
}

}  // namespace kvvm::engine
