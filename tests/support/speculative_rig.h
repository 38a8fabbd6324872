// What the speculative-decoding tests share: requests that prompt lookup proposes for, a run of
// several requests through one engine (speculating or not, with a draft model or not) keeping
// each answer's tokens and log-probabilities, and the check that two runs answered alike.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvvm/engine/engine.h"
#include "support/engine_harness.h"

namespace kvvm::engine::testing {

// A prompt that repeats itself, so prompt lookup proposes from the first steps: a random stem
// three times over, then its first two tokens again.
inline std::vector<std::int32_t> repeating_prompt(std::uint64_t seed, std::size_t stem = 7,
                                                  std::int32_t vocab = 600) {
  const std::vector<std::int32_t> once = rig_prompt(stem, seed, vocab);
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 3; ++i) prompt.insert(prompt.end(), once.begin(), once.end());
  prompt.insert(prompt.end(), once.begin(), once.begin() + 2);
  return prompt;
}

inline SpeculativeOptions lookup(std::uint32_t k) {
  SpeculativeOptions s;
  s.num_speculative_tokens = k;
  s.prompt_lookup_min = 1;
  s.prompt_lookup_max = 3;
  return s;
}

// Speculation by a draft model (EngineOptions::draft) proposing k tokens a step.
inline SpeculativeOptions by_draft(std::uint32_t k) {
  SpeculativeOptions s;
  s.method = SpeculativeMethod::kDraftModel;
  s.num_speculative_tokens = k;
  return s;
}

inline EngineRequest request_of(std::vector<std::int32_t> prompt, std::uint32_t max_tokens) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.use_model_eos = false;
  return r;
}

// What one request gave (its first choice), with its log-probabilities when asked; the tokens
// of its other choices (EngineRequest::n), each in order.
struct Answer {
  std::vector<std::int32_t> tokens;
  std::vector<model::RowLogprobs> logprobs;
  RequestEnd end = RequestEnd::kError;
  int finished = 0;
  std::vector<std::vector<std::int32_t>> other_choices;
};

struct SpecRun {
  std::vector<Answer> answers;
  EngineStats stats;
};

// The requests submitted together to one engine (speculating with `spec`) over `fixture`.
// A draft model for run_all: its KV space's options, on the target space's driver and under its
// governor unless `space` names others; unset max_slots / max_context: the target's, the
// context 64 tokens longer (the proposals are written past a full sequence).
struct DraftSetup {
  model::Model* model = nullptr;
  KvSpaceOptions space;
};
inline DraftSetup draft_of(model::Model& model, const KvSpaceOptions& space = {}) {
  DraftSetup setup;
  setup.model = &model;
  setup.space = space;
  return setup;
}

// With draft.model, the engine speculates with it (options.draft); both spaces are checked
// clean after the engine goes. `tokenizer`: EngineOptions::tokenizer (a grammar's forced runs).
inline SpecRun run_all(FixtureModel& fixture, const std::vector<EngineRequest>& requests,
                       SpeculativeOptions spec, KvSpaceOptions space = {},
                       const DraftSetup& draft = {},
                       const tokenizer::Tokenizer* tokenizer = nullptr) {
  if (space.max_slots == 0) {
    space.max_slots = 5;
    space.max_context = 128;
  }
  EngineOptions options;
  options.speculative = spec;
  options.tokenizer = tokenizer;
  SpecRun run;
  auto kv = make_kv(fixture.config, space);
  if (kv == nullptr) return run;
  std::unique_ptr<KvSpace> draft_kv;  // after kv: it goes first
  if (draft.model != nullptr) {
    KvSpaceOptions d = draft.space;
    if (d.max_slots == 0 || d.max_context == 0) {
      d.max_slots = kv->options().max_slots;
      d.max_context = kv->options().max_context + 64;
    }
    if (d.driver == nullptr) d.driver = &kv->driver();
    if (d.governor == nullptr) d.governor = &kv->governor();
    draft_kv = make_kv(draft.model->config(), d);
    if (draft_kv == nullptr) return run;
    options.draft = DraftModel{.model = draft.model, .kv = draft_kv.get()};
  }
  auto made = Engine::create(*fixture.model, *kv, options);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  if (!made.ok()) return run;
  Engine& engine = **made;
  run.answers.resize(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    Answer* a = &run.answers[i];
    a->other_choices.resize(requests[i].n > 0 ? requests[i].n - 1 : 0);
    auto id = engine.submit(requests[i], [a](const RequestEvent& event) {
      if (event.index > 0) {
        std::vector<std::int32_t>& other = a->other_choices.at(event.index - 1);
        other.insert(other.end(), event.tokens.begin(), event.tokens.end());
        return;
      }
      a->tokens.insert(a->tokens.end(), event.tokens.begin(), event.tokens.end());
      a->logprobs.insert(a->logprobs.end(), event.logprobs.begin(), event.logprobs.end());
      if (event.finished) {
        ++a->finished;
        a->end = event.end;
      }
    });
    EXPECT_TRUE(id.ok()) << id.status().to_string();
  }
  const Status ran = engine.run_until_idle();
  EXPECT_TRUE(ran.ok()) << ran.to_string();
  run.stats = engine.stats();
  made->reset();
  expect_clean(*kv, "after the speculative run");
  if (draft_kv != nullptr) expect_clean(*draft_kv, "the draft's KV after the speculative run");
  return run;
}

inline void expect_same_answers(const SpecRun& plain, const SpecRun& spec,
                                const std::string& where) {
  ASSERT_EQ(plain.answers.size(), spec.answers.size());
  for (std::size_t i = 0; i < plain.answers.size(); ++i) {
    const Answer& p = plain.answers[i];
    const Answer& s = spec.answers[i];
    const std::string which = where + ", request " + std::to_string(i);
    EXPECT_EQ(s.finished, 1) << which;
    EXPECT_EQ(s.end, p.end) << which;
    EXPECT_EQ(s.tokens, p.tokens) << which;
    EXPECT_EQ(s.other_choices, p.other_choices) << which;
    ASSERT_EQ(s.logprobs.size(), p.logprobs.size()) << which;
    for (std::size_t t = 0; t < p.logprobs.size(); ++t) {
      // A row computed in a step of another shape sums in another order: equal to rounding.
      EXPECT_NEAR(s.logprobs[t].logprob, p.logprobs[t].logprob, 1e-4) << which << ", token " << t;
      ASSERT_EQ(s.logprobs[t].top, p.logprobs[t].top) << which << ", token " << t;
      for (std::uint32_t a = 0; a < p.logprobs[t].top; ++a) {
        EXPECT_NEAR(s.logprobs[t].top_logprobs[a], p.logprobs[t].top_logprobs[a], 1e-4)
            << which << ", token " << t << ", alternative " << a;
      }
    }
  }
}

}  // namespace kvvm::engine::testing
