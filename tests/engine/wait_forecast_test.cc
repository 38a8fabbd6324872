// The wait forecast's parts (src/engine/output_lengths.h, src/engine/wait_forecast.h): the
// tokens an answer is expected to generate still, from the answers that ended; and the step at
// which each position in line gets a running place, played out from the places' holders.
#include "engine/wait_forecast.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "engine/output_lengths.h"

namespace kvvm::engine::wait_forecast_test {
namespace {

using std::chrono::milliseconds;

TEST(OutputLengths, KnowsNothingBeforeEightAnswersEnded) {
  OutputLengths lengths;
  for (std::size_t i = 0; i + 1 < OutputLengths::kMinSamples; ++i) lengths.note(10, true);
  EXPECT_FALSE(lengths.known());
  lengths.note(10, true);
  EXPECT_TRUE(lengths.known());
}

// Every answer ran to its cap: an answer is expected to run to its own.
TEST(OutputLengths, AnswersThatRanToTheirCapsPredictTheCap) {
  OutputLengths lengths;
  for (int i = 0; i < 8; ++i) lengths.note(static_cast<std::uint32_t>(100 + i), true);
  lengths.refresh();
  EXPECT_DOUBLE_EQ(lengths.remaining(0, 300), 300.0);
  EXPECT_DOUBLE_EQ(lengths.remaining(250, 300), 50.0);
  EXPECT_DOUBLE_EQ(lengths.remaining(300, 300), 0.0);
  EXPECT_DOUBLE_EQ(lengths.remaining(400, 300), 0.0);
  EXPECT_DOUBLE_EQ(lengths.mean(), 103.5);
}

// Every answer stopped on its own at 10, 20, 30 or 40 tokens: the mean of the lengths past
// what an answer has generated, each at most its cap, less what it has generated.
TEST(OutputLengths, StoppedAnswersPredictTheMeanResidualLength) {
  OutputLengths lengths;
  for (int round = 0; round < 2; ++round) {
    for (const std::uint32_t n : {10u, 20u, 30u, 40u}) lengths.note(n, false);
  }
  lengths.refresh();
  EXPECT_DOUBLE_EQ(lengths.remaining(0, 100), 25.0);
  EXPECT_DOUBLE_EQ(lengths.remaining(15, 100), 15.0);  // {20, 30, 40}: 30 - 15
  EXPECT_DOUBLE_EQ(lengths.remaining(20, 100), 15.0);  // {30, 40}: a stopped one ends at 20
  // The cap bounds each: {20, 25, 25} - 15.
  EXPECT_NEAR(lengths.remaining(15, 25), 70.0 / 3 - 15, 1e-12);
  // Longer than every stopped answer: to its cap.
  EXPECT_DOUBLE_EQ(lengths.remaining(45, 100), 55.0);
  EXPECT_DOUBLE_EQ(lengths.mean(), 25.0);
}

// Half ran to their caps: the two predictions half and half.
TEST(OutputLengths, TheShareAtTheCapMixesTheTwo) {
  OutputLengths lengths;
  for (int i = 0; i < 4; ++i) {
    lengths.note(50, true);
    lengths.note(20, false);
  }
  lengths.refresh();
  EXPECT_DOUBLE_EQ(lengths.remaining(0, 80), 0.5 * 80 + 0.5 * 20);
  EXPECT_DOUBLE_EQ(lengths.remaining(10, 80), 0.5 * 70 + 0.5 * 10);
}

// The oldest answers leave after kSamples newer ones; a note is seen only after refresh().
TEST(OutputLengths, ForgetsTheOldestAndRefreshesOnDemand) {
  OutputLengths lengths;
  for (std::size_t i = 0; i < OutputLengths::kSamples; ++i) lengths.note(10, false);
  lengths.refresh();
  EXPECT_DOUBLE_EQ(lengths.remaining(0, 1000), 10.0);
  for (std::size_t i = 0; i < OutputLengths::kSamples - 1; ++i) lengths.note(30, false);
  EXPECT_DOUBLE_EQ(lengths.remaining(0, 1000), 10.0);  // not refreshed
  lengths.refresh();
  const double expected = (10.0 + 30.0 * (OutputLengths::kSamples - 1)) / OutputLengths::kSamples;
  EXPECT_DOUBLE_EQ(lengths.remaining(0, 1000), expected);
  lengths.note(30, false);
  lengths.refresh();
  EXPECT_DOUBLE_EQ(lengths.remaining(0, 1000), 30.0);
}

const WaitForecast::Clock::time_point kAt =
    WaitForecast::Clock::time_point{} + std::chrono::hours(1);

TEST(WaitForecast, SaysNothingUntilBuiltOrOnceCleared) {
  WaitForecast forecast;
  EXPECT_FALSE(forecast.steps(0).has_value());
  EXPECT_FALSE(forecast.wait(0, kAt).has_value());
  const std::vector<double> busy = {3};
  forecast.build(2, busy, {}, 4, 0.01, kAt);
  EXPECT_TRUE(forecast.steps(0).has_value());
  forecast.clear();
  EXPECT_FALSE(forecast.steps(0).has_value());
  forecast.build(0, busy, {}, 4, 0.01, kAt);  // no place: nothing to forecast
  EXPECT_FALSE(forecast.steps(0).has_value());
}

// Three places, two held for 10 and 4 more steps; in line, requests holding 6 and 2 steps;
// later ones 8. Each position takes the first place to free:
//   0 -> the free place at 0 (frees at 6); 1 -> 4 (frees at 6); 2 -> 6 (14); 3 -> 6 (14);
//   4 -> 10 (18); 5 -> 14; 6 -> 14; 7 -> 18.
TEST(WaitForecast, EachPositionTakesTheFirstPlaceToFree) {
  WaitForecast forecast;
  const std::vector<double> busy = {10, 4};
  const std::vector<double> queued = {6, 2};
  forecast.build(3, busy, queued, 8, 0.01, kAt);
  EXPECT_DOUBLE_EQ(*forecast.steps(7), 18.0);  // played out on demand, in any order
  const std::vector<double> expected = {0, 4, 6, 6, 10, 14, 14, 18};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_DOUBLE_EQ(*forecast.steps(i), expected[i]) << i;
  }
  // Past kMaxPositions: the last played out plus 8 / 3 steps a position.
  const double last = *forecast.steps(WaitForecast::kMaxPositions - 1);
  EXPECT_DOUBLE_EQ(*forecast.steps(WaitForecast::kMaxPositions + 2), last + 3 * 8.0 / 3);
  // In seconds at 10 ms a step, less the time since it was made, never below 0.
  EXPECT_NEAR(*forecast.wait(1, kAt), 0.04, 1e-12);
  EXPECT_NEAR(*forecast.wait(1, kAt + milliseconds(10)), 0.03, 1e-12);
  EXPECT_DOUBLE_EQ(*forecast.wait(1, kAt + milliseconds(500)), 0.0);
}

// Every place held by a long answer: the line waits for them however fast the places turned
// over before; a rebuild replaces the forecast whole.
TEST(WaitForecast, AWaveOfLongAnswersHoldsTheLine) {
  WaitForecast forecast;
  const std::vector<double> wave(4, 500);
  forecast.build(4, wave, {}, 20, 0.02, kAt);
  EXPECT_DOUBLE_EQ(*forecast.steps(0), 500.0);
  EXPECT_DOUBLE_EQ(*forecast.steps(3), 500.0);
  EXPECT_DOUBLE_EQ(*forecast.steps(4), 520.0);
  EXPECT_DOUBLE_EQ(*forecast.steps(8), 540.0);
  EXPECT_NEAR(*forecast.wait(0, kAt), 10.0, 1e-9);
  const std::vector<double> short_ones(4, 5);
  forecast.build(4, short_ones, {}, 20, 0.02, kAt);
  EXPECT_DOUBLE_EQ(*forecast.steps(0), 5.0);
}

}  // namespace
}  // namespace kvvm::engine::wait_forecast_test
