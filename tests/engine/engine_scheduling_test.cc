// Scheduling under load, on the CPU with a fake clock (no assertion depends on wall time):
// - a submit predicted to wait past max_queue_wait (the queue ahead of it over the measured
//   admission rate, times how far recent predictions fell short) is refused at once, never on
//   a guess before a rate is measured, and the late refusal in the queue stays as the backstop;
// - admission takes only the room the running sequences' growth leaves, and only with a chunk
//   of the step to compute: a request is never admitted and then preempted unrun;
// - max_prefill_tokens_while_decoding bounds the prompt tokens of a step that also decodes;
// - tpot_target sizes that bound from the steps' measured times (a model whose steps take a
//   known time on the fake clock);
// - the wait forecast refuses at arrival a request that a long running answer and the one in
//   line behind it would keep waiting past the bound, which the admission rate alone accepts
//   and the queue then refuses late; nothing is forecast before 8 answers have ended.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/retry_estimate.h"
#include "kvvm/model/model.h"
#include "support/engine_harness.h"

namespace kvvm::engine::scheduling_test {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::Collector;
using testing::EngineRig;
using testing::expect_clean;
using testing::greedy_request;
using testing::llama;
using testing::make_kv;
using testing::no_cache;
using testing::rig_prompt;
using testing::solo_tokens;

using SteadyClock = std::chrono::steady_clock;

// The scheduler's time, moved only by the test.
class FakeClock {
 public:
  std::function<SteadyClock::time_point()> fn() {
    return [this] { return now_; };
  }
  void advance(SteadyClock::duration by) { now_ += by; }
  SteadyClock::time_point now() const { return now_; }

 private:
  SteadyClock::time_point now_ = SteadyClock::time_point{} + std::chrono::hours(1);
};

bool mentions_overloaded(const Status& status) {
  return status.message().find("overloaded") != std::string::npos;
}

// --- RetryEstimate --------------------------------------------------------------------------

TEST(SchedulingRetryEstimate, PredictsNothingBeforeTwoAdmissions) {
  RetryEstimate estimate;
  const SteadyClock::time_point t0 = SteadyClock::time_point{} + std::chrono::hours(1);
  EXPECT_FALSE(estimate.predicted_wait(10, t0).has_value());
  estimate.note_admission(t0);
  EXPECT_FALSE(estimate.predicted_wait(10, t0 + seconds(5)).has_value());
  estimate.note_admission(t0 + seconds(2));
  // One admission inside the 4 s since the first: 0.25 per second.
  const std::optional<double> wait = estimate.predicted_wait(10, t0 + seconds(4));
  ASSERT_TRUE(wait.has_value());
  EXPECT_DOUBLE_EQ(*wait, 40.0);
  EXPECT_DOUBLE_EQ(*estimate.predicted_wait(0, t0 + seconds(4)), 0.0);
  // The retry estimate counts the refused request too, at the same rate.
  EXPECT_DOUBLE_EQ(estimate.seconds(10, 4, t0 + seconds(4)), 44.0);
  // Admissions older than the window measure nothing any more.
  EXPECT_FALSE(estimate.predicted_wait(10, t0 + seconds(600)).has_value());
}

// The margin: the largest waited / predicted of the recent admissions, a prediction under the
// floor counted as the floor, within [1, 8]; the oldest sample leaves after 32 newer ones.
TEST(SchedulingRetryEstimate, TheMarginIsTheWorstRecentShortfall) {
  RetryEstimate estimate;
  EXPECT_DOUBLE_EQ(estimate.margin(), 1.0);
  estimate.note_wait(4.0, 2.0, 1.0);  // shorter than predicted: no margin
  EXPECT_DOUBLE_EQ(estimate.margin(), 1.0);
  estimate.note_wait(4.0, 6.0, 1.0);
  EXPECT_DOUBLE_EQ(estimate.margin(), 1.5);
  estimate.note_wait(0.1, 2.0, 1.0);  // predicted under the floor: 2 / 1
  EXPECT_DOUBLE_EQ(estimate.margin(), 2.0);
  estimate.note_wait(0.0, 100.0, 1.0);
  EXPECT_DOUBLE_EQ(estimate.margin(), RetryEstimate::kMaxMargin);
  estimate.note_wait(1.0, 5.0, 0.0);  // no floor (a zero bound's quarter)
  for (int i = 0; i < 31; ++i) estimate.note_wait(1.0, 1.0, 1.0);
  EXPECT_DOUBLE_EQ(estimate.margin(), 5.0);  // the 100-s wait has left the window
  estimate.note_wait(1.0, 1.0, 1.0);
  EXPECT_DOUBLE_EQ(estimate.margin(), 1.0);
  estimate.note_wait(0.0, 1.0, 0.0);  // nothing to measure against: not a sample
  EXPECT_DOUBLE_EQ(estimate.margin(), 1.0);
}

// Admissions into free places (a cold engine filling up) are as fast as the arrivals; once
// requests wait, the rate is at most the backlog's (admitted + 1) / seconds waited.
TEST(SchedulingRetryEstimate, TheDrainWhileRequestsWaitedBoundsTheRate) {
  RetryEstimate estimate;
  const SteadyClock::time_point t0 = SteadyClock::time_point{} + std::chrono::hours(1);
  // Eleven places filled in 0.1 s: the window measures 100 admissions a second.
  for (int i = 0; i <= 10; ++i) estimate.note_admission(t0 + milliseconds(10 * i));
  estimate.note_step(t0 + milliseconds(100), /*backlog=*/false, 11);
  EXPECT_NEAR(*estimate.predicted_wait(10, t0 + milliseconds(100)), 0.1, 1e-12);
  // Then requests wait 0.5 s and no place frees: at most 1 / 0.5 s, 5 s for ten ahead (the
  // window alone: 10 / 0.6 s, 0.6 s).
  estimate.note_step(t0 + milliseconds(600), /*backlog=*/true, 0);
  EXPECT_NEAR(*estimate.predicted_wait(10, t0 + milliseconds(600)), 5.0, 1e-12);
  EXPECT_DOUBLE_EQ(estimate.seconds(9, 4, t0 + milliseconds(600)), 5.0);  // Retry-After too
  // Two places free in the next 0.5 s: 3 over the 0.5 s decayed by e^(-0.5 / 30) and the new 0.5.
  estimate.note_admission(t0 + milliseconds(800));
  estimate.note_admission(t0 + milliseconds(1100));
  estimate.note_step(t0 + milliseconds(1100), /*backlog=*/true, 2);
  const double waited = 0.5 * std::exp(-0.5 / RetryEstimate::kBacklogDecay) + 0.5;
  EXPECT_NEAR(*estimate.predicted_wait(6, t0 + milliseconds(1100)), 6 * waited / 3, 1e-12);
  // A long drain while waiting leaves the window's rate the smaller: it is used again.
  for (int i = 1; i <= 100; ++i) {
    estimate.note_step(t0 + milliseconds(1100 + 100 * i), /*backlog=*/true, 5);
  }
  const SteadyClock::time_point later = t0 + milliseconds(11100);
  EXPECT_NEAR(*estimate.predicted_wait(6, later), 6 * 11.1 / 12, 1e-9);
}

// --- Early refusal --------------------------------------------------------------------------

// Declared so the engine goes first: its end may still run callbacks and read the clock.
struct QueueRig {
  FakeClock clock;
  Collector collector;
  std::unique_ptr<KvSpace> kv;
  std::unique_ptr<Engine> engine;
};

EngineRequest short_request(std::uint64_t seed) { return greedy_request(rig_prompt(5, seed), 2); }

// One running place, a 10 s queue-wait bound, and two admissions 4 s apart: a measured rate of
// one admission per 4 s.
void make_measured(QueueRig& rig, bool refuse_predicted) {
  testing::FixtureModel& m = llama();
  rig.kv = make_kv(m.config, 4);
  ASSERT_NE(rig.kv, nullptr);
  EngineOptions options = no_cache();
  options.max_running = 1;
  options.max_queue_wait = seconds(10);
  options.refuse_predicted_wait = refuse_predicted;
  options.clock = rig.clock.fn();
  auto made = Engine::create(*m.model, *rig.kv, options);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  rig.engine = std::move(made).value();
  ASSERT_TRUE(rig.engine->submit(short_request(1), rig.collector.callback()).ok());
  ASSERT_TRUE(rig.engine->run_until_idle().ok());
  rig.clock.advance(seconds(4));
  ASSERT_TRUE(rig.engine->submit(short_request(2), rig.collector.callback()).ok());
  ASSERT_TRUE(rig.engine->run_until_idle().ok());
  ASSERT_EQ(rig.collector.finished_count(), 2u);
}

TEST(SchedulingEarlyRefusal, RefusesAtSubmitWhenThePredictedWaitExceedsTheBound) {
  QueueRig rig;
  ASSERT_NO_FATAL_FAILURE(make_measured(rig, /*refuse_predicted=*/true));
  // Queued ahead: 0, 1, 2 requests, predicted waits 0, 4, 8 s: within the 10 s bound.
  std::vector<RequestId> accepted;
  for (std::uint64_t i = 0; i < 3; ++i) {
    Result<RequestId> id = rig.engine->submit(short_request(10 + i), rig.collector.callback());
    ASSERT_TRUE(id.ok()) << i << ": " << id.status().to_string();
    accepted.push_back(*id);
  }
  // Three ahead: 12 s predicted, past the bound: refused now, with no callback.
  Result<RequestId> refused = rig.engine->submit(short_request(20), rig.collector.callback());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(mentions_overloaded(refused.status())) << refused.status().to_string();
  EXPECT_TRUE(refused.status().message().find("max_queue_wait 10000 ms") != std::string::npos)
      << refused.status().to_string();
  // Retry-After: the queue and the refused request itself at the measured rate.
  EXPECT_DOUBLE_EQ(rig.engine->retry_after(), 16.0);
  EngineStats stats = rig.engine->stats();
  EXPECT_EQ(stats.refused_overloaded, 1u);
  EXPECT_EQ(stats.refused_predicted_wait, 1u);
  EXPECT_EQ(stats.refused_in_queue, 0u);
  EXPECT_EQ(stats.waiting, 3u);

  // The accepted ones are served; nothing was refused late.
  ASSERT_TRUE(rig.engine->run_until_idle().ok());
  for (const RequestId id : accepted) {
    EXPECT_TRUE(rig.collector.get(id).completed()) << id;
  }
  EXPECT_EQ(rig.collector.finished_count(), 5u);
  stats = rig.engine->stats();
  EXPECT_EQ(stats.refused_in_queue, 0u);
  EXPECT_EQ(stats.finished, 5u);
  rig.engine.reset();
  expect_clean(*rig.kv);
}

// A wait that outlasted its prediction makes the next predictions count for more: a request
// the bare prediction would accept (5 s ahead of it, bound 10 s) is refused at arrival once a
// wait came out 2.4x its prediction, and the message says so.
TEST(SchedulingEarlyRefusal, WaitsLongerThanPredictedWidenTheMargin) {
  QueueRig rig;
  ASSERT_NO_FATAL_FAILURE(make_measured(rig, /*refuse_predicted=*/true));
  // Nothing ahead: predicted 0 s, counted as the floor of 2.5 s (a quarter of the bound). No
  // step runs for 6 s: it waits 6 s, 2.4x.
  Result<RequestId> first = rig.engine->submit(short_request(10), rig.collector.callback());
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  rig.clock.advance(seconds(6));
  ASSERT_TRUE(rig.engine->step().ok());  // admitted
  ASSERT_TRUE(rig.engine->run_until_idle().ok());
  ASSERT_TRUE(rig.collector.get(*first).completed());
  // Admissions 4 s and 6 s apart: 0.2 a second. One ahead: 5 s predicted, 12 s with the margin.
  Result<RequestId> second = rig.engine->submit(short_request(11), rig.collector.callback());
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  Result<RequestId> third = rig.engine->submit(short_request(12), rig.collector.callback());
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(mentions_overloaded(third.status())) << third.status().to_string();
  EXPECT_NE(third.status().message().find("about 5 s to admit, recent waits up to 2.4x their "
                                          "prediction (max_queue_wait 10000 ms)"),
            std::string::npos)
      << third.status().to_string();
  EngineStats stats = rig.engine->stats();
  EXPECT_EQ(stats.refused_predicted_wait, 1u);
  EXPECT_EQ(stats.refused_in_queue, 0u);
  ASSERT_TRUE(rig.engine->run_until_idle().ok());
  EXPECT_TRUE(rig.collector.get(*second).completed());
  rig.engine.reset();
  expect_clean(*rig.kv);
}

TEST(SchedulingEarlyRefusal, OffTheBackstopRefusesLateInTheQueue) {
  QueueRig rig;
  ASSERT_NO_FATAL_FAILURE(make_measured(rig, /*refuse_predicted=*/false));
  std::vector<RequestId> ids;
  for (std::uint64_t i = 0; i < 4; ++i) {
    Result<RequestId> id = rig.engine->submit(short_request(10 + i), rig.collector.callback());
    ASSERT_TRUE(id.ok()) << i << ": " << id.status().to_string();
    ids.push_back(*id);
  }
  // Past the bound before any step: the first is admitted (a request the step can admit is
  // served however late), the three behind it are refused in the queue.
  rig.clock.advance(seconds(11));
  ASSERT_TRUE(rig.engine->run_until_idle().ok());
  EXPECT_TRUE(rig.collector.get(ids[0]).completed());
  for (std::size_t i = 1; i < ids.size(); ++i) {
    const testing::Outcome o = rig.collector.get(ids[i]);
    EXPECT_EQ(o.finished_events, 1) << i;
    EXPECT_EQ(o.end, RequestEnd::kError) << i;
    EXPECT_TRUE(mentions_overloaded(o.error)) << i << ": " << o.error.to_string();
    EXPECT_GT(o.retry_after_seconds, 0.0) << i;
    EXPECT_TRUE(o.tokens.empty()) << i;
  }
  const EngineStats stats = rig.engine->stats();
  EXPECT_EQ(stats.refused_predicted_wait, 0u);
  EXPECT_EQ(stats.refused_in_queue, 3u);
  EXPECT_EQ(stats.refused_overloaded, 3u);
  rig.engine.reset();
  expect_clean(*rig.kv);
}

// A cold engine has measured no rate: however small the bound and long the queue, only the
// existing bounds refuse; one admission measures none either.
TEST(SchedulingEarlyRefusal, AColdEngineRefusesNothingOnAPrediction) {
  testing::FixtureModel& m = llama();
  FakeClock clock;
  auto kv = make_kv(m.config, 4);
  ASSERT_NE(kv, nullptr);
  EngineOptions options = no_cache();
  options.max_running = 1;
  options.max_queue_wait = milliseconds(1);
  options.clock = clock.fn();
  Collector collector;
  {
    auto engine = Engine::create(*m.model, *kv, options);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    for (std::uint64_t i = 0; i < 20; ++i) {
      Result<RequestId> id = (*engine)->submit(short_request(i), collector.callback());
      ASSERT_TRUE(id.ok()) << i << ": " << id.status().to_string();
    }
    ASSERT_TRUE((*engine)->step().ok());  // one admission
    clock.advance(milliseconds(500));     // within no bound the queue could meet: no step ran
    for (std::uint64_t i = 20; i < 25; ++i) {
      Result<RequestId> id = (*engine)->submit(short_request(i), collector.callback());
      ASSERT_TRUE(id.ok()) << i << ": " << id.status().to_string();
    }
    EXPECT_EQ((*engine)->stats().refused_overloaded, 0u);
  }
  // The engine's end cancelled what was left: every submitted request ended exactly once.
  EXPECT_EQ(collector.finished_count(), 25u);
  expect_clean(*kv);
}

// --- Admission ------------------------------------------------------------------------------

// llama-tiny's token-major token is 2 KiB: a 16 KiB window holds 8 tokens.
constexpr std::uint64_t kWindowBytes = 16 << 10;

KvSpaceOptions windows_space(std::uint64_t windows) {
  KvSpaceOptions options;
  options.host_granule = kWindowBytes;
  options.max_slots = 4;
  options.max_context = 64;
  options.budget_bytes = windows * kWindowBytes;
  return options;
}

// Two windows of budget: A's decode grows into the second while B's prompt would take it. B
// waits; it is not admitted, its prompt committed, and then preempted by A's growth unrun.
TEST(SchedulingAdmission, LeavesTheRoomARunningSequenceGrowsInto) {
  const KvSpaceOptions space = windows_space(2);
  const EngineOptions options = no_cache();
  auto rig = EngineRig::make(llama(), space, options);
  ASSERT_NE(rig, nullptr);
  const std::size_t a = rig->submit(greedy_request(rig_prompt(8, 1), 8));
  ASSERT_TRUE(rig->engine().step().ok());  // A's prompt fills its first window
  ASSERT_EQ(rig->outcome(a).tokens.size(), 1u);
  const std::size_t b = rig->submit(greedy_request(rig_prompt(8, 2), 4));
  ASSERT_TRUE(rig->engine().step().ok());  // A's next token writes into a second window
  EXPECT_EQ(rig->outcome(a).tokens.size(), 2u);
  EngineStats stats = rig->engine().stats();
  EXPECT_EQ(stats.preemptions, 0u);
  EXPECT_EQ(stats.running, 1u);
  EXPECT_EQ(stats.waiting, 1u);

  ASSERT_TRUE(rig->run().ok());
  for (const std::size_t i : {a, b}) {
    const testing::Outcome& o = rig->outcome(i);
    ASSERT_TRUE(o.completed()) << i << ": " << o.error.to_string();
    EXPECT_EQ(o.stats.preemptions, 0u) << i;
    EXPECT_EQ(o.tokens, solo_tokens(llama(), space, options, o.request)) << i;
  }
  EXPECT_EQ(rig->engine().stats().preemptions, 0u);
  rig->expect_ledger_returns("after admission waited for room");
}

// A step whose token budget the running prompt takes admits nothing: a request holds KV only
// from the step that starts computing it.
TEST(SchedulingAdmission, WaitsForAChunkOfTheStepToCompute) {
  KvSpaceOptions space = windows_space(0);
  space.max_context = 128;
  EngineOptions options = no_cache();
  options.step_tokens = 8;
  auto rig = EngineRig::make(llama(), space, options);
  ASSERT_NE(rig, nullptr);
  const std::size_t first = rig->submit(greedy_request(rig_prompt(40, 3), 2));
  const std::size_t second = rig->submit(greedy_request(rig_prompt(5, 4), 2));
  ASSERT_TRUE(rig->engine().step().ok());  // 8 of the first's 40 prompt tokens
  const EngineStats stats = rig->engine().stats();
  EXPECT_EQ(stats.running, 1u);
  EXPECT_EQ(stats.waiting, 1u);
  EXPECT_EQ(rig->kv().arena().stats().active_slots, 1u);
  ASSERT_TRUE(rig->run().ok());
  for (const std::size_t i : {first, second}) {
    const testing::Outcome& o = rig->outcome(i);
    ASSERT_TRUE(o.completed()) << i << ": " << o.error.to_string();
    EXPECT_EQ(o.tokens, solo_tokens(llama(), space, options, o.request)) << i;
  }
  rig->expect_ledger_returns("after admission waited for the step's budget");
}

// --- Prefill share --------------------------------------------------------------------------

KvSpaceOptions roomy_space() {
  KvSpaceOptions options;
  options.max_slots = 3;
  options.max_context = 128;
  return options;
}

// A running answer gains a token every step while a 40-token prompt beside it is computed two
// tokens a step, not the seven the step's budget would leave; the tokens are those alone.
TEST(SchedulingPrefillShare, BoundsThePromptTokensOfAStepThatDecodes) {
  EngineOptions options = no_cache();
  options.step_tokens = 8;
  options.max_prefill_tokens_while_decoding = 2;
  auto rig = EngineRig::make(llama(), roomy_space(), options);
  ASSERT_NE(rig, nullptr);
  const std::size_t first = rig->submit(greedy_request(rig_prompt(3, 50), 30));
  ASSERT_TRUE(rig->engine().step().ok());  // its prompt and first token
  ASSERT_EQ(rig->outcome(first).tokens.size(), 1u);
  const std::uint64_t before = rig->engine().stats().step_tokens.tokens;
  const std::size_t second = rig->submit(greedy_request(rig_prompt(40, 51), 4));
  for (std::size_t i = 2; i <= 11; ++i) {
    ASSERT_TRUE(rig->engine().step().ok());
    EXPECT_EQ(rig->outcome(first).tokens.size(), i) << "a step without the decode token";
  }
  // Ten steps of one decode token and two prompt tokens: 20 of the 40, no answer yet.
  EXPECT_EQ(rig->engine().stats().step_tokens.tokens - before, 30u);
  EXPECT_TRUE(rig->outcome(second).tokens.empty());
  ASSERT_TRUE(rig->run().ok());
  for (const std::size_t i : {first, second}) {
    const testing::Outcome& o = rig->outcome(i);
    ASSERT_TRUE(o.completed()) << i << ": " << o.error.to_string();
    EXPECT_EQ(o.tokens, solo_tokens(llama(), roomy_space(), no_cache(), o.request)) << i;
  }
  rig->expect_ledger_returns("after bounded prefill");
}

// With nothing decoding the bound does not apply: a lone prompt takes the whole step.
TEST(SchedulingPrefillShare, AStepWithoutADecodeIsNotBounded) {
  EngineOptions options = no_cache();
  options.step_tokens = 8;
  options.max_prefill_tokens_while_decoding = 2;
  auto rig = EngineRig::make(llama(), roomy_space(), options);
  ASSERT_NE(rig, nullptr);
  const std::size_t only = rig->submit(greedy_request(rig_prompt(20, 52), 2));
  ASSERT_TRUE(rig->engine().step().ok());
  EXPECT_EQ(rig->engine().stats().step_tokens.tokens, 8u);
  ASSERT_TRUE(rig->run().ok());
  EXPECT_TRUE(rig->outcome(only).completed());
  rig->expect_ledger_returns("after an unbounded prefill");
}

TEST(SchedulingPrefillShare, ABoundAboveTheStepBudgetIsRefusedNamingIt) {
  testing::FixtureModel& m = llama();
  auto kv = make_kv(m.config, 3);
  ASSERT_NE(kv, nullptr);
  EngineOptions options = no_cache();
  options.step_tokens = 8;
  options.max_prefill_tokens_while_decoding = 9;
  auto made = Engine::create(*m.model, *kv, options);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  const std::string message = made.status().message();
  EXPECT_TRUE(message.find("max_prefill_tokens_while_decoding 9") != std::string::npos) << message;
  EXPECT_TRUE(message.find("step_tokens 8") != std::string::npos) << message;
}

// --- tpot_target --------------------------------------------------------------------------

// The fixture's model, each step of which takes `fixed` + `per_token` a token on the fake clock
// (and nothing else moves it): the step times the engine measures are exactly that line.
class TimedModel : public model::Model {
 public:
  TimedModel(model::Model& inner, FakeClock& clock, microseconds fixed, microseconds per_token)
      : Model(inner.config(), inner.limits()),
        inner_(inner),
        clock_(clock),
        fixed_(fixed),
        per_token_(per_token) {}
  model::Backend backend() const override { return inner_.backend(); }
  Status forward(const model::StepBatch& batch, const model::StepOutput& out) override {
    clock_.advance(fixed_ + per_token_ * static_cast<std::int64_t>(batch.token_ids.size()));
    steps.push_back(batch.token_ids.size());
    return inner_.forward(batch, out);
  }
  std::vector<std::size_t> steps;  // each step's tokens

 private:
  model::Model& inner_;
  FakeClock& clock_;
  microseconds fixed_, per_token_;
};

struct TimedRig {
  FakeClock clock;
  testing::FixtureModel fixture;  // owns the TimedModel
  TimedModel* model = nullptr;
  std::unique_ptr<EngineRig> rig;
};

// The llama fixture behind a TimedModel of `fixed` a step + `per_token` a token.
std::unique_ptr<TimedRig> timed_rig(EngineOptions options, microseconds fixed = microseconds(1000),
                                    microseconds per_token = microseconds(100)) {
  auto t = std::make_unique<TimedRig>();
  testing::FixtureModel& base = llama();
  auto model = std::make_unique<TimedModel>(*base.model, t->clock, fixed, per_token);
  t->model = model.get();
  t->fixture.config = base.config;
  t->fixture.limits = base.limits;
  t->fixture.model = std::move(model);
  options.clock = t->clock.fn();
  t->rig = EngineRig::make(t->fixture, roomy_space(), options);
  if (t->rig == nullptr) return nullptr;
  return t;
}

// Once the fit has seen steps of two sizes, a step that decodes computes only the prompt
// tokens the target leaves: 3 ms at 1 ms + 100 us a token is 20 tokens, one of them the decode.
TEST(SchedulingTpotTarget, KeepsADecodingStepWithinTheTargetOnceFitted) {
  EngineOptions options = no_cache();
  options.step_tokens = 64;
  options.tpot_target = microseconds(3050);
  auto t = timed_rig(options);
  ASSERT_NE(t, nullptr);
  EngineRig& rig = *t->rig;
  const std::size_t first = rig.submit(greedy_request(rig_prompt(30, 60), 20));
  ASSERT_TRUE(rig.engine().step().ok());  // 30 tokens: the prompt and its first token
  ASSERT_TRUE(rig.engine().step().ok());  // 1 token: the fit has two sizes now
  const std::size_t second = rig.submit(greedy_request(rig_prompt(60, 61), 4));
  const std::size_t before = t->model->steps.size();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(rig.engine().step().ok());
  // Each of the three: the decode token and 19 of the 60 prompt tokens (20 x 100 us + 1 ms).
  ASSERT_EQ(t->model->steps.size(), before + 3);
  for (std::size_t i = before; i < before + 3; ++i) {
    EXPECT_EQ(t->model->steps[i], 20u) << "step " << i;
  }
  EXPECT_TRUE(rig.outcome(second).tokens.empty());
  ASSERT_TRUE(rig.run().ok());
  for (const std::size_t i : {first, second}) {
    const testing::Outcome& o = rig.outcome(i);
    ASSERT_TRUE(o.completed()) << i << ": " << o.error.to_string();
    EXPECT_EQ(o.tokens, solo_tokens(llama(), roomy_space(), no_cache(), o.request)) << i;
  }
  rig.expect_ledger_returns("after steps sized to a target");
}

// No bound while the fit has seen steps of one size; a target the decodes alone exceed leaves
// the floor (prompts still advance); max_prefill_tokens_while_decoding still bounds below it.
TEST(SchedulingTpotTarget, BoundsNothingBeforeTheFitAndLeavesTheFloorUnderIt) {
  EngineOptions options = no_cache();
  options.step_tokens = 64;
  options.tpot_target = microseconds(500);  // below even a decode step's 1.1 ms
  auto t = timed_rig(options);
  ASSERT_NE(t, nullptr);
  EngineRig& rig = *t->rig;
  rig.submit(greedy_request(rig_prompt(30, 62), 30));
  ASSERT_TRUE(rig.engine().step().ok());  // 30 tokens
  rig.submit(greedy_request(rig_prompt(40, 63), 30));
  ASSERT_TRUE(rig.engine().step().ok());  // unfitted: the decode and all 40 prompt tokens
  ASSERT_EQ(t->model->steps.back(), 41u);
  rig.submit(greedy_request(rig_prompt(40, 64), 30));
  ASSERT_TRUE(rig.engine().step().ok());  // fitted: two decodes and the floor's 16
  EXPECT_EQ(t->model->steps.back(), 2u + kTpotPrefillFloor);

  EngineOptions both = no_cache();
  both.step_tokens = 64;
  both.tpot_target = microseconds(3050);
  both.max_prefill_tokens_while_decoding = 5;
  auto u = timed_rig(both);
  ASSERT_NE(u, nullptr);
  u->rig->submit(greedy_request(rig_prompt(30, 65), 30));
  ASSERT_TRUE(u->rig->engine().step().ok());
  ASSERT_TRUE(u->rig->engine().step().ok());
  u->rig->submit(greedy_request(rig_prompt(40, 66), 30));
  ASSERT_TRUE(u->rig->engine().step().ok());
  EXPECT_EQ(u->model->steps.back(), 6u) << "the fixed bound is below the target's 19";
  ASSERT_TRUE(rig.run().ok());
  ASSERT_TRUE(u->rig->run().ok());
}

TEST(SchedulingTpotTarget, ANegativeTargetIsRefusedNamingIt) {
  testing::FixtureModel& m = llama();
  auto kv = make_kv(m.config, 3);
  ASSERT_NE(kv, nullptr);
  EngineOptions options = no_cache();
  options.tpot_target = microseconds(-5);
  auto made = Engine::create(*m.model, *kv, options);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("tpot_target -5 us"), std::string::npos)
      << made.status().message();
}

// --- The wait forecast ----------------------------------------------------------------------

// One running place, steps of 10 ms on the fake clock, a 1-s bound. `learned` two-token answers
// end first (each at its max_tokens, admitted 20 ms apart: the rate is 50 a second); then a
// 60-token answer runs, a second waits in line behind it, and a third arrives: it would wait
// for both, 1.18 s. The rate predicts 20 ms.
struct WaveOutcome {
  std::size_t running = 0, in_line = 0, third = 0;
};
WaveOutcome long_answers_ahead(TimedRig& t) {
  EngineRig& rig = *t.rig;
  WaveOutcome w;
  w.running = rig.submit(greedy_request(rig_prompt(5, 71), 60));
  EXPECT_TRUE(rig.engine().step().ok());  // its prompt and first token
  w.in_line = rig.submit(greedy_request(rig_prompt(5, 72), 60));
  EXPECT_TRUE(rig.engine().step().ok());  // in line: the place is held
  EXPECT_TRUE(rig.outcome(w.in_line).tokens.empty());
  w.third = rig.submit(greedy_request(rig_prompt(5, 73), 60));
  return w;
}

// The third is accepted at arrival, then refused in the queue after the whole bound; the one in
// line is served.
void expect_accepted_then_refused_late(TimedRig& t) {
  const WaveOutcome w = long_answers_ahead(t);
  ASSERT_FALSE(t.rig->outcome(w.third).refused_at_submit());
  ASSERT_TRUE(t.rig->run().ok());
  EXPECT_TRUE(t.rig->outcome(w.third).overloaded_in_queue());
  EXPECT_TRUE(t.rig->outcome(w.in_line).completed());
}

std::unique_ptr<TimedRig> learned_rig(bool forecast, int learned) {
  EngineOptions options = no_cache();
  options.max_running = 1;
  options.max_queue_wait = seconds(1);
  options.wait_forecast = forecast;
  auto t = timed_rig(options, microseconds(10000), microseconds(0));
  if (t == nullptr) return nullptr;
  for (int i = 0; i < learned; ++i) {
    t->rig->submit(greedy_request(rig_prompt(5, 80 + static_cast<std::uint64_t>(i)), 2));
  }
  EXPECT_TRUE(t->rig->run().ok());
  return t;
}

TEST(SchedulingWaitForecast, RefusesAtArrivalWhatTheRateAcceptsAndTheQueueRefusesLate) {
  // The forecast: the third is refused at once, the other two are served.
  auto on = learned_rig(/*forecast=*/true, 8);
  ASSERT_NE(on, nullptr);
  const WaveOutcome w = long_answers_ahead(*on);
  const testing::Outcome& refused = on->rig->outcome(w.third);
  ASSERT_TRUE(refused.refused_at_submit());
  EXPECT_EQ(refused.submit_status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.submit_status.message().find(
                "about 1 s to admit (the work the running answers and the queue have left)"),
            std::string::npos)
      << refused.submit_status.to_string();
  ASSERT_TRUE(on->rig->run().ok());
  EXPECT_TRUE(on->rig->outcome(w.running).completed());
  EXPECT_TRUE(on->rig->outcome(w.in_line).completed());
  EngineStats stats = on->rig->engine().stats();
  EXPECT_EQ(stats.refused_predicted_wait, 1u);
  EXPECT_EQ(stats.refused_in_queue, 0u);
  on->rig->expect_ledger_returns("after a refusal on the forecast");

  // The rate alone: accepted, then refused in the queue after the whole bound.
  auto off = learned_rig(/*forecast=*/false, 8);
  ASSERT_NE(off, nullptr);
  ASSERT_NO_FATAL_FAILURE(expect_accepted_then_refused_late(*off));
  stats = off->rig->engine().stats();
  EXPECT_EQ(stats.refused_predicted_wait, 0u);
  EXPECT_EQ(stats.refused_in_queue, 1u);
}

// The engine tells the estimate when requests waited: three places filled 10 ms apart measure
// a fast window (2 admissions in 0.53 s), but half a second with five waiting and no place
// freed bounds the drain by 1 / 0.5 s, so Retry-After for the five and one more is 3 s, not
// the window's 1.6 s.
TEST(SchedulingRetryEstimate, TheEngineBoundsTheRateByTheTimeRequestsWaited) {
  EngineOptions options = no_cache();
  options.max_running = 3;
  auto t = timed_rig(options, microseconds(10000), microseconds(0));
  ASSERT_NE(t, nullptr);
  EngineRig& rig = *t->rig;
  for (std::uint64_t i = 0; i < 3; ++i) {
    rig.submit(greedy_request(rig_prompt(5, 90 + i), 100));
    ASSERT_TRUE(rig.engine().step().ok());  // admitted, its admission noted 10 ms later
  }
  for (std::uint64_t i = 0; i < 5; ++i) rig.submit(greedy_request(rig_prompt(5, 95 + i), 2));
  ASSERT_TRUE(rig.engine().step().ok());  // they join the line: no place
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(rig.engine().step().ok());
  ASSERT_EQ(rig.engine().stats().waiting, 5u);
  // 50 steps of 10 ms waited, each decayed by e^(-0.01 / 30) per later step.
  double waited = 0;
  for (int i = 0; i < 50; ++i)
    waited = waited * std::exp(-0.01 / RetryEstimate::kBacklogDecay) + 0.01;
  EXPECT_NEAR(rig.engine().retry_after(), 6 * waited, 1e-9);
  ASSERT_TRUE(rig.run().ok());
}

// Seven answers ended: the lengths are not learned yet, so nothing is forecast and the third is
// accepted on the rate (then refused late, as without the forecast).
TEST(SchedulingWaitForecast, ForecastsNothingBeforeEightAnswersEnded) {
  auto t = learned_rig(/*forecast=*/true, 7);
  ASSERT_NE(t, nullptr);
  ASSERT_NO_FATAL_FAILURE(expect_accepted_then_refused_late(*t));
}

}  // namespace kvvm::engine::scheduling_test
