// Scheduling under load, on the CPU with a fake clock: a submit predicted to wait past
// max_queue_wait (the queue ahead of it over the measured admission rate, times how far recent
// predictions fell short) is refused at once, never on a guess before a rate is measured, and
// the late refusal in the queue stays as the backstop.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/retry_estimate.h"
#include "scheduling_rig.h"
#include "support/engine_harness.h"

namespace kvvm::engine::scheduling_test {

bool mentions_overloaded(const Status& status) {
  return status.message().find("overloaded") != std::string::npos;
}

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

}  // namespace kvvm::engine::scheduling_test
