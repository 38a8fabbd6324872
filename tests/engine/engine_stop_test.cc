// How engine requests end and are refused: end tokens (the request's and the model's),
// max_tokens, stop strings, cancellation, submit validation, the bounded queue, and the
// engine's own thread with drain().
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "engine/retry_estimate.h"
#include "kvvm/engine/engine.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "support/engine_harness.h"

namespace kvvm::engine {
namespace {

using testing::Collector;
using testing::expect_clean;
using testing::greedy_request;
using testing::llama;
using testing::make_kv;
using testing::no_cache;

const std::vector<std::int32_t> kStopPrompt = {269, 293, 290, 288, 297, 268, 259, 287};

// The greedy continuation of kStopPrompt, max_tokens long, with nothing to stop it.
std::vector<std::int32_t> continuation(std::uint32_t max_tokens) {
  auto kv = make_kv(llama().config, 2);
  Collector collector;
  RequestId id = 0;
  {
    auto engine = Engine::create(*llama().model, *kv, no_cache());
    EXPECT_TRUE(engine.ok());
    id = *(*engine)->submit(greedy_request(kStopPrompt, max_tokens), collector.callback());
    EXPECT_TRUE((*engine)->run_until_idle().ok());
  }
  expect_clean(*kv);
  return collector.get(id).tokens;
}

// The first index >= 3 whose token did not occur before it (a stop id that ends exactly there).
std::size_t fresh_index(const std::vector<std::int32_t>& tokens) {
  for (std::size_t i = 3; i < tokens.size(); ++i) {
    if (std::find(tokens.begin(), tokens.begin() + i, tokens[i]) == tokens.begin() + i) return i;
  }
  return 0;
}

testing::Outcome run_one(model::Model& model, EngineRequest request,
                         EngineOptions options = no_cache()) {
  auto kv = make_kv(llama().config, 2);
  Collector collector;
  RequestId id = 0;
  {
    auto engine = Engine::create(model, *kv, options);
    EXPECT_TRUE(engine.ok()) << engine.status().to_string();
    auto submitted = (*engine)->submit(std::move(request), collector.callback());
    EXPECT_TRUE(submitted.ok()) << submitted.status().to_string();
    id = *submitted;
    EXPECT_TRUE((*engine)->run_until_idle().ok());
  }
  expect_clean(*kv);
  const testing::Outcome outcome = collector.get(id);
  EXPECT_EQ(outcome.finished_events, 1);
  return outcome;
}

TEST(EngineEnds, StopIdsAndTheModelsEosEndWithoutBeingEmitted) {
  const std::vector<std::int32_t> full = continuation(20);
  ASSERT_EQ(full.size(), 20u);
  const std::size_t k = fresh_index(full);
  ASSERT_GT(k, 0u) << "no token of the continuation is new after index 3";
  const std::vector<std::int32_t> before(full.begin(), full.begin() + k);

  EngineRequest with_stop = greedy_request(kStopPrompt, 20);
  with_stop.stop_ids = {full[k]};
  testing::Outcome o = run_one(*llama().model, with_stop);
  EXPECT_EQ(o.end, RequestEnd::kStop);
  EXPECT_EQ(o.tokens, before);
  EXPECT_EQ(o.stats.generated_tokens, k);

  // The model's eos ids end a request that asks for them, and only then.
  model::ModelConfig config = llama().config;
  config.eos_token_ids = {full[k]};
  auto eos_model = llama().variant(config);
  ASSERT_NE(eos_model, nullptr);
  EngineRequest eos = greedy_request(kStopPrompt, 20);
  eos.use_model_eos = true;
  o = run_one(*eos_model, eos);
  EXPECT_EQ(o.end, RequestEnd::kStop);
  EXPECT_EQ(o.tokens, before);
  eos.use_model_eos = false;
  o = run_one(*eos_model, eos);
  EXPECT_EQ(o.end, RequestEnd::kLength);
  EXPECT_EQ(o.tokens, full);
}

TEST(EngineEnds, MaxTokensEndsWithLength) {
  const testing::Outcome o = run_one(*llama().model, greedy_request(kStopPrompt, 5));
  EXPECT_EQ(o.end, RequestEnd::kLength);
  const std::vector<std::int32_t> full = continuation(20);
  ASSERT_EQ(full.size(), 20u);
  EXPECT_EQ(o.tokens, std::vector<std::int32_t>(full.begin(), full.begin() + 5));
  EXPECT_EQ(o.stats.prompt_tokens, kStopPrompt.size());
  EXPECT_GE(o.stats.total_seconds, o.stats.time_to_first_token);
}

TEST(EngineEnds, StopStringCutsTheTextBeforeIt) {
  auto tokenizer =
      tokenizer::Tokenizer::load(test::model_fixture_dir("llama-tiny") + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EngineOptions options = no_cache();
  options.tokenizer = tokenizer->get();
  // Without stop strings the streamed text is the decoded continuation.
  const testing::Outcome plain = run_one(*llama().model, greedy_request(kStopPrompt, 30), options);
  const std::string text = (*tokenizer)->decode(plain.tokens, /*skip_special=*/true);
  EXPECT_EQ(plain.text, text);
  ASSERT_GE(text.size(), 12u) << "the continuation is too short to cut: '" << text << "'";
  // A stop string from the middle of the text (likely across tokens): everything before its
  // first occurrence, nothing after.
  const std::string stop = text.substr(text.size() / 2, 3);
  const std::size_t at = text.find(stop);
  EngineRequest request = greedy_request(kStopPrompt, 30);
  request.stop_strings = {"never appears \x01", stop};
  const testing::Outcome cut = run_one(*llama().model, request, options);
  EXPECT_EQ(cut.end, RequestEnd::kStop);
  EXPECT_EQ(cut.text, text.substr(0, at)) << "stop '" << stop << "'";
  EXPECT_LT(cut.tokens.size(), plain.tokens.size());
  // The tokens delivered are a prefix of the plain run's, ending before the stop string.
  EXPECT_TRUE(std::equal(cut.tokens.begin(), cut.tokens.end(), plain.tokens.begin()));
}

TEST(EngineEnds, CancelFreesTheSlotAtTheNextStep) {
  auto kv = make_kv(llama().config, 3);
  Collector collector;
  {
    EngineOptions options = no_cache();
    options.max_running = 1;
    auto engine = Engine::create(*llama().model, *kv, options);
    ASSERT_TRUE(engine.ok());
    const RequestId running =
        *(*engine)->submit(greedy_request(kStopPrompt, 40), collector.callback());
    const RequestId queued =
        *(*engine)->submit(greedy_request(kStopPrompt, 40), collector.callback());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*engine)->step().ok());
    EXPECT_EQ(kv->arena().stats().active_slots, 1u);
    EXPECT_EQ((*engine)->stats().waiting, 1u);
    (*engine)->cancel(running);
    (*engine)->cancel(queued);
    (*engine)->cancel(12345);  // unknown: ignored
    auto more = (*engine)->step();
    ASSERT_TRUE(more.ok());
    EXPECT_FALSE(*more);
    EXPECT_EQ(kv->arena().stats().active_slots, 0u);
    for (const RequestId id : {running, queued}) {
      const testing::Outcome o = collector.get(id);
      EXPECT_EQ(o.finished_events, 1);
      EXPECT_EQ(o.end, RequestEnd::kCancelled);
    }
    EXPECT_GT(collector.get(running).tokens.size(), 0u);
    EXPECT_EQ(collector.get(queued).tokens.size(), 0u);
    const EngineStats stats = (*engine)->stats();
    EXPECT_EQ(stats.cancelled, 2u);
    EXPECT_EQ(stats.running, 0u);
    EXPECT_EQ(stats.waiting, 0u);
    (*engine)->cancel(running);  // finished: ignored
    EXPECT_TRUE((*engine)->run_until_idle().ok());
    EXPECT_EQ(collector.get(running).finished_events, 1);
  }
  expect_clean(*kv);
}

TEST(EngineRefusals, SubmitNamesTheBadField) {
  auto kv = make_kv(llama().config, 2, 64);
  auto engine = Engine::create(*llama().model, *kv, no_cache());
  ASSERT_TRUE(engine.ok());
  auto refused = [&](EngineRequest request, const std::string& field) {
    auto id = (*engine)->submit(std::move(request), {});
    ASSERT_FALSE(id.ok()) << field;
    EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument) << id.status().to_string();
    EXPECT_NE(id.status().message().find(field), std::string::npos) << id.status().to_string();
  };
  refused(greedy_request({}, 4), "prompt");
  refused(greedy_request({1, 5000, 2}, 4), "prompt[1]");
  refused(greedy_request({1, -3}, 4), "prompt[1]");
  refused(greedy_request(kStopPrompt, 0), "max_tokens");
  refused(greedy_request(kStopPrompt, 57), "context of 64");
  EngineRequest hot = greedy_request(kStopPrompt, 4);
  hot.sampling.temperature = -1;
  refused(hot, "temperature");
  EngineRequest top = greedy_request(kStopPrompt, 4);
  top.sampling.top_p = 0;
  refused(top, "top_p");
  EngineRequest stop_id = greedy_request(kStopPrompt, 4);
  stop_id.stop_ids = {3, 1 << 20};
  refused(stop_id, "stop_ids[1]");
  EngineRequest stop_text = greedy_request(kStopPrompt, 4);
  stop_text.stop_strings = {"x"};
  refused(stop_text, "stop_strings");
  EXPECT_EQ((*engine)->stats().submitted, 0u);
  // At the limit exactly: accepted.
  EXPECT_TRUE((*engine)->submit(greedy_request(kStopPrompt, 56), {}).ok());
  EXPECT_TRUE((*engine)->run_until_idle().ok());
}

TEST(EngineRefusals, CreateNamesTheBadOption) {
  auto kv = make_kv(llama().config, 2);
  auto refused = [&](EngineOptions options, const std::string& field) {
    auto engine = Engine::create(*llama().model, *kv, options);
    ASSERT_FALSE(engine.ok()) << field;
    EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(engine.status().message().find(field), std::string::npos)
        << engine.status().to_string();
  };
  EngineOptions o = no_cache();
  o.max_running = 3;  // 2 slots
  refused(o, "max_running");
  o = no_cache();
  o.step_tokens = 100000;
  refused(o, "step_tokens");
  o = no_cache();
  o.max_running = 2;
  o.step_tokens = 1;
  refused(o, "exceeds step_tokens 1");
  o = no_cache();
  o.max_queue = 0;
  refused(o, "max_queue");
  o = no_cache();
  o.graph_batch_sizes = {2, 1};
  refused(o, "graph_batch_sizes[1]");
  expect_clean(*kv);
  // A KV space of another model's shape.
  model::ModelConfig other = llama().config;
  other.layers += 1;
  auto wrong = make_kv(other, 2);
  auto engine = Engine::create(*llama().model, *wrong, no_cache());
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("3 layers"), std::string::npos)
      << engine.status().to_string();
}

TEST(EngineRefusals, AFullQueueIsRefusedAsOverloaded) {
  auto kv = make_kv(llama().config, 2);
  Collector collector;
  {
    EngineOptions options = no_cache();
    options.max_queue = 2;
    options.max_running = 1;
    auto engine = Engine::create(*llama().model, *kv, options);
    ASSERT_TRUE(engine.ok());
    // The free running place and the queue's two.
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE((*engine)->submit(greedy_request(kStopPrompt, 4), collector.callback()).ok());
    }
    auto fourth = (*engine)->submit(greedy_request(kStopPrompt, 4), collector.callback());
    ASSERT_FALSE(fourth.ok());
    EXPECT_EQ(fourth.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(fourth.status().message().find("overloaded"), std::string::npos);
    EXPECT_GE((*engine)->retry_after(), 1.0);
    EXPECT_LE((*engine)->retry_after(), 3600.0);
    EXPECT_EQ((*engine)->stats().refused_overloaded, 1u);
    // One step admits one (max_running 1): it runs and two wait, the queue is still full.
    ASSERT_TRUE((*engine)->step().ok());
    EXPECT_FALSE((*engine)->submit(greedy_request(kStopPrompt, 4), collector.callback()).ok());
    // Once it drains there is room again.
    EXPECT_TRUE((*engine)->run_until_idle().ok());
    EXPECT_TRUE((*engine)->submit(greedy_request(kStopPrompt, 4), collector.callback()).ok());
    EXPECT_TRUE((*engine)->run_until_idle().ok());
    EXPECT_EQ(collector.finished_count(), 4u);
    EXPECT_EQ((*engine)->stats().finished, 4u);
    EXPECT_EQ((*engine)->stats().refused_overloaded, 2u);
  }
  expect_clean(*kv);
}

// One running place and a 5 ms bound on the queue wait: the queue-wait tests' engine.
EngineOptions one_place_waiting_5ms() {
  EngineOptions options = no_cache();
  options.max_running = 1;
  options.max_queue_wait = std::chrono::milliseconds(5);
  return options;
}

TEST(EngineRefusals, ARequestWaitingTooLongIsRefusedWithARetryEstimate) {
  auto kv = make_kv(llama().config, 2);
  Collector collector;
  {
    auto engine = Engine::create(*llama().model, *kv, one_place_waiting_5ms());
    ASSERT_TRUE(engine.ok());
    const RequestId first =
        *(*engine)->submit(greedy_request(kStopPrompt, 6), collector.callback());
    ASSERT_TRUE((*engine)->step().ok());  // admitted at once
    const RequestId second =
        *(*engine)->submit(greedy_request(kStopPrompt, 6), collector.callback());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE((*engine)->run_until_idle().ok());
    EXPECT_EQ(collector.get(first).end, RequestEnd::kLength);
    const testing::Outcome late = collector.get(second);
    EXPECT_EQ(late.end, RequestEnd::kError);
    EXPECT_EQ(late.error.code(), StatusCode::kResourceExhausted);
    EXPECT_NE(late.error.message().find("overloaded"), std::string::npos);
    EXPECT_GE(late.retry_after_seconds, 1.0);
    EXPECT_EQ((*engine)->stats().refused_overloaded, 1u);
    EXPECT_EQ((*engine)->stats().failed, 1u);
  }
  expect_clean(*kv);
}

// The wait bound answers a full engine, not a late step: a request the step can admit is
// admitted however long ago it came, and only one left waiting behind it is refused.
TEST(EngineRefusals, ARequestTheStepCanAdmitIsNeverRefusedForItsWait) {
  auto kv = make_kv(llama().config, 2);
  Collector collector;
  {
    auto engine = Engine::create(*llama().model, *kv, one_place_waiting_5ms());
    ASSERT_TRUE(engine.ok());
    const RequestId first =
        *(*engine)->submit(greedy_request(kStopPrompt, 6), collector.callback());
    const RequestId second =
        *(*engine)->submit(greedy_request(kStopPrompt, 6), collector.callback());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // both past the bound
    EXPECT_TRUE((*engine)->run_until_idle().ok());
    EXPECT_EQ(collector.get(first).end, RequestEnd::kLength);
    EXPECT_GE(collector.get(first).stats.queue_seconds, 0.005);
    const testing::Outcome late = collector.get(second);
    EXPECT_EQ(late.end, RequestEnd::kError);
    EXPECT_NE(late.error.message().find("overloaded"), std::string::npos);
    EXPECT_EQ((*engine)->stats().refused_overloaded, 1u);
    EXPECT_EQ((*engine)->stats().finished, 1u);
  }
  expect_clean(*kv);
}

// An engine over llama-tiny on `kv` with its thread started; null (after a failed
// expectation) where it could not be made or started.
std::unique_ptr<Engine> started_engine(KvSpace& kv) {
  auto engine = Engine::create(*llama().model, kv, no_cache());
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  if (!engine.ok()) return nullptr;
  const Status started = (*engine)->start();
  EXPECT_TRUE(started.ok()) << started.to_string();
  if (!started.ok()) return nullptr;
  return std::move(engine).value();
}

// Submits `n` greedy requests of `max_tokens` after kStopPrompt; false where one is refused.
bool submit_all(Engine& engine, Collector& collector, int n, std::uint32_t max_tokens) {
  for (int i = 0; i < n; ++i) {
    auto id = engine.submit(greedy_request(kStopPrompt, max_tokens), collector.callback());
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    if (!id.ok()) return false;
  }
  return true;
}

TEST(EngineThread, StartServesAndDrainFinishes) {
  auto kv = make_kv(llama().config, 3);
  Collector collector;
  {
    auto engine = started_engine(*kv);
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(engine->start().code(), StatusCode::kFailedPrecondition);
    ASSERT_TRUE(submit_all(*engine, collector, 3, 8));
    // stats() and retry_after() from another thread while the engine's thread steps.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (engine->stats().finished < 2 && std::chrono::steady_clock::now() < deadline) {
      EXPECT_GE(engine->retry_after(), 1.0);
      std::this_thread::yield();
    }
    EXPECT_TRUE(engine->drain(std::chrono::seconds(30)));
    EXPECT_EQ(collector.finished_count(), 3u);
    auto late = engine->submit(greedy_request(kStopPrompt, 8), collector.callback());
    EXPECT_EQ(late.status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(engine->stats().finished, 3u);
  }
  expect_clean(*kv);
}

TEST(EngineThread, DrainPastItsDeadlineCancelsTheRest) {
  auto kv = make_kv(llama().config, 3);
  Collector collector;
  {
    auto engine = started_engine(*kv);
    ASSERT_NE(engine, nullptr);
    ASSERT_TRUE(submit_all(*engine, collector, 4, 100));
    EXPECT_FALSE(engine->drain(std::chrono::milliseconds(0)));
    EXPECT_EQ(collector.finished_count(), 4u);  // every request ended, once
    EXPECT_GT(engine->stats().cancelled, 0u);
  }
  expect_clean(*kv);
}

TEST(EngineThread, DestroyingARunningEngineCancelsWhatIsLeft) {
  auto kv = make_kv(llama().config, 3);
  Collector collector;
  {
    auto engine = started_engine(*kv);
    ASSERT_NE(engine, nullptr);
    ASSERT_TRUE(submit_all(*engine, collector, 3, 100));
  }
  EXPECT_EQ(collector.finished_count(), 3u);
  expect_clean(*kv);
}

// The queue ahead at the measured admission rate, clamped to [1 s, 1 h].
TEST(EngineRetryEstimate, FollowsTheRecentAdmissionRate) {
  using std::chrono::milliseconds;
  RetryEstimate estimate;
  const auto t0 = RetryEstimate::Clock::now();
  // Nothing admitted yet: one second per running slot's worth of the queue.
  EXPECT_DOUBLE_EQ(estimate.seconds(7, 4, t0), 2.0);
  EXPECT_DOUBLE_EQ(estimate.seconds(0, 4, t0), 1.0);
  // 11 admissions 100 ms apart: 10 a second; 39 ahead and the refused one take 4 s.
  for (int i = 0; i <= 10; ++i) estimate.note_admission(t0 + milliseconds(100 * i));
  const auto now = t0 + milliseconds(1000);
  EXPECT_NEAR(estimate.seconds(39, 4, now), 4.0, 1e-9);
  EXPECT_DOUBLE_EQ(estimate.seconds(100000, 4, now), RetryEstimate::kMaxSeconds);
  // Admissions a minute old say nothing: back to the no-data estimate.
  EXPECT_DOUBLE_EQ(estimate.seconds(7, 4, now + std::chrono::minutes(2)), 2.0);
}

}  // namespace
}  // namespace kvvm::engine
