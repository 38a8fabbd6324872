// Speculative decoding by n-gram prompt lookup through the engine: the proposals verified as
// extra single-token rows of a sequence change how many tokens a step yields, never which: on
// every fixture, greedy or sampled, with logit transforms, log-probabilities, stops inside a
// kept run, preemption and a commit refused under a proposal, the output is token for token
// (and log-probability for log-probability) what decoding one token a step gives.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/host_driver.h"
#include "support/engine_harness.h"
#include "support/speculative_rig.h"

namespace kvvm::engine {
namespace {

using testing::Answer;
using testing::expect_same_answers;
using testing::FixtureModel;
using testing::lookup;
using testing::repeating_prompt;
using testing::request_of;
using testing::run_all;
using testing::SpecRun;

std::vector<EngineRequest> greedy_batch(std::uint32_t max_tokens) {
  std::vector<EngineRequest> requests;
  for (std::uint64_t i = 0; i < 4; ++i) {
    requests.push_back(request_of(repeating_prompt(10 + i, 5 + i), max_tokens));
  }
  return requests;
}

class SpeculativeFixtures : public ::testing::TestWithParam<const char*> {};

TEST_P(SpeculativeFixtures, GreedyOutputIsPlainDecodingsAndProposalsAreKept) {
  auto fixture = testing::load_fixture(GetParam());
  ASSERT_NE(fixture, nullptr);
  const std::vector<EngineRequest> requests = greedy_batch(40);
  const SpecRun plain = run_all(*fixture, requests, {});
  const SpecRun spec = run_all(*fixture, requests, lookup(4));
  expect_same_answers(plain, spec, GetParam());
  EXPECT_EQ(plain.stats.spec_drafts, 0u);
  EXPECT_GT(spec.stats.spec_draft_tokens, 0u) << "nothing was proposed: nothing was verified";
  EXPECT_GT(spec.stats.spec_accepted_tokens, 0u) << "no proposal was kept";
  EXPECT_LE(spec.stats.spec_accepted_tokens, spec.stats.spec_draft_tokens);
  // Kept proposals are tokens without a step of their own.
  EXPECT_LT(spec.stats.steps, plain.stats.steps);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpeculativeFixtures,
                         ::testing::Values("llama-tiny", "qwen2-tiny", "qwen3-tiny",
                                           "qwen3-moe-tiny", "mixtral-tiny", "qwen2-moe-tiny"),
                         [](const auto& param) {
                           std::string name = param.param;
                           std::erase(name, '-');
                           return name;
                         });

TEST(Speculative, SampledOutputWithTransformsAndLogprobsIsPlainDecodings) {
  FixtureModel& fixture = testing::llama();
  std::vector<EngineRequest> requests = greedy_batch(32);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    EngineRequest& r = requests[i];
    r.sampling.temperature = 0.7f + 0.2f * static_cast<float>(i);
    r.sampling.seed = 5 + i;
    r.sampling.top_p = 0.95f;
    r.logprobs = 3;
  }
  // Transforms that depend on the output so far: each row's must count the proposals before it.
  requests[1].sampling.presence_penalty = 0.5f;
  requests[2].sampling.repetition_penalty = 1.2f;
  requests[2].logit_bias = {{requests[2].prompt[0], 2.0f}};
  requests[3].min_tokens = 20;
  requests[3].stop_ids = {requests[3].prompt[1]};
  const SpecRun plain = run_all(fixture, requests, {});
  const SpecRun spec = run_all(fixture, requests, lookup(3));
  expect_same_answers(plain, spec, "sampled");
  EXPECT_GT(spec.stats.spec_draft_tokens, 0u);
  EXPECT_GT(spec.stats.spec_accepted_tokens, 0u);
}

// Ends met inside a run of kept proposals: max_tokens at every length, and an end token the
// plain answer meets, each as plain decoding meets them.
TEST(Speculative, StopsInsideAKeptRunAreWherePlainDecodingStops) {
  FixtureModel& fixture = testing::llama();
  const std::vector<std::int32_t> prompt = repeating_prompt(5, 4);
  const SpecRun reference = run_all(fixture, {request_of(prompt, 24)}, {});
  ASSERT_EQ(reference.answers[0].tokens.size(), 24u);
  std::vector<EngineRequest> requests;
  // This prompt's answer starts repeating itself (and proposals start being kept) after its
  // first dozen tokens.
  for (std::uint32_t max_tokens = 13; max_tokens <= 24; ++max_tokens) {
    requests.push_back(request_of(prompt, max_tokens));
  }
  for (const std::size_t at : {15u, 18u, 21u}) {
    EngineRequest r = request_of(prompt, 24);
    r.stop_ids = {reference.answers[0].tokens[at]};
    requests.push_back(r);
  }
  const SpecRun plain = run_all(fixture, requests, {});
  const SpecRun spec = run_all(fixture, requests, lookup(6));
  expect_same_answers(plain, spec, "stops");
  EXPECT_GT(spec.stats.spec_accepted_tokens, 0u);
}

TEST(Speculative, PreemptedSequencesRecomputeToPlainDecodingsTokens) {
  auto fixture = testing::load_fixture("llama-tiny", testing::kSmallStepLimits);
  ASSERT_NE(fixture, nullptr);
  // Twelve windows of 8 tokens for four sequences growing to 54 tokens (7 windows each): the
  // newest are preempted.
  KvSpaceOptions space = testing::small_space_options();
  space.budget_bytes = 12 * space.host_granule;
  std::vector<EngineRequest> requests;
  for (std::uint64_t i = 0; i < 4; ++i)
    requests.push_back(request_of(repeating_prompt(20 + i), 30));
  const SpecRun plain = run_all(*fixture, requests, {}, space);
  const SpecRun spec = run_all(*fixture, requests, lookup(4), space);
  expect_same_answers(plain, spec, "preemption");
  for (const Answer& a : spec.answers) EXPECT_EQ(a.tokens.size(), 30u);
  EXPECT_GT(spec.stats.preemptions, 0u) << "the budget never forced a preemption";
  EXPECT_GT(spec.stats.spec_accepted_tokens, 0u);
}

TEST(Speculative, OptedOutRequestsAndLargeBatchesDoNotSpeculate) {
  FixtureModel& fixture = testing::llama();
  std::vector<EngineRequest> requests = greedy_batch(24);
  for (EngineRequest& r : requests) r.speculate = false;
  const SpecRun plain = run_all(fixture, requests, {});
  const SpecRun opted_out = run_all(fixture, requests, lookup(4));
  expect_same_answers(plain, opted_out, "opted out");
  EXPECT_EQ(opted_out.stats.spec_drafts, 0u);
  EXPECT_EQ(opted_out.stats.steps, plain.stats.steps);

  // One request in four speculates: the others keep one token a step beside it.
  requests[2].speculate = true;
  const SpecRun mixed = run_all(fixture, requests, lookup(4));
  expect_same_answers(plain, mixed, "mixed");
  EXPECT_GT(mixed.stats.spec_drafts, 0u);

  // Four decoding at once reach disable_by_batch_size 4: no step speculates until fewer run.
  for (EngineRequest& r : requests) r.speculate = true;
  SpeculativeOptions off_at_four = lookup(4);
  off_at_four.disable_by_batch_size = 4;
  const SpecRun large = run_all(fixture, requests, off_at_four);
  expect_same_answers(plain, large, "disabled by batch size");
  EXPECT_EQ(large.stats.spec_drafts, 0u) << "all four ran to the end together";
}

// Every map call of one speculating request fails in turn: a failure under a proposal's row
// drops the rows from there (the answer is untouched); one under the sequence's own token ends
// at most the request, as without speculation. Some failure must land under a proposal.
TEST(Speculative, ACommitRefusedUnderAProposalDropsTheRowsNotTheAnswer) {
  FixtureModel& fixture = testing::llama();
  const EngineRequest request = request_of(repeating_prompt(31, 4), 48);
  const auto run_failing = [&](std::uint64_t k, std::uint64_t* calls, std::uint64_t* injected) {
    auto inner = make_host_driver(HostDriverOptions{.granule = 16 << 10});  // 8 tokens a window
    EXPECT_TRUE(inner.ok());
    FaultDriver fault(**inner);
    if (k > 0) fault.fail_nth(DriverOp::kMap, k);
    KvSpaceOptions space;
    space.max_slots = 2;
    space.max_context = 96;
    space.driver = &fault;
    const SpecRun run = run_all(fixture, {request}, lookup(4), space);
    *calls = fault.counts().of(DriverOp::kMap);
    *injected = fault.injected();
    return run;
  };
  std::uint64_t calls = 0, injected = 0;
  const SpecRun clean = run_failing(0, &calls, &injected);
  ASSERT_EQ(clean.answers[0].tokens.size(), 48u);
  ASSERT_GT(calls, 2u);
  std::uint64_t absorbed = 0;
  for (std::uint64_t k = 1; k <= calls; ++k) {
    std::uint64_t made = 0;
    const SpecRun faulty = run_failing(k, &made, &injected);
    const Answer& a = faulty.answers[0];
    ASSERT_EQ(a.finished, 1) << "map #" << k;
    if (injected == 0) continue;
    if (a.end == RequestEnd::kError) continue;  // the sequence's own token's commit
    EXPECT_EQ(a.tokens, clean.answers[0].tokens) << "map #" << k;
    ++absorbed;
  }
  EXPECT_GT(absorbed, 0u) << "no failure landed under a proposal's row";
}

// On an fp8 cache, with two sampled choices a request (the second forked from the first's
// prompt), the prefix cache on: the answers of every choice are plain decoding's, with lookup
// and with a draft model (its own cache fp32).
TEST(Speculative, ComposesWithAnFp8CacheAndSeveralChoices) {
  FixtureModel& fixture = testing::llama();
  auto draft = testing::load_fixture("llama-tiny");
  ASSERT_NE(draft, nullptr);
  // Two requests of 20 tokens: the fp8 cache's quantisation is the slow part on the CPU.
  std::vector<EngineRequest> requests = greedy_batch(20);
  requests.resize(2);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    requests[i].n = 2;
    requests[i].sampling.temperature = 0.8f;
    requests[i].sampling.seed = 70 + i;
  }
  KvSpaceOptions fp8;
  fp8.max_slots = 9;
  fp8.max_context = 128;
  fp8.kv_dtype = DType::kFp8;
  KvSpaceOptions draft_space;
  draft_space.max_slots = 9;
  draft_space.max_context = 160;
  const SpecRun plain = run_all(fixture, requests, {}, fp8);
  const SpecRun ngram = run_all(fixture, requests, lookup(4), fp8);
  const SpecRun drafted = run_all(fixture, requests, testing::by_draft(4), fp8,
                                  testing::draft_of(*draft->model, draft_space));
  for (const Answer& a : plain.answers) ASSERT_EQ(a.other_choices.size(), 1u);
  expect_same_answers(plain, ngram, "fp8, n = 2, lookup");
  expect_same_answers(plain, drafted, "fp8, n = 2, draft model");
  EXPECT_GT(ngram.stats.spec_accepted_tokens, 0u);
  EXPECT_GT(drafted.stats.spec_accepted_tokens, 0u);
}

TEST(SpeculativeConfig, ReadsVllmsJsonAndNamesWhatIsWrong) {
  auto read = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 4,
                                           "prompt_lookup_max": 4, "prompt_lookup_min": 2})");
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(read->num_speculative_tokens, 4u);
  EXPECT_EQ(read->prompt_lookup_min, 2u);
  EXPECT_EQ(read->prompt_lookup_max, 4u);
  // One lookup size alone sets both; the method is then inferred.
  read = parse_speculative_config(R"({"num_speculative_tokens": 3, "prompt_lookup_max": 7})");
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(read->prompt_lookup_min, 7u);
  read = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 2})");
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->prompt_lookup_min, 5u);
  EXPECT_EQ(read->prompt_lookup_max, 5u);

  const std::map<std::string, std::string> refused = {
      {R"({"method": "eagle", "num_speculative_tokens": 2})", "eagle"},
      {R"({"method": "ngram"})", "num_speculative_tokens"},
      {R"({"method": "ngram", "num_speculative_tokens": 65})", "65"},
      {R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 6,
           "prompt_lookup_max": 3})",
       "prompt_lookup"},
      {R"({"method": "ngram", "num_speculative_tokens": -1})", "num_speculative_tokens"},
      {R"({"method": "ngram", "num_speculative_tokens": 2, "draft_model": "x"})", "draft_model"},
      {R"([1, 2])", "not a JSON object"},
  };
  for (const auto& [json, named] : refused) {
    const auto bad = parse_speculative_config(json);
    ASSERT_FALSE(bad.ok()) << json;
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << json;
    EXPECT_NE(bad.status().message().find(named), std::string::npos)
        << json << ": " << bad.status().to_string();
  }
}

TEST(SpeculativeConfig, TheEngineRefusesBadOptionsNamingTheField) {
  FixtureModel& fixture = testing::llama();
  auto kv = testing::make_kv(fixture.config, 3);
  ASSERT_NE(kv, nullptr);
  EngineOptions options;
  options.speculative = lookup(4);
  options.speculative.prompt_lookup_min = 0;
  auto made = Engine::create(*fixture.model, *kv, options);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("prompt_lookup_min"), std::string::npos)
      << made.status().to_string();
}

}  // namespace
}  // namespace kvvm::engine
