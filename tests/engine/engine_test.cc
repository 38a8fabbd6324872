// The engine on the CPU model: the same tokens whatever else runs beside a request (alone,
// in a mixed prefill / decode batch, with chunked prefill, with the prefix cache, after a
// preemption), and the same as transformers' greedy continuations where they can be called.
#include "kvvm/engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvvm/engine/generate.h"
#include "support/engine_harness.h"

namespace kvvm::engine {
namespace {

using testing::Collector;
using testing::expect_clean;
using testing::greedy_request;
using testing::llama;
using testing::make_kv;
using testing::no_cache;

std::vector<std::int32_t> random_prompt(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<std::int32_t> draw(0, 1000);  // inside every fixture's vocab
  std::vector<std::int32_t> ids(n);
  for (auto& id : ids) id = draw(random);
  return ids;
}

// Runs `requests` through one engine. `gap` > 0 submits request i after i * gap steps, so
// prefill chunks of new requests share steps with decodes of earlier ones.
std::vector<std::vector<std::int32_t>> run_engine(model::Model& model, KvSpace& kv,
                                                  const EngineOptions& options,
                                                  const std::vector<EngineRequest>& requests,
                                                  int gap = 0, EngineStats* stats_out = nullptr,
                                                  std::vector<RequestStats>* request_stats = {}) {
  Collector collector;
  std::vector<RequestId> ids;
  {
    auto engine = Engine::create(model, kv, options);
    EXPECT_TRUE(engine.ok()) << engine.status().to_string();
    if (!engine.ok()) return {};
    for (const EngineRequest& request : requests) {
      auto id = (*engine)->submit(request, collector.callback());
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      if (!id.ok()) return {};
      ids.push_back(*id);
      for (int s = 0; s < gap; ++s) EXPECT_TRUE((*engine)->step().ok());
    }
    EXPECT_TRUE((*engine)->run_until_idle().ok());
    if (stats_out != nullptr) *stats_out = (*engine)->stats();
  }
  expect_clean(kv);
  std::vector<std::vector<std::int32_t>> tokens;
  for (const RequestId id : ids) {
    const testing::Outcome o = collector.get(id);
    EXPECT_EQ(o.finished_events, 1) << "request " << id;
    EXPECT_TRUE(o.end == RequestEnd::kLength || o.end == RequestEnd::kStop)
        << to_string(o.end) << ": " << o.error.to_string();
    EXPECT_EQ(o.stats.generated_tokens, o.tokens.size());
    tokens.push_back(o.tokens);
    if (request_stats != nullptr) request_stats->push_back(o.stats);
  }
  return tokens;
}

std::vector<EngineRequest> fixture_requests(const nlohmann::json& expected,
                                            std::uint32_t max_tokens) {
  std::vector<EngineRequest> requests;
  for (const nlohmann::json& entry : expected["greedy"]) {
    requests.push_back(
        greedy_request(entry["prompt_ids"].get<std::vector<std::int32_t>>(), max_tokens));
  }
  return requests;
}

// Alone, together in one batch and staggered (prefill beside decode): the same greedy tokens,
// equal to generate()'s and to transformers' wherever its top-2 margin calls the token.
class EngineFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineFixture, GreedyTokensAloneEqualABatchAndTheReference) {
  const std::unique_ptr<testing::FixtureModel> loaded = testing::load_fixture(GetParam());
  ASSERT_NE(loaded, nullptr);
  testing::FixtureModel& m = *loaded;
  constexpr std::uint32_t kTokens = 24;
  const std::vector<EngineRequest> requests = fixture_requests(m.expected, kTokens);
  ASSERT_GE(requests.size(), 3u);
  auto kv = make_kv(m.config, 4);
  ASSERT_NE(kv, nullptr);
  EngineOptions options = no_cache();

  std::vector<std::vector<std::int32_t>> alone;
  for (const EngineRequest& request : requests) {
    auto one = run_engine(*m.model, *kv, options, {request});
    ASSERT_EQ(one.size(), 1u);
    alone.push_back(one[0]);
    GenerateRequest single;
    single.prompt = request.prompt;
    single.max_tokens = kTokens;
    auto generated = generate(*m.model, *kv, single);
    ASSERT_TRUE(generated.ok()) << generated.status().to_string();
    EXPECT_EQ(alone.back(), generated->tokens);
  }
  EngineStats batch_stats;
  EXPECT_EQ(run_engine(*m.model, *kv, options, requests, 0, &batch_stats), alone);
  EXPECT_EQ(batch_stats.peak_running, requests.size());
  EngineStats staggered_stats;
  EXPECT_EQ(run_engine(*m.model, *kv, options, requests, 2, &staggered_stats), alone);
  // Staggered: fewer steps than one run after another would take, so steps were shared.
  EXPECT_LT(staggered_stats.steps, requests.size() * kTokens);
  EXPECT_GT(staggered_stats.decode_only_steps, 0u);

  for (std::size_t r = 0; r < requests.size(); ++r) {
    const nlohmann::json& entry = m.expected["greedy"][r];
    const auto want = entry["tokens"].get<std::vector<std::int32_t>>();
    const auto margins = entry["margins"].get<std::vector<double>>();
    std::size_t compared = 0;
    for (std::size_t i = 0; i < kTokens && margins[i] > 1e-3; ++i, ++compared) {
      EXPECT_EQ(alone[r][i], want[i]) << "prompt " << r << ", step " << i;
    }
    EXPECT_GT(compared, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EngineFixture, ::testing::Values("llama-tiny", "qwen2-tiny"),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Chunked prefill (chunks of 3 in steps of 4 tokens) gives the same tokens as whole prompts.
TEST(Engine, ChunkedPrefillGivesTheSameTokens) {
  testing::FixtureModel& m = llama();
  const std::vector<EngineRequest> requests = {greedy_request(random_prompt(21, 1), 12),
                                               greedy_request(random_prompt(9, 2), 12),
                                               greedy_request(random_prompt(14, 3), 12)};
  auto kv = make_kv(m.config, 4);
  ASSERT_NE(kv, nullptr);
  const auto expected = run_engine(*m.model, *kv, no_cache(), requests);
  ASSERT_EQ(expected.size(), 3u);
  EngineOptions chunked = no_cache();
  chunked.step_tokens = 4;
  chunked.prefill_chunk = 3;
  EngineStats stats;
  EXPECT_EQ(run_engine(*m.model, *kv, chunked, requests, 1, &stats), expected);
  // 44 prompt tokens at most 4 a step: the prefill alone takes 11 steps or more.
  EXPECT_GE(stats.steps, 11u + 12u);
}

// vllm:iteration_tokens_total's counts: every step that ran, in the bucket of the tokens it
// computed (prompt chunks and the decode tokens fed back: all but each request's last token).
TEST(Engine, StepTokensCountEveryStepInTheBucketOfItsTokens) {
  testing::FixtureModel& m = llama();
  const std::vector<EngineRequest> requests = {greedy_request(random_prompt(21, 5), 6),
                                               greedy_request(random_prompt(30, 6), 6)};
  auto kv = make_kv(m.config, 3);
  ASSERT_NE(kv, nullptr);
  for (const std::uint32_t step_tokens : {4u, 256u}) {
    SCOPED_TRACE("step_tokens " + std::to_string(step_tokens));
    EngineOptions options = no_cache();
    options.step_tokens = step_tokens;
    EngineStats stats;
    std::vector<RequestStats> per_request;
    ASSERT_EQ(run_engine(*m.model, *kv, options, requests, 0, &stats, &per_request).size(), 2u);
    std::uint64_t computed = 0;
    for (const RequestStats& r : per_request) computed += r.prompt_tokens + r.generated_tokens - 1;
    std::uint64_t counted = 0;
    for (std::uint64_t count : stats.step_tokens.buckets) counted += count;
    EXPECT_EQ(counted, stats.steps);
    EXPECT_EQ(stats.step_tokens.tokens, computed);
    // Bucket 0 holds steps of 1 token, bucket 1 up to 8, bucket 4 up to 64.
    if (step_tokens == 4) {
      EXPECT_EQ(stats.step_tokens.buckets[0] + stats.step_tokens.buckets[1], stats.steps);
    } else {
      // Both prompts in the first step (51 tokens), then decode steps of one or two tokens.
      EXPECT_EQ(stats.step_tokens.buckets[4], 1u);
      EXPECT_EQ(stats.step_tokens.buckets[0] + stats.step_tokens.buckets[1], stats.steps - 1);
    }
  }
}

// The prefix cache changes no token; a request sharing a long prefix with a finished one
// computes only what is not cached.
TEST(Engine, PrefixCacheOnAndOffGiveTheSameTokens) {
  testing::FixtureModel& m = llama();
  const std::vector<std::int32_t> shared = random_prompt(40, 4);
  std::vector<EngineRequest> requests;
  for (std::uint64_t i = 0; i < 2; ++i) {
    std::vector<std::int32_t> prompt = shared;
    const std::vector<std::int32_t> tail = random_prompt(5, 10 + i);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    requests.push_back(greedy_request(prompt, 10));
  }
  auto kv = make_kv(m.config, 3);
  ASSERT_NE(kv, nullptr);
  EngineOptions off = no_cache();
  const auto expected = run_engine(*m.model, *kv, off, requests);
  ASSERT_EQ(expected.size(), 2u);

  EngineOptions on;
  on.prefix_cache = true;
  EXPECT_EQ(run_engine(*m.model, *kv, on, requests), expected);
  // One after the other in one engine: the first has published its prompt's windows when
  // the second is admitted.
  {
    Collector collector;
    auto engine = Engine::create(*m.model, *kv, on);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    auto first = (*engine)->submit(requests[0], collector.callback());
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE((*engine)->run_until_idle().ok());
    auto later = (*engine)->submit(requests[1], collector.callback());
    ASSERT_TRUE(later.ok());
    ASSERT_TRUE((*engine)->run_until_idle().ok());
    EXPECT_EQ(collector.get(*first).tokens, expected[0]);
    EXPECT_EQ(collector.get(*later).tokens, expected[1]);
    EXPECT_EQ(collector.get(*first).stats.cached_tokens, 0u);
    EXPECT_GT(collector.get(*later).stats.cached_tokens, 0u);
    EXPECT_LE(collector.get(*later).stats.cached_tokens, shared.size());
    const EngineStats s = (*engine)->stats();
    EXPECT_GT(s.prefix.hits, 0u);
    EXPECT_EQ(s.cached_tokens, collector.get(*later).stats.cached_tokens);
  }
  expect_clean(*kv);
}

// A seed gives the same draws alone and beside other requests; another seed other tokens.
TEST(Engine, SeededSamplingIsTheSameAloneAndInABatch) {
  testing::FixtureModel& m = llama();
  auto sampled = [](std::vector<std::int32_t> prompt, std::uint64_t seed) {
    EngineRequest request = greedy_request(std::move(prompt), 20);
    request.sampling =
        SamplingParams{.temperature = 1.5f, .top_k = 50, .top_p = 0.95f, .seed = seed};
    return request;
  };
  const std::vector<EngineRequest> requests = {sampled(random_prompt(7, 5), 1),
                                               sampled(random_prompt(12, 6), 2),
                                               sampled(random_prompt(7, 5), 3)};
  auto kv = make_kv(m.config, 4);
  ASSERT_NE(kv, nullptr);
  EngineOptions options = no_cache();
  const auto alone = run_engine(*m.model, *kv, options, {requests[0]});
  const auto batch = run_engine(*m.model, *kv, options, requests, 1);
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_EQ(batch[0], alone[0]);
  // Same prompt, another seed: different draws (20 tokens at temperature 1.5).
  EXPECT_NE(batch[2], batch[0]);
}

// A budget too small for every sequence to grow: the newest is preempted and recomputed,
// and every answer is the one it gets alone.
TEST(Engine, PreemptedRequestsGiveTheSameTokens) {
  testing::FixtureModel& m = llama();
  std::vector<EngineRequest> requests;
  for (std::uint64_t i = 0; i < 4; ++i)
    requests.push_back(greedy_request(random_prompt(6, 20 + i), 30));
  std::vector<std::vector<std::int32_t>> alone;
  {
    auto kv = make_kv(m.config, 5);
    ASSERT_NE(kv, nullptr);
    EngineOptions options = no_cache();
    for (const EngineRequest& request : requests) {
      alone.push_back(run_engine(*m.model, *kv, options, {request})[0]);
    }
  }
  // 36 tokens of 2 KiB each per sequence: the budget holds about two and a half sequences.
  const std::uint64_t per_token =
      std::uint64_t{2} * m.config.layers * m.config.kv_heads * m.config.head_dim * sizeof(float);
  auto kv = make_kv(m.config, 5, 128, 90 * per_token);
  ASSERT_NE(kv, nullptr);
  for (const bool cache : {false, true}) {
    EngineOptions options;
    options.prefix_cache = cache;
    EngineStats stats;
    std::vector<RequestStats> request_stats;
    EXPECT_EQ(run_engine(*m.model, *kv, options, requests, 0, &stats, &request_stats), alone)
        << "prefix cache " << cache;
    EXPECT_GT(stats.preemptions, 0u) << "the budget did not force a preemption";
    // The newest yields: the oldest request is never the one preempted.
    ASSERT_EQ(request_stats.size(), requests.size());
    EXPECT_EQ(request_stats[0].preemptions, 0u);
  }
}

// Decode tokens go first: a running answer gains a token every step while a long prompt
// beside it is prefilled a few tokens at a time.
TEST(Engine, DecodesAreNotDelayedByAPrefill) {
  testing::FixtureModel& m = llama();
  auto kv = make_kv(m.config, 3);
  ASSERT_NE(kv, nullptr);
  EngineOptions options = no_cache();
  options.step_tokens = 4;
  Collector collector;
  {
    auto engine = Engine::create(*m.model, *kv, options);
    ASSERT_TRUE(engine.ok());
    const RequestId first =
        *(*engine)->submit(greedy_request(random_prompt(3, 50), 30), collector.callback());
    ASSERT_TRUE((*engine)->step().ok());  // its prompt and first token
    ASSERT_EQ(collector.get(first).tokens.size(), 1u);
    const RequestId second =
        *(*engine)->submit(greedy_request(random_prompt(40, 51), 4), collector.callback());
    for (std::size_t i = 2; i <= 10; ++i) {
      ASSERT_TRUE((*engine)->step().ok());
      EXPECT_EQ(collector.get(first).tokens.size(), i) << "a step without the decode token";
    }
    // 9 steps of 3 prompt tokens beside the decode: not through its 40 yet.
    EXPECT_EQ(collector.get(second).tokens.size(), 0u);
    ASSERT_TRUE((*engine)->run_until_idle().ok());
    EXPECT_EQ(collector.get(second).tokens.size(), 4u);
  }
  expect_clean(*kv);
}

// The preallocated baseline commits a whole context per sequence at admission and gives
// the same tokens.
TEST(Engine, PreallocatedKvGivesTheSameTokens) {
  testing::FixtureModel& m = llama();
  const std::vector<EngineRequest> requests = {greedy_request(random_prompt(11, 30), 8),
                                               greedy_request(random_prompt(6, 31), 8)};
  auto kv = make_kv(m.config, 3);
  ASSERT_NE(kv, nullptr);
  EngineOptions options = no_cache();
  const auto expected = run_engine(*m.model, *kv, options, requests);
  options.preallocate = true;
  Collector collector;
  {
    auto engine = Engine::create(*m.model, *kv, options);
    ASSERT_TRUE(engine.ok());
    std::vector<RequestId> ids;
    for (const EngineRequest& request : requests) {
      ids.push_back(*(*engine)->submit(request, collector.callback()));
    }
    ASSERT_TRUE((*engine)->step().ok());
    const double usage = (*engine)->stats().kv_usage;
    EXPECT_GT(usage, 0.0);
    EXPECT_LE(usage, 1.0);
    // Reclaim takes nothing from a preallocation, even after steps have written into it.
    ASSERT_TRUE((*engine)->step().ok());
    kv->arena().reclaim(std::numeric_limits<std::uint64_t>::max());
    const ArenaStats arena = kv->arena().stats();
    EXPECT_EQ(arena.active_slots, 2u);
    // Two whole contexts committed (the live length is 12 tokens at most).
    EXPECT_GE(arena.committed_bytes,
              2 * kv->options().max_context * kv->arena().plan().bytes_per_token);
    ASSERT_TRUE((*engine)->run_until_idle().ok());
    for (std::size_t i = 0; i < ids.size(); ++i)
      EXPECT_EQ(collector.get(ids[i]).tokens, expected[i]);
  }
  expect_clean(*kv);
}

// Callbacks run without the engine's lock: one may submit a follow-up and cancel another.
TEST(Engine, CallbacksMaySubmitAndCancel) {
  testing::FixtureModel& m = llama();
  auto kv = make_kv(m.config, 3);
  ASSERT_NE(kv, nullptr);
  EngineOptions options = no_cache();
  auto engine = Engine::create(*m.model, *kv, options);
  ASSERT_TRUE(engine.ok());
  Collector collector;
  RequestCallback record = collector.callback();
  RequestId follow_up = 0;
  RequestId victim = 0;
  Engine& e = **engine;
  auto first = e.submit(greedy_request(random_prompt(5, 40), 3), [&](const RequestEvent& event) {
    record(event);
    if (!event.finished) return;
    e.cancel(victim);
    auto id = e.submit(greedy_request(random_prompt(5, 41), 3), record);
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    follow_up = *id;
  });
  ASSERT_TRUE(first.ok());
  victim = *e.submit(greedy_request(random_prompt(5, 42), 40), record);
  ASSERT_TRUE(e.run_until_idle().ok());
  EXPECT_EQ(collector.get(*first).end, RequestEnd::kLength);
  EXPECT_EQ(collector.get(victim).end, RequestEnd::kCancelled);
  ASSERT_NE(follow_up, 0u);
  EXPECT_EQ(collector.get(follow_up).end, RequestEnd::kLength);
  EXPECT_EQ(collector.get(follow_up).tokens.size(), 3u);
  engine->reset();
  expect_clean(*kv);
}

// keep_prompt_logits: the logits of the prompt's last position come with the request's last
// event, from the step that ends its prompt however it was chunked and whatever ran beside it,
// equal to generate()'s prefill-only answer; asking for them changes no token. max_tokens 0
// with them is a prefill only (length, nothing generated).
TEST(EnginePromptLogits, KeptInABatchEqualGeneratesPrefillOnly) {
  testing::FixtureModel& m = llama();
  auto kv = make_kv(m.config, 4);
  ASSERT_NE(kv, nullptr);
  const std::vector<std::int32_t> prompt = random_prompt(11, 5);
  GenerateRequest prefill;
  prefill.prompt = prompt;
  prefill.max_tokens = 0;
  prefill.keep_prompt_logits = true;
  auto alone = generate(*m.model, *kv, prefill);
  ASSERT_TRUE(alone.ok()) << alone.status().to_string();
  ASSERT_EQ(alone->prompt_logits.size(), m.config.vocab_size);
  EXPECT_TRUE(alone->tokens.empty());
  EXPECT_EQ(alone->finish, FinishReason::kLength);

  EngineOptions options = no_cache();
  options.prefill_chunk = 3;
  const EngineRequest plain = greedy_request(prompt, 6);
  const std::vector<std::int32_t> want = run_engine(*m.model, *kv, options, {plain})[0];
  EngineRequest keeping = plain;
  keeping.keep_prompt_logits = true;
  EngineRequest prefill_only = keeping;
  prefill_only.max_tokens = 0;

  std::vector<std::vector<float>> logits(3);
  std::vector<std::vector<std::int32_t>> tokens(3);
  std::vector<RequestEnd> ends(3, RequestEnd::kError);
  {
    auto engine = Engine::create(*m.model, *kv, options);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const std::vector<EngineRequest> requests = {greedy_request(random_prompt(9, 8), 6), keeping,
                                                 prefill_only};
    for (std::size_t i = 0; i < requests.size(); ++i) {
      auto id = (*engine)->submit(requests[i], [&, i](const RequestEvent& event) {
        tokens[i].insert(tokens[i].end(), event.tokens.begin(), event.tokens.end());
        if (!event.finished) return;
        logits[i].assign(event.prompt_logits.begin(), event.prompt_logits.end());
        ends[i] = event.end;
      });
      ASSERT_TRUE(id.ok()) << id.status().to_string();
      ASSERT_TRUE((*engine)->step().ok());  // staggered: prefill beside decode
    }
    ASSERT_TRUE((*engine)->run_until_idle().ok());
  }
  expect_clean(*kv);
  EXPECT_TRUE(logits[0].empty());  // not asked
  EXPECT_EQ(tokens[1], want);
  EXPECT_EQ(ends[2], RequestEnd::kLength);
  EXPECT_TRUE(tokens[2].empty());
  for (const std::size_t i : {std::size_t{1}, std::size_t{2}}) {
    ASSERT_EQ(logits[i].size(), alone->prompt_logits.size()) << i;
    for (std::size_t v = 0; v < logits[i].size(); ++v) {
      ASSERT_NEAR(logits[i][v], alone->prompt_logits[v], 1e-4) << "request " << i << ", id " << v;
    }
  }
}

}  // namespace
}  // namespace kvvm::engine
