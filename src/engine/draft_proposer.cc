// DraftProposer: the draft model's KV, its catch-up and proposal forwards, its decode graphs.
#include "draft_proposer.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "engine_options.h"
#include "kvvm/base/log.h"
#include "kvvm/engine/engine.h"
#include "token_mask.h"

namespace kvvm::engine {

Result<std::unique_ptr<DraftProposer>> DraftProposer::create(const DraftModel& draft,
                                                             const model::Model& target,
                                                             std::uint32_t num_speculative_tokens,
                                                             std::uint32_t max_running,
                                                             bool graphs) {
  if (draft.model == nullptr || draft.kv == nullptr) {
    return Status::InvalidArgument(
        "speculative: method draft_model without a draft model and its KV space "
        "(EngineOptions::draft)");
  }
  model::Model& m = *draft.model;
  KvSpace& kv = *draft.kv;
  if (m.backend() != target.backend() || kv.options().backend != m.backend()) {
    return Status::InvalidArgument(
        "draft model: on the " + std::string(model::to_string(m.backend())) +
        " backend with a KV space of the " + std::string(model::to_string(kv.options().backend)) +
        " backend, for a target on the " + std::string(model::to_string(target.backend())) +
        " backend (all three must be one)");
  }
  // Its proposals are the target's inputs and the target's tokens its inputs: one id space.
  if (m.config().vocab_size != target.config().vocab_size) {
    return Status::InvalidArgument(
        "draft model: vocab_size " + std::to_string(m.config().vocab_size) +
        " for a target of vocab_size " + std::to_string(target.config().vocab_size) +
        " (a draft model must share the target's vocabulary)");
  }
  const Geometry& g = kv.arena().plan().geometry;
  const model::ModelConfig& c = m.config();
  if (g.layers != c.layers || g.kv_heads != c.kv_heads || g.head_dim != c.head_dim) {
    return Status::InvalidArgument("draft model: a KV space of " + std::to_string(g.layers) +
                                   " layers x " + std::to_string(g.kv_heads) + " KV heads x " +
                                   std::to_string(g.head_dim) + " for a draft of " +
                                   std::to_string(c.layers) + " x " + std::to_string(c.kv_heads) +
                                   " x " + std::to_string(c.head_dim));
  }
  const std::uint64_t draft_context = request_limits(m, kv).context;
  KvManagerOptions manager_options;
  manager_options.prefix_cache = false;  // the draft's KV is read by its own sequence only
  KVVM_ASSIGN_OR_RETURN(std::unique_ptr<KvManager> manager,
                        KvManager::create(kv, std::move(manager_options)));
  const bool want_graphs = graphs && m.backend() == model::Backend::kCuda;
  const std::uint32_t slots_needed = max_running + (want_graphs ? kPadSlots : 0);
  if (kv.options().max_slots < slots_needed) {
    log(LogLevel::kWarning, "draft model: " + std::to_string(kv.options().max_slots) +
                                " KV slots for " + std::to_string(max_running) +
                                " running sequences: the others decode without proposals");
  }
  std::unique_ptr<DraftProposer> proposer(
      new DraftProposer(m, std::move(manager), num_speculative_tokens, draft_context));
  if (want_graphs && proposer->kv_->reserve_pad_slot().ok()) {
    std::vector<std::uint32_t> buckets = default_buckets(
        std::min<std::uint32_t>(std::max<std::uint32_t>(max_running, 1), m.limits().max_chunks));
    Status captured;
    {
      auto guard = kv.arena().begin_capture();
      captured = m.capture_decode_graphs(model::DecodeGraphOptions{
          .batch_sizes = std::move(buckets),
          .kv = kv.view(),
          .pad_slot = *proposer->kv_->pad_slot(),
          .max_length = static_cast<std::uint32_t>(
              std::min<std::uint64_t>(draft_context, std::numeric_limits<std::uint32_t>::max()))});
    }
    if (captured.ok()) {
      proposer->graphs_captured_ = true;
    } else {
      log(LogLevel::kWarning, "draft model: decode graphs not captured, its steps run eagerly: " +
                                  captured.to_string());
      proposer->kv_->release_pad_slot();
    }
  }
  return proposer;
}

DraftProposer::DraftProposer(model::Model& model, std::unique_ptr<KvManager> kv, std::uint32_t k,
                             std::uint64_t context)
    : model_(model), kv_(std::move(kv)), k_(k), context_(context) {
  const model::ModelLimits& limits = model.limits();
  ids_.reserve(limits.max_step_tokens);
  chunks_.reserve(limits.max_chunks);
  drawn_.resize(limits.max_chunks);
  members_.reserve(limits.max_chunks);
}

DraftProposer::~DraftProposer() {
  if (graphs_captured_) model_.release_decode_graphs();
  for (const SlotId slot : unreleased_) kv_->release(slot).ignore();
  kv_->release_pad_slot();
}

bool DraftProposer::hold(RequestState& r, std::uint64_t tokens) {
  if (!r.draft_slot) {
    Result<KvAdmission> admitted =
        kv_->admit(std::span<const std::int32_t>(r.tokens), 0, /*reuse=*/false);
    if (!admitted.ok()) return false;
    r.draft_slot = admitted->slot;
    r.draft_computed = 0;
  }
  return kv_->ensure(*r.draft_slot, tokens).ok();
}

bool DraftProposer::forward(std::span<RequestState* const> requests) {
  const std::uint64_t replays = model_.graph_stats().replays;
  // Greedy draws; a constrained sequence's proposal drawn through its grammar's mask as it
  // stands after the proposals before it (the matcher is advanced as they are made).
  sampling_.assign(chunks_.size(), model::ChunkSampling{});
  const std::size_t words = model::token_mask_words(model_.config().vocab_size);
  std::size_t rows = 0;
  for (std::size_t m = 0; m < chunks_.size(); ++m) {
    RequestState& r = *requests[members_[m]];
    if (!r.constrained() || !masked_[m]) continue;
    if (masks_.size() < (rows + 1) * words) masks_.resize((rows + 1) * words);
    fill_token_mask(r, std::span<std::uint32_t>(masks_).subspan(rows * words, words));
    sampling_[m].mask_row = static_cast<std::int32_t>(rows++);
  }
  model::StepBatch batch;
  batch.token_ids = ids_;
  batch.chunks = chunks_;
  batch.kv = kv_->space().view();
  batch.sampling = sampling_;
  batch.token_masks = std::span<const std::uint32_t>(masks_.data(), rows * words);
  model::StepOutput out;
  out.sampled = drawn_.data();
  const Status ran = model_.forward(batch, out);
  ++stats_.steps;
  stats_.graph_steps += model_.graph_stats().replays - replays;
  if (ran.ok()) return true;
  ++stats_.failed;
  if (!warned_) {
    warned_ = true;
    log(LogLevel::kWarning,
        "draft model: a step failed, its sequences decode without proposals: " + ran.to_string());
  }
  return false;
}

std::span<const std::uint32_t> DraftProposer::propose(std::span<RequestState* const> requests) {
  std::erase_if(unreleased_, [&](SlotId slot) {
    const Status released = kv_->release(slot);
    return released.ok() || released.code() == StatusCode::kFailedPrecondition;
  });
  filled_.assign(requests.size(), 0);
  want_.assign(requests.size(), 0);
  taken_.assign(requests.size(), 0);
  const model::ModelLimits& limits = model_.limits();
  // Catch-up: every sequence's unread tokens in one forward, within the draft's step; one cut
  // short reads what fits and proposes from a later step.
  ids_.clear();
  chunks_.clear();
  members_.clear();
  std::uint32_t budget = limits.max_step_tokens;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    RequestState& r = *requests[i];
    if (r.drafts.empty()) continue;
    if (budget == 0 || chunks_.size() == limits.max_chunks) break;
    const std::uint32_t total = static_cast<std::uint32_t>(r.tokens.size());
    // The draft reads the sequence and then its own proposals but the last, each within its
    // context: a sequence near the end of it gets fewer proposals, one past it none.
    if (total > context_) continue;
    want_[i] =
        static_cast<std::uint32_t>(std::min<std::uint64_t>(r.drafts.size(), context_ - total + 1));
    const std::uint32_t have = r.draft_slot ? std::min(r.draft_computed, total - 1) : 0;
    const std::uint32_t read = std::min(total - have, budget);
    const bool whole = have + read == total;
    const std::uint64_t through = whole ? std::uint64_t{total} + want_[i] - 1 : have + read;
    if (!hold(r, through)) {
      ++stats_.refused;
      continue;
    }
    chunks_.push_back(model::Chunk{.slot = *r.draft_slot, .start = have, .tokens = read});
    ids_.insert(ids_.end(), r.tokens.begin() + have, r.tokens.begin() + have + read);
    members_.push_back(i);
    budget -= read;
  }
  if (chunks_.empty()) return filled_;
  masked_.assign(chunks_.size(), false);
  for (std::size_t m = 0; m < chunks_.size(); ++m) {
    masked_[m] = chunks_[m].start + chunks_[m].tokens == requests[members_[m]]->tokens.size();
  }
  if (!forward(requests)) return filled_;
  for (std::size_t m = 0; m < members_.size(); ++m) {
    RequestState& r = *requests[members_[m]];
    r.draft_computed = chunks_[m].start + chunks_[m].tokens;
    stats_.caught_up += chunks_[m].tokens;
    if (r.draft_computed < r.tokens.size()) continue;
    take(r, members_[m], drawn_[m], 0);
  }
  // Each further proposal: the one before it read, one row per sequence still proposing.
  for (std::uint32_t j = 1; j < k_; ++j) {
    ids_.clear();
    chunks_.clear();
    members_.clear();
    for (std::size_t i = 0; i < requests.size(); ++i) {
      RequestState& r = *requests[i];
      if (filled_[i] != j || want_[i] <= j) continue;
      const auto position = static_cast<std::uint32_t>(r.tokens.size()) + j - 1;
      chunks_.push_back(model::Chunk{.slot = *r.draft_slot, .start = position, .tokens = 1});
      ids_.push_back(r.drafts[j - 1]);
      members_.push_back(i);
    }
    if (chunks_.empty()) break;
    masked_.assign(chunks_.size(), true);
    if (!forward(requests)) break;
    for (std::size_t m = 0; m < members_.size(); ++m) {
      RequestState& r = *requests[members_[m]];
      r.draft_computed = chunks_[m].start + 1;
      take(r, members_[m], drawn_[m], j);
    }
  }
  // The grammars as they were: the scheduler applies the draws, not the proposals.
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (taken_[i] > 0) requests[i]->matcher->rollback(taken_[i]);
  }
  return filled_;
}

void DraftProposer::take(RequestState& r, std::size_t i, std::int32_t token, std::uint32_t j) {
  if (r.constrained()) {
    // An end proposes nothing after it (the answer would end there); a token the grammar
    // refuses cannot come from a masked draw but ends the proposals all the same.
    if (std::find(r.ends.begin(), r.ends.end(), token) != r.ends.end() ||
        !r.matcher->accept_token(token)) {
      want_[i] = j;
      return;
    }
    ++taken_[i];
    if (r.matcher->must_end()) want_[i] = j + 1;
  }
  r.drafts[j] = token;
  filled_[i] = j + 1;
}

void DraftProposer::release(RequestState& r, bool driver_usable) {
  if (!r.draft_slot) return;
  if (driver_usable) {
    const Status released = kv_->release(*r.draft_slot);
    // A failed release changed nothing: tried again before the next proposals, so the slot and
    // its bytes are not lost to later sequences.
    if (!released.ok()) {
      log(LogLevel::kWarning, "draft model: releasing slot " + std::to_string(*r.draft_slot) +
                                  ": " + released.to_string());
      unreleased_.push_back(*r.draft_slot);
    }
  }
  r.draft_slot.reset();
  r.draft_computed = 0;
}

}  // namespace kvvm::engine
