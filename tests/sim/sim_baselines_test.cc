// The scheduler of `kvvm simulate` and its two baselines, as pure accounting: FIFO admission,
// rejection after the queue wait, preemption when growth does not fit, and each baseline's
// capacity by its arithmetic.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "sim/baselines.h"
#include "sim/replay_scheduler.h"
#include "sim/trace.h"

namespace kvvm::cli {
namespace {

constexpr std::uint64_t kBytesPerToken = 1024;

Trace same_requests(std::size_t count, std::uint64_t prompt, std::uint64_t output,
                    double gap_s = 0) {
  Trace trace;
  for (std::size_t i = 0; i < count; ++i) {
    trace.requests.push_back(TraceRequest{gap_s * static_cast<double>(i), prompt, output});
  }
  return trace;
}

SchedulerOptions scheduler(double max_wait_s = 1000) {
  return SchedulerOptions{
      .step_s = 0.1, .max_queue_wait_s = max_wait_s, .bytes_per_token = kBytesPerToken};
}

TEST(SimulateBaselines, PreallocateCapacityIsBudgetOverMaxContextTimesBytesPerToken) {
  EXPECT_EQ(preallocate_capacity(std::uint64_t{40} << 30, 8192, 131072), 40u);
  EXPECT_EQ(preallocate_capacity((std::uint64_t{40} << 30) - 1, 8192, 131072), 39u);
  EXPECT_EQ(preallocate_capacity(100, 0, 1), 0u);
  // No overflow where max context x bytes per token passes 64 bits.
  EXPECT_EQ(preallocate_capacity(~std::uint64_t{0}, std::uint64_t{1} << 40, 1u << 30), 0u);
}

TEST(SimulateBaselines, PreallocatePeakIsItsCapacityWhateverTheLength) {
  const std::uint64_t budget = 10 * 256 * kBytesPerToken + 5;  // 10 sequences of 256 tokens
  PreallocateModel model(budget, 256, kBytesPerToken);
  const Result<RunSummary> run = run_schedule(same_requests(50, 3, 4), model, scheduler());
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  EXPECT_EQ(run->peak_concurrency, 10u);
  EXPECT_EQ(run->completed, 50u);
  EXPECT_EQ(run->peak_committed, 10 * 256 * kBytesPerToken);
  // Live peaks at 6 tokens: a sequence is released in the step it reaches 3 + 4.
  EXPECT_EQ(run->peak_live, 10 * 6 * kBytesPerToken);
  EXPECT_EQ(run->preemptions, 0u);
}

TEST(SimulateBaselines, PagedCountsBlocksOfSixteenTokens) {
  PagedModel model(100 * 16 * kBytesPerToken, kPagedBlockTokens, kBytesPerToken);
  EXPECT_EQ(model.name(), "paged-16");
  EXPECT_EQ(model.blocks_for(1), 1u);
  EXPECT_EQ(model.blocks_for(16), 1u);
  EXPECT_EQ(model.blocks_for(17), 2u);
  // 33 tokens hold 3 blocks: 100 blocks admit 33 of them.
  const Result<RunSummary> run = run_schedule(same_requests(60, 33, 2), model, scheduler());
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  EXPECT_EQ(run->peak_concurrency, 33u);
  EXPECT_EQ(run->peak_committed, 99 * 16 * kBytesPerToken);
  EXPECT_EQ(run->completed, 60u);
  EXPECT_EQ(run->queued, 27u);
  EXPECT_EQ(run->rejected, 0u);
}

TEST(SimulateScheduler, RejectsAfterTheQueueWait) {
  // Room for one sequence of 60 + 30 tokens (6 blocks); each runs 30 steps (3 s); a request
  // may wait 1 s.
  PagedModel model(6 * 16 * kBytesPerToken, kPagedBlockTokens, kBytesPerToken);
  const Result<RunSummary> run = run_schedule(same_requests(3, 60, 30), model, scheduler(1.0));
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  EXPECT_EQ(run->admitted, 1u);
  EXPECT_EQ(run->completed, 1u);
  EXPECT_EQ(run->rejected, 2u);
  EXPECT_EQ(run->rejected_too_large, 0u);
  EXPECT_EQ(run->queued, 2u);
  EXPECT_EQ(run->peak_concurrency, 1u);
}

TEST(SimulateScheduler, FifoHeadBlocksLaterRequests) {
  // A long request at the head waits for room; a short one behind it may not overtake it.
  Trace trace;
  trace.requests.push_back(TraceRequest{0, 16, 20});   // holds 1 block, grows to 3
  trace.requests.push_back(TraceRequest{0.1, 40, 1});  // needs 3 blocks: waits for the first
  trace.requests.push_back(TraceRequest{0.2, 1, 1});   // would fit at once, but is behind
  PagedModel model(4 * 16 * kBytesPerToken, kPagedBlockTokens, kBytesPerToken);
  const Result<RunSummary> run = run_schedule(trace, model, scheduler());
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  EXPECT_EQ(run->completed, 3u);
  EXPECT_EQ(run->queued, 2u);
  // At step 5 the first holds 21 tokens (2 blocks): the third would fit, but stays queued.
  ASSERT_GT(run->series.size(), 5u);
  EXPECT_EQ(run->series[5].running, 1u);
  EXPECT_EQ(run->series[5].queued, 2u);
  // Once the first finishes, the other two run together.
  EXPECT_EQ(run->peak_concurrency, 2u);
}

TEST(SimulateScheduler, GrowthThatDoesNotFitPreemptsTheYoungest) {
  // Two sequences of 16 tokens fill 2 blocks; the 17th token needs a third: the younger one
  // is preempted, recomputed later, and both finish.
  PagedModel model(2 * 16 * kBytesPerToken, kPagedBlockTokens, kBytesPerToken);
  const Result<RunSummary> run = run_schedule(same_requests(2, 16, 4), model, scheduler());
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  EXPECT_EQ(run->peak_concurrency, 2u);
  EXPECT_GE(run->preemptions, 1u);
  EXPECT_EQ(run->completed, 2u);
  EXPECT_EQ(run->rejected, 0u);
  EXPECT_EQ(run->aborted, 0u);
}

TEST(SimulateScheduler, TooLargeForTheBudgetIsRejectedAndTooLongIsAborted) {
  PagedModel model(2 * 16 * kBytesPerToken, kPagedBlockTokens, kBytesPerToken);
  Trace trace;
  trace.requests.push_back(TraceRequest{0, 40, 1});  // 3 blocks: never fits
  trace.requests.push_back(TraceRequest{0, 30, 5});  // fits, cannot grow past 32 even alone
  const Result<RunSummary> run = run_schedule(trace, model, scheduler());
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  EXPECT_EQ(run->rejected, 1u);
  EXPECT_EQ(run->rejected_too_large, 1u);
  EXPECT_EQ(run->aborted, 1u);
  EXPECT_EQ(run->completed, 0u);
}

TEST(SimulateScheduler, SamplesEveryStepAndAveragesOverThem) {
  PagedModel model(1000 * 16 * kBytesPerToken, kPagedBlockTokens, kBytesPerToken);
  // One request of 16 + 4 tokens: admitted at step 0, grows at steps 1-4, done at step 4.
  const Result<RunSummary> run = run_schedule(same_requests(1, 16, 4), model, scheduler());
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  ASSERT_EQ(run->steps, 5u);
  ASSERT_EQ(run->series.size(), 5u);
  EXPECT_EQ(run->series[0].running, 1u);
  EXPECT_EQ(run->series[0].committed, 16 * kBytesPerToken);
  EXPECT_EQ(run->series[1].committed, 32 * kBytesPerToken);
  EXPECT_EQ(run->series[4].running, 0u);
  // Means are over the steps while requests arrive: step 0 only here.
  EXPECT_DOUBLE_EQ(run->mean_concurrency, 1.0);
  EXPECT_DOUBLE_EQ(run->mean_committed, 16.0 * kBytesPerToken);
  // Waste over every step: committed 16, 32, 32, 32 tokens for 16, 17, 18, 19 live.
  EXPECT_DOUBLE_EQ(run->waste_ratio, (0.0 + 15 + 14 + 13) / (16 + 17 + 18 + 19));
  EXPECT_DOUBLE_EQ(run->simulated_s, 0.5);
}

}  // namespace
}  // namespace kvvm::cli
