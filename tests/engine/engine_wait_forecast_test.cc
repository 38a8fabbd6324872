// Scheduling under load, on the CPU with a fake clock: the wait forecast refuses at arrival a
// request that a long running answer and the one in line behind it would keep waiting past the
// bound, which the admission rate alone accepts and the queue then refuses late; nothing is
// forecast before 8 answers have ended.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "scheduling_rig.h"
#include "support/engine_harness.h"

namespace kvvm::engine::scheduling_test {

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

// Seven answers ended: the lengths are not learned yet, so nothing is forecast and the third is
// accepted on the rate (then refused late, as without the forecast).
TEST(SchedulingWaitForecast, ForecastsNothingBeforeEightAnswersEnded) {
  auto t = learned_rig(/*forecast=*/true, 7);
  ASSERT_NE(t, nullptr);
  ASSERT_NO_FATAL_FAILURE(expect_accepted_then_refused_late(*t));
}

}  // namespace kvvm::engine::scheduling_test
