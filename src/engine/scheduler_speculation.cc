// Speculative decoding in the scheduler: proposals planned as rows after a sequence's decode
// chunk, their K / V committed softly, and the draws applied one token at a time
// (EngineOptions::speculative, kvvm/engine/engine.h).
#include <algorithm>
#include <array>

#include "logit_transforms.h"
#include "ngram_proposer.h"
#include "scheduler.h"

namespace kvvm::engine {

std::size_t Scheduler::grammar_prefix(RequestState& r,
                                      std::span<const std::int32_t> proposals) const {
  if (!r.constrained()) return proposals.size();
  // Each row's mask is the grammar's after the proposals before it, so a proposal the grammar
  // refuses (or an end, after which nothing is drawn) ends the rows; the matcher is left as
  // it was.
  grammar::Matcher& m = *r.matcher;
  std::uint32_t kept = 0;
  for (const std::int32_t token : proposals) {
    if (std::find(r.ends.begin(), r.ends.end(), token) != r.ends.end()) break;
    if (!m.accept_token(token)) break;
    ++kept;
    if (m.must_end()) break;
  }
  m.rollback(kept);
  return kept;
}

bool Scheduler::speculates_this_step() const {
  const SpeculativeOptions& s = options_.speculative;
  if (!s.enabled()) return false;
  if (s.disable_by_batch_size == 0) return true;
  std::uint32_t decoding = 0;
  for (const auto& r : running_) {
    if (!r->finished && r->missing() == 1 && ++decoding >= s.disable_by_batch_size) return false;
  }
  return true;
}

void Scheduler::plan_drafts(StepPlan& plan, Room& room, RequestState& r) {
  r.drafts.clear();
  // A grammar still waiting for its trigger starts masking at a draw no row before it knew of;
  // such requests decode a token a step until it starts.
  if (!r.request.speculate || (r.matcher != nullptr && !r.grammar_started)) return;
  const SpeculativeOptions& s = options_.speculative;
  // The step's last token is always drawn, so proposals stop one short of max_tokens.
  const std::uint32_t left = r.request.max_tokens - r.generated;
  std::uint32_t most = std::min({s.num_speculative_tokens, left > 0 ? left - 1 : 0, room.tokens});
  most = std::min<std::uint32_t>(
      most, model_.limits().max_chunks - static_cast<std::uint32_t>(plan.chunks.size()));
  if (most == 0) return;
  // A draft model's proposals come after the rows are committed (propose_with_draft): its
  // rows are planned as many as allowed, each a placeholder until then.
  std::array<std::int32_t, kNgramMaxSpeculativeTokens> proposed{};
  std::size_t n = most;
  if (s.method == SpeculativeMethod::kNgram) {
    const NgramOptions ngram{.num_speculative_tokens = s.num_speculative_tokens,
                             .prompt_lookup_min = s.prompt_lookup_min,
                             .prompt_lookup_max = s.prompt_lookup_max};
    n = propose_ngram(r.tokens, ngram, std::span<std::int32_t>(proposed).first(most));
    n = grammar_prefix(r, std::span<const std::int32_t>(proposed).first(n));
  }
  // Row j draws after j proposals: its transforms may count up to j more output tokens.
  const std::size_t bound =
      has_logit_transforms(r) ? logit_transform_bound(r, model_.config().vocab_size) : 0;
  for (std::uint32_t j = 1; j <= n; ++j) {
    if (bound > 0) {
      const std::size_t row_bound = std::min<std::size_t>(bound + j, model_.config().vocab_size);
      if (row_bound > room.transforms) break;
      room.transforms -= row_bound;
    }
    r.drafts.push_back(proposed[j - 1]);
    plan.chunks.push_back(
        ScheduledChunk{.request = &r, .start = r.computed + j, .tokens = 1, .draft = j});
    --room.tokens;
  }
}

void Scheduler::commit_draft(StepPlan& plan, ScheduledChunk& row) {
  RequestState& r = *row.request;
  if (r.finished || !r.slot) {
    row.request = nullptr;
    r.drafts.clear();
    return;
  }
  if (kv_.ensure(*r.slot, std::uint64_t{row.start} + 1).ok()) return;
  // Its rows are adjacent and ascending: this one and every later one go.
  const std::uint32_t cut = row.draft;
  for (ScheduledChunk& c : plan.chunks) {
    if (c.request == &r && c.draft >= cut) c.request = nullptr;
  }
  r.drafts.resize(cut - 1);
}

std::size_t Scheduler::verify_drafts(RequestState& r, const StepOutputs& outputs, std::size_t first,
                                     Clock::time_point now) {
  const std::size_t n = r.drafts.size();
  ++counters_.spec_drafts;
  counters_.spec_draft_tokens += n;
  r.token_logprobs.clear();
  for (std::size_t j = 0; j <= n; ++j) {
    const ChunkOutput& out = outputs.chunks[first + j];
    if (j > 0) {
      // The row's K / V holds the proposal now kept: the sequence has computed it.
      ++r.computed;
      ++counters_.spec_accepted_tokens;
    }
    if (!out.logprobs.empty()) r.token_logprobs.push_back(out.logprobs.back());
    const bool agrees = j < n && out.sampled == r.drafts[j];
    const std::size_t before = r.tokens.size();
    on_sampled(r, out.sampled, now);
    // A grammar's forced run after the draw moved the sequence past where the next row sits.
    if (r.finished || !agrees || r.tokens.size() != before + 1) break;
  }
  // The kept proposals' ids reach the prefix cache with the next decode chunk's publish.
  r.drafts.clear();
  // The draft read its proposals but the last; what the target did not keep it reads again.
  r.draft_computed = std::min(r.draft_computed, r.computed);
  return n;
}

void Scheduler::propose_with_draft(StepPlan& plan) {
  drafting_.clear();
  for (const ScheduledChunk& c : plan.chunks) {
    if (c.draft == 1 && c.request != nullptr && !c.request->finished) {
      drafting_.push_back(c.request);
    }
  }
  if (drafting_.empty()) return;
  const std::span<const std::uint32_t> filled = draft_->propose(drafting_);
  const DraftProposer::Stats stats = draft_->stats();
  counters_.spec_draft_steps = stats.steps;
  counters_.spec_draft_refused = stats.refused;
  counters_.spec_draft_failed = stats.failed;
  bool cut = false;
  for (std::size_t i = 0; i < drafting_.size(); ++i) {
    RequestState& r = *drafting_[i];
    // Checked as lookup's are: the draft's masked draws pass, and the rule a row's mask relies
    // on stays in one place.
    const std::size_t kept =
        grammar_prefix(r, std::span<const std::int32_t>(r.drafts).first(filled[i]));
    if (kept == r.drafts.size()) continue;
    r.drafts.resize(kept);
    cut = true;
  }
  if (!cut) return;
  // The rows past what their sequence was given go; the KV committed for them stays with it.
  std::erase_if(plan.chunks, [](const ScheduledChunk& c) {
    return c.draft > 0 && c.request != nullptr && c.draft > c.request->drafts.size();
  });
}

}  // namespace kvvm::engine
