// Speculative decoding with a draft model through the engine: a smaller checkpoint of the same
// vocabulary proposes its greedy next tokens, on a KV space of its own under the target's
// governor, and the target verifies them as extra rows. Which tokens come out never depends on
// the draft: on every pair of fixtures that share a vocabulary, greedy or sampled, under
// preemption, with the draft's KV refused or failing, a draft forward failing, or a prompt the
// draft reads over several steps, the answers are token for token plain decoding's.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/host_driver.h"
#include "support/engine_harness.h"
#include "support/failing_model.h"
#include "support/speculative_rig.h"

namespace kvvm::engine {
namespace {

using testing::by_draft;
using testing::draft_of;
using testing::expect_same_answers;
using testing::FixtureModel;
using testing::request_of;
using testing::rig_prompt;
using testing::run_all;
using testing::SpecRun;

// Prompts of no repetition (prompt lookup would propose nothing): the draft's proposals are
// all there is.
std::vector<EngineRequest> plain_prompts(std::uint32_t max_tokens, std::int32_t vocab,
                                         std::uint64_t count = 4) {
  std::vector<EngineRequest> requests;
  for (std::uint64_t i = 0; i < count; ++i) {
    requests.push_back(request_of(rig_prompt(6 + 3 * i, 40 + i, vocab), max_tokens));
  }
  return requests;
}

struct Pair {
  const char* target;
  const char* draft;
};

class DraftModelPairs : public ::testing::TestWithParam<Pair> {};

TEST_P(DraftModelPairs, GreedyOutputIsPlainDecodings) {
  const Pair pair = GetParam();
  auto target = testing::load_fixture(pair.target);
  auto draft = testing::load_fixture(pair.draft);
  ASSERT_NE(target, nullptr);
  ASSERT_NE(draft, nullptr);
  const auto vocab = static_cast<std::int32_t>(target->config.vocab_size);
  const std::vector<EngineRequest> requests = plain_prompts(40, vocab);
  const SpecRun plain = run_all(*target, requests, {});
  const SpecRun spec = run_all(*target, requests, by_draft(4), {}, draft_of(*draft->model));
  const std::string where = std::string(pair.target) + " drafted by " + pair.draft;
  expect_same_answers(plain, spec, where);
  EXPECT_GT(spec.stats.spec_draft_tokens, 0u) << where << ": nothing was proposed";
  EXPECT_GT(spec.stats.spec_draft_steps, 0u) << where;
  EXPECT_EQ(spec.stats.spec_draft_refused, 0u) << where;
  EXPECT_EQ(spec.stats.spec_draft_failed, 0u) << where;
  EXPECT_LE(spec.stats.spec_accepted_tokens, spec.stats.spec_draft_tokens) << where;
  if (std::string(pair.target) == pair.draft) {
    // The target as its own draft: its greedy tokens are proposed, and kept (up to a near-tie
    // that a step of another shape rounds the other way).
    EXPECT_GE(spec.stats.spec_accepted_tokens * 10, spec.stats.spec_draft_tokens * 9) << where;
    EXPECT_LT(spec.stats.steps * 2, plain.stats.steps) << where;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, DraftModelPairs,
    ::testing::Values(Pair{"llama-tiny", "llama-tiny"}, Pair{"llama-tiny", "mixtral-tiny"},
                      Pair{"mixtral-tiny", "llama-tiny"}, Pair{"qwen3-moe-tiny", "qwen3-tiny"},
                      Pair{"qwen2-moe-tiny", "qwen2-tiny"}),
    [](const auto& param) {
      std::string name = std::string(param.param.target) + "_by_" + param.param.draft;
      std::erase(name, '-');
      return name;
    });

TEST(DraftModel, SampledOutputWithTransformsAndLogprobsIsPlainDecodings) {
  FixtureModel& target = testing::llama();
  auto draft = testing::load_fixture("llama-tiny");
  ASSERT_NE(draft, nullptr);
  std::vector<EngineRequest> requests = plain_prompts(32, 1024);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    EngineRequest& r = requests[i];
    r.sampling.temperature = 0.6f + 0.2f * static_cast<float>(i);
    r.sampling.seed = 9 + i;
    r.sampling.top_p = 0.9f;
    r.logprobs = 2;
  }
  requests[1].sampling.frequency_penalty = 0.4f;
  requests[2].sampling.repetition_penalty = 1.3f;
  requests[3].min_tokens = 16;
  requests[3].stop_ids = {requests[3].prompt[0]};
  const SpecRun plain = run_all(target, requests, {});
  const SpecRun spec = run_all(target, requests, by_draft(3), {}, draft_of(*draft->model));
  expect_same_answers(plain, spec, "sampled");
  EXPECT_GT(spec.stats.spec_draft_tokens, 0u);
  // A greedy proposal is kept where the draw agrees with it: at these temperatures, sometimes.
  EXPECT_GT(spec.stats.spec_accepted_tokens, 0u);
}

TEST(DraftModel, PreemptedSequencesRecomputeToPlainDecodingsTokens) {
  auto target = testing::load_fixture("llama-tiny", testing::kSmallStepLimits);
  auto draft = testing::load_fixture("llama-tiny", testing::kSmallStepLimits);
  ASSERT_NE(target, nullptr);
  ASSERT_NE(draft, nullptr);
  KvSpaceOptions space = testing::small_space_options();
  space.budget_bytes = 12 * space.host_granule;
  const std::vector<EngineRequest> requests = plain_prompts(30, 1024);
  const SpecRun plain = run_all(*target, requests, {}, space);
  const SpecRun spec = run_all(*target, requests, by_draft(4), space, draft_of(*draft->model));
  expect_same_answers(plain, spec, "preemption");
  EXPECT_GT(spec.stats.preemptions, 0u) << "the budget never forced a preemption";
  EXPECT_GT(spec.stats.spec_accepted_tokens, 0u);
}

// A draft whose step reads 64 tokens at most meets prompts of 150: it reads them over several
// steps, proposing nothing for a sequence until it has read all of it.
TEST(DraftModel, ALongPromptIsReadOverSeveralStepsBeforeTheFirstProposal) {
  FixtureModel& target = testing::llama();
  auto draft = testing::load_fixture("llama-tiny", testing::kSmallStepLimits);
  ASSERT_NE(draft, nullptr);
  std::vector<EngineRequest> requests;
  for (std::uint64_t i = 0; i < 2; ++i) {
    requests.push_back(request_of(rig_prompt(150, 70 + i, 1024), 24));
  }
  KvSpaceOptions space;
  space.max_slots = 3;
  space.max_context = 256;
  const SpecRun plain = run_all(target, requests, {}, space);
  const SpecRun spec = run_all(target, requests, by_draft(4), space, draft_of(*draft->model));
  expect_same_answers(plain, spec, "long prompts");
  EXPECT_GT(spec.stats.spec_accepted_tokens, 0u);
  // The first two decode steps propose nothing (300 tokens to read, 64 a step): without the
  // draft's limit the runs would take ceil(23 / 5) + 1 steps.
  EXPECT_GT(spec.stats.steps, 23u / 5 + 2);
}

// The draft's KV may hold one window: every sequence's proposals are refused and it decodes a
// token a step, with nothing lost.
TEST(DraftModel, TheDraftsKvRefusedLeavesPlainDecoding) {
  FixtureModel& target = testing::llama();
  auto draft = testing::load_fixture("llama-tiny");
  ASSERT_NE(draft, nullptr);
  const std::vector<EngineRequest> requests = plain_prompts(20, 1024);
  KvSpaceOptions draft_space;
  draft_space.max_slots = 5;
  draft_space.max_context = 192;
  draft_space.host_granule = 16 << 10;
  draft_space.budget_bytes = draft_space.host_granule;
  const SpecRun plain = run_all(target, requests, {});
  const SpecRun spec =
      run_all(target, requests, by_draft(4), {}, draft_of(*draft->model, draft_space));
  expect_same_answers(plain, spec, "draft KV refused");
  EXPECT_GT(spec.stats.spec_draft_refused, 0u);
}

// Every map of the draft's KV fails in turn, then every forward of the draft: the answers are
// plain decoding's each time, and no request ends in an error.
TEST(DraftModel, AFailingDraftNeverChangesOrEndsAnAnswer) {
  FixtureModel& target = testing::llama();
  auto draft = testing::load_fixture("llama-tiny");
  ASSERT_NE(draft, nullptr);
  const std::vector<EngineRequest> requests = plain_prompts(24, 1024, 2);
  const SpecRun plain = run_all(target, requests, {});
  const auto run_failing_map = [&](std::uint64_t k, std::uint64_t* calls, std::uint64_t* injected) {
    auto inner = make_host_driver(HostDriverOptions{.granule = 16 << 10});
    EXPECT_TRUE(inner.ok());
    FaultDriver fault(**inner);
    if (k > 0) fault.fail_nth(DriverOp::kMap, k);
    KvSpaceOptions d;
    d.max_slots = 5;
    d.max_context = 192;
    d.driver = &fault;
    const SpecRun run = run_all(target, requests, by_draft(4), {}, draft_of(*draft->model, d));
    *calls = fault.counts().of(DriverOp::kMap);
    *injected = fault.injected();
    return run;
  };
  std::uint64_t calls = 0, injected = 0;
  (void)run_failing_map(0, &calls, &injected);
  ASSERT_GT(calls, 2u);
  std::uint64_t absorbed = 0;
  for (std::uint64_t k = 1; k <= calls; ++k) {
    std::uint64_t made = 0;
    const SpecRun faulty = run_failing_map(k, &made, &injected);
    expect_same_answers(plain, faulty, "draft map #" + std::to_string(k));
    absorbed += injected;
  }
  EXPECT_GT(absorbed, 0u) << "no map of the draft's KV was failed";

  for (const int at : {1, 2, 3, 7}) {
    kvvm::testing::FailingModel failing(*draft->model, at, Status::Internal("a draft step broke"));
    const SpecRun faulty = run_all(target, requests, by_draft(4), {}, draft_of(failing));
    expect_same_answers(plain, faulty, "draft forward #" + std::to_string(at));
    EXPECT_EQ(faulty.stats.spec_draft_failed, 1u) << "draft forward #" << at;
    EXPECT_GT(faulty.stats.spec_accepted_tokens, 0u) << "later steps propose again";
  }
}

TEST(DraftModel, TheEngineRefusesADraftItCannotUseNamingTheValue) {
  FixtureModel& target = testing::llama();
  auto qwen = testing::load_fixture("qwen3-tiny");
  ASSERT_NE(qwen, nullptr);
  auto kv = testing::make_kv(target.config, 3);
  ASSERT_NE(kv, nullptr);
  const auto refusal = [&](const DraftModel& draft, std::uint32_t k = 4) {
    EngineOptions options;
    options.speculative = by_draft(k);
    options.draft = draft;
    auto made = Engine::create(*target.model, *kv, options);
    EXPECT_FALSE(made.ok());
    return made.ok() ? std::string() : made.status().to_string();
  };
  EXPECT_NE(refusal({}).find("EngineOptions::draft"), std::string::npos);

  KvSpaceOptions o;
  o.max_slots = 3;
  o.max_context = 256;
  auto qwen_kv = testing::make_kv(qwen->config, o);
  ASSERT_NE(qwen_kv, nullptr);
  const std::string vocab = refusal({.model = qwen->model.get(), .kv = qwen_kv.get()});
  EXPECT_NE(vocab.find("vocab_size 676"), std::string::npos) << vocab;
  EXPECT_NE(vocab.find("1024"), std::string::npos) << vocab;

  // A space of another model's geometry (mixtral-tiny's heads are 32 wide, qwen3-tiny's 64).
  auto mixtral = testing::load_fixture("mixtral-tiny");
  ASSERT_NE(mixtral, nullptr);
  const std::string geometry = refusal({.model = mixtral->model.get(), .kv = qwen_kv.get()});
  EXPECT_NE(geometry.find("KV space of 2 layers x 2 KV heads x 64"), std::string::npos) << geometry;
}

// The draft's context no longer than the target's: a sequence that runs to the end of it gets
// fewer proposals as it nears the end (the draft writes all but its last proposal after the
// sequence), none past it, and the answer is plain decoding's to the last token.
TEST(DraftModel, ADraftOfTheTargetsContextProposesUpToItsEnd) {
  FixtureModel& target = testing::llama();
  auto draft = testing::load_fixture("llama-tiny");
  ASSERT_NE(draft, nullptr);
  KvSpaceOptions space;
  space.max_slots = 3;
  space.max_context = 64;
  KvSpaceOptions draft_space = space;
  draft_space.max_context = 60;  // shorter still: the last four positions get no proposal
  // 20 + 44 = 64 tokens: to the last position of the target's context.
  const std::vector<EngineRequest> requests = {request_of(rig_prompt(20, 3, 1024), 44)};
  const SpecRun plain = run_all(target, requests, {}, space);
  const SpecRun spec =
      run_all(target, requests, by_draft(4), space, draft_of(*draft->model, draft_space));
  expect_same_answers(plain, spec, "to the end of the context");
  EXPECT_EQ(spec.answers[0].tokens.size(), 44u);
  EXPECT_GT(spec.stats.spec_accepted_tokens, 0u);
  // A draft of ample context proposes at the last positions too: fewer steps.
  draft_space.max_context = 128;
  const SpecRun ample =
      run_all(target, requests, by_draft(4), space, draft_of(*draft->model, draft_space));
  expect_same_answers(plain, ample, "an ample draft context");
  EXPECT_LT(ample.stats.steps, spec.stats.steps);
  EXPECT_GT(ample.stats.spec_draft_tokens, spec.stats.spec_draft_tokens);
}

TEST(DraftModel, ItsConfigIsReadAsVllmWritesIt) {
  auto read = parse_speculative_config(R"({"model": "/m/draft", "num_speculative_tokens": 5})");
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(read->method, SpeculativeMethod::kDraftModel);
  EXPECT_EQ(read->draft_model, "/m/draft");
  EXPECT_EQ(read->num_speculative_tokens, 5u);
  read = parse_speculative_config(
      R"({"method": "draft_model", "model": "d", "num_speculative_tokens": 2,
          "disable_by_batch_size": 8})");
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(read->disable_by_batch_size, 8u);
  for (const auto& [json, named] : std::vector<std::pair<std::string, std::string>>{
           {R"({"method": "draft_model", "num_speculative_tokens": 2})", "\"model\""},
           {R"({"model": "d", "num_speculative_tokens": 2, "prompt_lookup_max": 3})",
            "prompt_lookup_max"},
           {R"({"method": "ngram", "model": "d", "num_speculative_tokens": 2})", "\"model\""},
           {R"({"model": "", "num_speculative_tokens": 2})", "\"model\""},
           {R"({"model": "d", "num_speculative_tokens": 65})", "65"},
           {R"({"model": "d"})", "num_speculative_tokens"},
       }) {
    const auto bad = parse_speculative_config(json);
    ASSERT_FALSE(bad.ok()) << json;
    EXPECT_NE(bad.status().message().find(named), std::string::npos)
        << json << ": " << bad.status().to_string();
  }
}

}  // namespace
}  // namespace kvvm::engine
