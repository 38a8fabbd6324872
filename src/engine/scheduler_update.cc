// The step's outputs applied: each chunk's tokens computed, its draw taken or its stop found,
// its log-probabilities kept, its choices forked, its written tokens published.
#include <algorithm>
#include <string>

#include "kvvm/base/log.h"
#include "scheduler.h"
#include "tokenizer/utf8.h"

namespace kvvm::engine {
namespace {

// Generated tokens a sequence gathers before their ids go to the prefix cache.
constexpr std::uint32_t kPublishEvery = 16;

}  // namespace

void Scheduler::update(const StepPlan& plan, const StepOutputs& outputs, Clock::time_point now) {
  if (!outputs.status.ok()) {
    // The step's KV is in an unknown state: its requests end, the others carry on.
    for (const ScheduledChunk& c : plan.chunks) {
      end_request(*c.request, RequestEnd::kError, outputs.status);
    }
    return;
  }
  for (std::size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    const ChunkOutput& out = outputs.chunks[i];
    RequestState& r = *c.request;
    const std::uint32_t start = r.computed;
    r.computed += c.tokens;
    if (out.rows == model::LogprobRows::kAll) {
      // Row j scores token start + j + 1: the prompt's rows up to its last token (a recomputed
      // chunk replaces what an earlier, preempted computation gathered).
      const std::uint32_t prompt_end = std::min(r.computed, r.prompt_size - 1);
      const std::uint32_t prompt_rows = prompt_end > start ? prompt_end - start : 0;
      r.prompt_logprobs.resize(std::min<std::size_t>(r.prompt_logprobs.size(), start));
      r.prompt_logprobs.insert(r.prompt_logprobs.end(), out.logprobs.begin(),
                               out.logprobs.begin() + prompt_rows);
    }
    if (!out.logprobs.empty()) r.token_logprobs.assign(1, out.logprobs.back());  // the draw's
    if (!r.forks.empty() && r.computed >= r.prompt_size) fork_choices(r, now);
    // Prompt chunks publish at once; generated tokens a few at a time, which keeps the
    // cache's lock and key hashing off most decode steps (a window holds several tokens).
    if (c.tokens > 1 || r.computed <= r.cache_known ||
        r.computed - r.cache_known >= kPublishEvery) {
      publish_written(r);
    }
    if (!out.logits.empty()) r.prompt_logits.assign(out.logits.begin(), out.logits.end());
    if (r.missing() != 0) continue;  // a mid-prompt chunk's draw is moot
    if (r.request.max_tokens == 0) {
      end_request(r, RequestEnd::kLength);  // prefill only: the logits are the answer
    } else if (!r.drafts.empty()) {
      i += verify_drafts(r, outputs, i, now);
    } else {
      on_sampled(r, out.sampled, now);
    }
  }
}

void Scheduler::publish_written(RequestState& r) {
  // Generated tokens fed this step become known ids, so their windows can publish too.
  if (r.computed > r.cache_known) {
    const Status extended = kv_.extend(*r.slot, std::span<const std::int32_t>(r.tokens).subspan(
                                                    r.cache_known, r.computed - r.cache_known));
    if (!extended.ok()) {
      log(LogLevel::kWarning, "engine: prefix cache extend: " + extended.to_string());
      return;
    }
    r.cache_known = r.computed;
  }
  // Publishing is an optimisation for later requests, never this one's failure.
  const Status published = kv_.written(*r.slot, r.computed);
  if (!published.ok()) {
    log(LogLevel::kWarning, "engine: prefix cache publish: " + published.to_string());
  }
}

void Scheduler::on_sampled(RequestState& r, std::int32_t token, Clock::time_point now) {
  if (std::find(r.ends.begin(), r.ends.end(), token) != r.ends.end()) {
    if (r.text) r.text->finish(r.text_out);
    end_request(r, RequestEnd::kStop);
    return;
  }
  if (r.constrained() && !r.matcher->accept_token(token)) {
    // Only a grammar that left no token to draw (fill_token_mask's fallback) gets here: what it
    // matched so far is the answer.
    if (r.text) r.text->finish(r.text_out);
    end_request(r, RequestEnd::kStop);
    return;
  }
  touch(r);
  if (!append_output(r, token, now)) return;
  // A grammar's forced run: the tokens the tokenizer makes of the bytes every continuation
  // starts with, taken without a draw (their K / V are computed with the next step's chunk).
  for (const std::int32_t forced : forced_tokens(r)) {
    if (!r.matcher->accept_token(forced)) break;  // forced_tokens checked their bytes
    ++r.stats.forced_tokens;
    if (!append_output(r, forced, now)) return;
  }
}

bool Scheduler::append_output(RequestState& r, std::int32_t token, Clock::time_point now) {
  r.tokens.push_back(token);
  ++r.generated;
  if (r.generated == 1) r.first_token = now;
  r.last_token = now;
  if (r.emit_tokens == 0) r.emit_from = r.tokens.size() - 1;
  ++r.emit_tokens;
  if (r.text && r.text->push(token, r.text_out)) {
    --r.emit_tokens;  // the token that completed a stop string is not emitted
    end_request(r, RequestEnd::kStop);
    return false;
  }
  if (!r.grammar_started) start_grammar(r, token);
  if (r.constrained() && r.matcher->must_end()) {
    // The grammar is complete and allows nothing more: the answer ends here, end token or not.
    if (r.text) r.text->finish(r.text_out);
    end_request(r, RequestEnd::kStop);
    return false;
  }
  if (r.generated >= r.request.max_tokens) {
    const bool stopped = r.text && r.text->finish(r.text_out);
    end_request(r, stopped ? RequestEnd::kStop : RequestEnd::kLength);
    return false;
  }
  return true;
}

void Scheduler::start_grammar(RequestState& r, std::int32_t token) const {
  const tokenizer::Tokenizer* tokenizer = options_.tokenizer;
  if (tokenizer == nullptr) return;  // validate() refuses a trigger without one
  const std::string& trigger = r.request.grammar_trigger;
  r.trigger_tail += tokenizer->token_bytes(token);
  const std::size_t at = r.trigger_tail.find(trigger);
  if (at == std::string::npos) {
    // Only the bytes that could still begin the trigger are kept.
    if (r.trigger_tail.size() >= trigger.size()) {
      r.trigger_tail.erase(0, r.trigger_tail.size() - (trigger.size() - 1));
    }
    return;
  }
  r.grammar_started = true;
  const std::string after = r.trigger_tail.substr(at + trigger.size());
  r.trigger_tail.clear();
  r.trigger_tail.shrink_to_fit();
  // The token that completed the trigger may carry the grammar's first bytes; a grammar that
  // refuses them leaves the rest of the answer free (the parser reads it as text).
  if (!after.empty() && !r.matcher->accept_bytes(after)) r.matcher.reset();
}

std::vector<std::int32_t> Scheduler::forced_tokens(RequestState& r) const {
  const tokenizer::Tokenizer* tokenizer = options_.tokenizer;
  if (!r.constrained() || !options_.jump_forward || tokenizer == nullptr || r.request.logprobs) {
    return {};
  }
  std::string forced = r.matcher->forced_bytes();
  // Whole characters only: the tokenizer reads text.
  forced.resize(tokenizer::detail::utf8_complete_prefix(forced));
  if (forced.empty()) return {};
  std::vector<std::int32_t> ids = tokenizer->encode(forced, false);
  // Exactly as the tokenizer would: the ids must give the bytes back (a tokenizer that adds a
  // prefix space at the start of a text does not), else nothing is forced.
  std::string bytes;
  for (const std::int32_t id : ids) bytes += tokenizer->token_bytes(id);
  if (bytes != forced) return {};
  // The last piece may merge with what the model writes after it, as the tokenizer would merge
  // it: it is left to the draw, unless the run completes the grammar.
  bool completes = false;
  if (r.matcher->accept_bytes(forced)) {
    completes = r.matcher->must_end();
    r.matcher->rollback(1);
  }
  if (!completes) ids.pop_back();
  const std::uint32_t room = r.request.max_tokens - r.generated;
  if (ids.size() > room) ids.resize(room);
  return ids;
}

}  // namespace kvvm::engine
