// Driver faults under the engine: the k-th call of one kind fails (for every k the run
// makes) while a batch with shared prompt prefixes runs with the prefix cache on, so the
// commit, publish, sharing, eviction and release paths each meet a failure (a fence that
// cannot be recorded makes a release fail: the slot must be released later, not forgotten
// with its bytes while later requests starve). At most the request the failure hit ends
// with an error (or is recomputed); every other one gets the fault-free tokens, no slot
// stays active, and every byte returns to the tier.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/host_driver.h"
#include "support/engine_harness.h"
#include "support/sanitizer.h"

namespace kvvm::engine {
namespace {

using testing::EngineRig;
using testing::FixtureModel;
using testing::Outcome;
using testing::rig_prompt;

constexpr std::uint64_t kFaultGranule = 32 << 10;  // 16 llama-tiny tokens per window
constexpr std::uint64_t kFaultRequests = 6;
// Runs per op at most (a stride beyond); 12 under ThreadSanitizer (support/sanitizer.h).
constexpr std::uint64_t kSweepCap = test::kUnderThreadSanitizer ? 12 : 40;

// A 20-token system prompt (one window and a bit) shared by every request, then a question
// of its own, longer for each. Two run at a time in a budget of four windows, so the later
// ones find the system prompt's window in the prefix cache and map it, finished slots are
// reclaimed and cache entries evicted to admit them, and the newest is preempted when the
// two outgrow the budget.
EngineRequest fault_request(std::uint64_t i) {
  EngineRequest request;
  request.prompt = rig_prompt(20, 1);
  const std::vector<std::int32_t> question = rig_prompt(3 + 3 * i, 50 + i);
  request.prompt.insert(request.prompt.end(), question.begin(), question.end());
  request.max_tokens = 6;
  request.use_model_eos = false;
  if (i % 2 == 1) {
    request.sampling.temperature = 0.8f;
    request.sampling.seed = 31 + i;
  }
  return request;
}

struct FaultRun {
  std::vector<Outcome> outcomes;
  bool run_ok = false;
  std::string run_error;
  std::uint64_t injected = 0;
  std::uint64_t calls = 0;  // calls of the swept op from arming to teardown
  std::uint64_t prefix_hits = 0;
  std::uint64_t preemptions = 0;
  std::uint64_t quarantined_bytes = 0;
  HostDriverTables leftover;  // the host driver's tables once the space is gone
};

// One run with the fault plan `arm` sets, from before the first submit to the end of the
// space (to the end of the run with `run_only`); `calls` counts the calls of `op`.
FaultRun run_with_plan(FixtureModel& model, DriverOp op,
                       const std::function<void(FaultDriver&)>& arm, const std::string& where,
                       bool run_only = false) {
  FaultRun result;
  auto inner = make_host_driver(HostDriverOptions{.granule = kFaultGranule});
  EXPECT_TRUE(inner.ok()) << inner.status().to_string();
  if (!inner.ok()) return result;
  FaultDriver fault(**inner);
  KvSpaceOptions space;
  space.max_slots = 4;
  space.max_context = 64;
  space.driver = &fault;
  space.budget_bytes = 4 * kFaultGranule;
  EngineOptions options;
  options.max_running = 2;
  auto rig = EngineRig::make(model, space, options);
  if (!rig) return result;
  const std::uint64_t before = fault.counts().of(op);
  arm(fault);
  for (std::uint64_t i = 0; i < kFaultRequests; ++i) rig->submit(fault_request(i));
  const Status run = rig->run();
  if (run_only) fault.clear();
  result.run_ok = run.ok();
  result.run_error = run.to_string();
  result.prefix_hits = rig->engine().stats().prefix.hits;
  result.preemptions = rig->engine().stats().preemptions;
  EXPECT_EQ(rig->kv().arena().stats().active_slots, 0u) << where;
  rig->expect_ledger_returns(where);
  result.quarantined_bytes = rig->kv().arena().pool().snapshot().quarantined_bytes;
  result.outcomes.assign(rig->outcomes().begin(), rig->outcomes().end());
  rig.reset();
  result.calls = fault.counts().of(op) - before;
  result.injected = fault.injected();
  result.leftover = host_driver_tables(**inner);
  return result;
}

// The k-th call of `op` fails (k == 0: none).
FaultRun run_with_fault(FixtureModel& model, DriverOp op, std::uint64_t k,
                        const std::string& where) {
  return run_with_plan(
      model, op,
      [&](FaultDriver& fault) {
        if (k > 0) fault.fail_nth(op, k);
      },
      where);
}

class EngineFault : public ::testing::TestWithParam<DriverOp> {};

TEST_P(EngineFault, EachFailedCallEndsAtMostItsOwnRequest) {
  const DriverOp op = GetParam();
  auto model = testing::load_fixture("llama-tiny", testing::kSmallStepLimits);
  ASSERT_NE(model, nullptr);
  const FaultRun clean = run_with_fault(*model, op, 0, "fault-free");
  ASSERT_TRUE(clean.run_ok) << clean.run_error;
  ASSERT_EQ(clean.outcomes.size(), kFaultRequests);
  for (const Outcome& outcome : clean.outcomes) {
    ASSERT_TRUE(outcome.completed()) << outcome.error.to_string();
    ASSERT_EQ(outcome.tokens.size(), 6u);
  }
  EXPECT_GT(clean.prefix_hits, 0u) << "the later requests never hit the shared prefix";
  EXPECT_GT(clean.preemptions, 0u) << "the budget never forced a preemption";
  EXPECT_EQ(clean.quarantined_bytes, 0u);
  EXPECT_EQ(clean.leftover.mappings, 0u);
  EXPECT_EQ(clean.leftover.handles, 0u);
  EXPECT_EQ(clean.leftover.reservations, 0u);
  if (clean.calls == 0) GTEST_SKIP() << to_string(op) << ": the engine makes no such call";

  // Every k up to the fault-free count (a stride past kSweepCap runs), then one beyond it
  // that must inject nothing: the sweep covered every call.
  const std::uint64_t stride = (clean.calls + kSweepCap - 1) / kSweepCap;
  for (std::uint64_t k = 1;; k += stride) {
    const std::uint64_t at = std::min(k, clean.calls + 1);
    const std::string where = std::string(to_string(op)) + " #" + std::to_string(at) + " of " +
                              std::to_string(clean.calls);
    const FaultRun faulty = run_with_fault(*model, op, at, where);
    if (at > clean.calls) {
      EXPECT_EQ(faulty.injected, 0u)
          << where << ": the run made more calls than the fault-free one";
      break;
    }
    EXPECT_EQ(faulty.injected, 1u) << where;
    ASSERT_TRUE(faulty.run_ok) << where << ": the engine broke: " << faulty.run_error;
    ASSERT_EQ(faulty.outcomes.size(), kFaultRequests) << where;
    std::uint64_t hit = 0;
    for (std::uint64_t i = 0; i < kFaultRequests; ++i) {
      const Outcome& outcome = faulty.outcomes[i];
      const std::string which = where + ", request " + std::to_string(i);
      ASSERT_TRUE(outcome.submit_status.ok()) << which;
      ASSERT_EQ(outcome.finished_events, 1) << which << ": every request ends exactly once";
      if (outcome.completed()) {
        EXPECT_EQ(outcome.tokens, clean.outcomes[i].tokens) << which;
        continue;
      }
      ++hit;
      EXPECT_EQ(outcome.end, RequestEnd::kError) << which;
      EXPECT_NE(outcome.error.message().find("injected fault"), std::string::npos)
          << which << ": " << outcome.error.to_string();
    }
    EXPECT_LE(hit, 1u) << where << ": one failed call ended several requests";
    // Only a failed unmap (or a failed access change under a mapping) leaves memory whose
    // state is unknown; it stays quarantined and charged. Otherwise the driver is empty.
    if (op != DriverOp::kUnmap && op != DriverOp::kSetAccess) {
      EXPECT_EQ(faulty.quarantined_bytes, 0u) << where;
    }
    if (faulty.quarantined_bytes == 0) {
      EXPECT_EQ(faulty.leftover.mappings, 0u) << where;
      EXPECT_EQ(faulty.leftover.handles, 0u) << where;
      EXPECT_EQ(faulty.leftover.reservations, 0u) << where;
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, EngineFault,
                         ::testing::Values(DriverOp::kMap, DriverOp::kUnmap, DriverOp::kSetAccess,
                                           DriverOp::kFence),
                         [](const auto& param_info) {
                           std::string name(to_string(param_info.param));
                           std::erase_if(name, [](char c) { return !std::isalnum(c); });
                           return name;
                         });

// Several faults in one run, of every kind the engine's paths make, drawn at random: each
// request still ends exactly once, any that completes has the fault-free tokens, and the
// ledger returns to what is quarantined.
TEST(EngineRandomFaults, NoAnswerIsEverCorrupted) {
  auto model = testing::load_fixture("llama-tiny", testing::kSmallStepLimits);
  ASSERT_NE(model, nullptr);
  const FaultRun clean = run_with_fault(*model, DriverOp::kMap, 0, "fault-free");
  ASSERT_TRUE(clean.run_ok) << clean.run_error;
  std::uint64_t injected = 0, completed = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    const std::string where = "seed " + std::to_string(seed);
    const FaultRun faulty = run_with_plan(
        *model, DriverOp::kMap,
        [&](FaultDriver& fault) {
          std::uint64_t salt = seed * 10;
          for (const DriverOp op : {DriverOp::kMap, DriverOp::kUnmap, DriverOp::kSetAccess,
                                    DriverOp::kCreate, DriverOp::kFence}) {
            fault.fail_fraction(op, 0.06, ++salt);
          }
        },
        where, /*run_only=*/true);
    ASSERT_TRUE(faulty.run_ok) << where << ": the engine broke: " << faulty.run_error;
    ASSERT_EQ(faulty.outcomes.size(), kFaultRequests) << where;
    injected += faulty.injected;
    for (std::uint64_t i = 0; i < kFaultRequests; ++i) {
      const Outcome& outcome = faulty.outcomes[i];
      ASSERT_EQ(outcome.finished_events, 1) << where << ", request " << i;
      if (!outcome.completed()) {
        EXPECT_EQ(outcome.end, RequestEnd::kError) << where << ", request " << i;
        continue;
      }
      ++completed;
      EXPECT_EQ(outcome.tokens, clean.outcomes[i].tokens) << where << ", request " << i;
    }
  }
  EXPECT_GT(injected, 6u) << "too few faults to test anything";
  EXPECT_GT(completed, 0u) << "no request survived: nothing was compared";
}

}  // namespace
}  // namespace kvvm::engine
