// Scheduling under load, on the CPU with a fake clock: the retry estimate, the queue ahead of a
// request over the measured admission rate, times how far recent predictions fell short, and
// bounded by the time requests waited, which the engine tells it.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>

#include "engine/retry_estimate.h"
#include "scheduling_rig.h"
#include "support/engine_harness.h"

namespace kvvm::engine::scheduling_test {

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

}  // namespace kvvm::engine::scheduling_test
