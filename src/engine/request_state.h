// RequestState: one request inside the engine, from submit to its last event.
//
// Its tokens are the prompt followed by what it generated; `computed` of them have their K/V
// written in its slot. A running sequence whose one missing token is the last it sampled is
// decoding; one missing more is prefilling (a new prompt, or a preempted request recomputing
// its prompt and its own output). The step that writes the last missing token samples the
// next one, with the output index as the sampler's counter, so a recomputed request draws
// the same numbers again.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/grammar/matcher.h"
#include "kvvm/kv/arena.h"
#include "stop_strings.h"

namespace kvvm::engine {

using Clock = std::chrono::steady_clock;

struct RequestState {
  RequestId id = 0;
  std::uint32_t index = 0;  // the choice (EngineRequest::n)
  // The other choices, waiting for this one's prompt to be computed to fork its KV; they end
  // with it if it ends first.
  std::vector<std::unique_ptr<RequestState>> forks;
  EngineRequest request;
  RequestCallback callback;
  std::vector<std::int32_t> ends;    // stop_ids, plus the config's eos ids when asked
  std::vector<std::int32_t> tokens;  // prompt, then every generated token
  std::uint32_t prompt_size = 0;
  std::uint32_t generated = 0;       // tokens generated (the output index of the next)
  std::uint32_t computed = 0;        // tokens whose K/V is in the slot
  std::optional<SlotId> slot;        // while running
  std::uint64_t admission = 0;       // admission number: the highest is the newest
  std::uint32_t cache_known = 0;     // tokens the KV manager knows the ids of
  std::unique_ptr<TextStream> text;  // with a tokenizer
  // With EngineRequest::grammar: where the output is in it (every generated token accepted).
  std::unique_ptr<grammar::Matcher> matcher;
  // With EngineRequest::grammar_trigger: false until the output holds the trigger, and the
  // output's last bytes (fewer than the trigger's) while it is awaited.
  bool grammar_started = true;
  std::string trigger_tail;
  // Whether the grammar masks the next draw.
  bool constrained() const { return matcher != nullptr && grammar_started; }
  bool touched = false;              // has an event this step
  std::vector<float> prompt_logits;  // kept when asked, from the step that ends the prompt
  // Prompt log-probabilities gathered chunk by chunk (row i scores token i + 1), complete once
  // the prompt is; sent with the choice's first event.
  std::vector<model::RowLogprobs> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  // The rows of this step's draws, when asked: the emitted tokens' (emit_tokens of them) first.
  std::vector<model::RowLogprobs> token_logprobs;
  // Speculative decoding: the proposals this step verifies after the last token (rows at the
  // positions that follow it); empty between steps.
  std::vector<std::int32_t> drafts;
  // With a draft model: the sequence's slot in the draft's KV, and the tokens the draft has
  // read into it (the first draft_computed of `tokens`).
  std::optional<SlotId> draft_slot;
  std::uint32_t draft_computed = 0;

  Clock::time_point submitted{};
  double predicted_wait = -1;    // seconds, at submit; negative: none (no rate measured yet)
  Clock::time_point admitted{};  // first admission
  Clock::time_point first_token{};
  Clock::time_point last_token{};
  bool ever_admitted = false;
  RequestStats stats;

  // What this step delivers: the new tokens (emit_tokens of `tokens` from emit_from: the drawn
  // one and a grammar's forced run after it, not a token that completed a stop string), the new
  // text, and the end.
  std::size_t emit_from = 0;
  std::uint32_t emit_tokens = 0;
  std::string text_out;
  bool finished = false;
  RequestEnd end = RequestEnd::kLength;
  Status error;
  double retry_after_seconds = 0;

  std::uint32_t missing() const { return static_cast<std::uint32_t>(tokens.size()) - computed; }
  // Whether the prompt's log-probabilities are still to be computed.
  bool wants_prompt_logprobs() const {
    return request.prompt_logprobs && prompt_logprobs.size() + 1 < prompt_size;
  }
};

// The running sequences, in admission order (the newest last), and the line, first in front.
using RunningSet = std::vector<std::unique_ptr<RequestState>>;
using WaitingQueue = std::deque<std::unique_ptr<RequestState>>;

}  // namespace kvvm::engine
