// Fault sweeps (docs/ARCHITECTURE.md "Tests") of Reservation::release: every driver call of the
// operation is made to fail in turn, and the outcome checked against its contract.
//
// How a sweep works and what it checks: tests/support/reservation_fault_sweep.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvvm/governor/governor.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/host_driver.h"
#include "kvvm/vmm/reservation.h"
#include "support/backends.h"
#include "support/invariants.h"
#include "support/reservation_fault_sweep.h"

namespace kvvm {
namespace {

namespace kt = ::kvvm::testing;
// The shared runner, fixture and helpers of every reservation fault sweep.
using namespace ::kvvm::testing::reservation_sweep;  // NOLINT(build/namespaces)

// ---------------------------------------------------------------------------------------------
// Release: reservation 0 (16 granules) holds neighbours [0, 1) and [1 + k, 2 + k) and k
// granules at [1, 1 + k) in handles of `handle_granules`; the operation releases [1, 1 + k).

struct ReleaseCase {
  std::string name;
  std::size_t k = 1;
  std::size_t handle_granules = 1;
  std::uint64_t max_pooled_bytes = kNoPoolBound;
  // Double fault: the coalesced unmap fails and so does the per-block unmap of block i.
  bool failing_fallback = false;
};

void check_release(Rig& rig, const Trial& t, const ReleaseCase& c, Outcome* outcome) {
  const std::string where = c.name + ", " + t.where();
  const std::size_t g = rig.g;
  const std::size_t offset = g;
  const std::size_t len = c.k * g;
  Reservation& reservation = rig.at(0);
  const State after = capture(rig);
  const std::vector<Block> targets = inside(t.before.blocks[0], offset, len);
  const std::vector<Block> left = inside(after.blocks[0], offset, len);

  ASSERT_EQ(kt::check_invariants(rig.world()), "") << where;
  EXPECT_EQ(show(outside(after.blocks[0], offset, len)),
            show(outside(t.before.blocks[0], offset, len)))
      << where << ": blocks outside the released range changed";

  *outcome = t.status.ok() ? Outcome::kCompleted : Outcome::kResidual;
  if (t.status.ok()) {
    EXPECT_TRUE(left.empty()) << where << ": released range still holds " << show(left);
    EXPECT_EQ(reservation.residual_bytes(), 0u) << where;
    // Each handle went back to the pool, or was released, or (its release failed) is
    // quarantined and counted as a release failure: nothing else.
    const std::uint64_t release_failures =
        after.pool.release_failures - t.before.pool.release_failures;
    EXPECT_EQ(after.pool.handles_quarantined - t.before.pool.handles_quarantined, release_failures)
        << where;
    for (const Block& b : targets) {
      Result<HandleInfo> info = rig.pool->describe(b.handle);
      if (!info.ok()) continue;  // released
      EXPECT_TRUE(info->state == HandleState::kPooled ||
                  (info->state == HandleState::kQuarantined && release_failures > 0))
          << where << ": handle of released " << show(b) << " is " << to_string(info->state);
      EXPECT_EQ(info->mappings, 0u) << where << ": " << show(b);
    }
    if (c.max_pooled_bytes == kNoPoolBound) {
      EXPECT_EQ(after.pool.pooled_bytes, t.before.pool.pooled_bytes + len) << where;
      EXPECT_EQ(after.tier.used, t.before.tier.used) << where;
    }
  } else {
    // Residual: every target is either gone or still there, poisoned and named.
    EXPECT_EQ(t.status.code(), StatusCode::kDriverError) << where << ": " << t.status.to_string();
    EXPECT_TRUE(mentions(t.status, "poisoned")) << where << ": " << t.status.to_string();
    EXPECT_FALSE(left.empty()) << where << ": failed, yet nothing was left behind";
    EXPECT_EQ(reservation.residual_bytes(), bytes_of(left)) << where;
    EXPECT_GE(after.pool.handles_quarantined - t.before.pool.handles_quarantined, left.size())
        << where;
    for (const Block& b : left) {
      Block healthy = b;
      healthy.poisoned = false;
      const auto original = std::find_if(targets.begin(), targets.end(),
                                         [&](const Block& x) { return show(x) == show(healthy); });
      EXPECT_TRUE(b.poisoned && original != targets.end())
          << where << ": left behind " << show(b) << ", before " << show(targets);
      EXPECT_NE(t.status.message().find(range_text(b.offset, b.bytes)), std::string::npos)
          << where << ": " << show(b) << " not named in " << t.status.to_string();
      Result<HandleInfo> info = rig.pool->describe(b.handle);
      EXPECT_TRUE(info.ok() && info->state == HandleState::kQuarantined)
          << where << ": the handle of " << show(b) << " is not quarantined";
    }
  }
  EXPECT_EQ(verify_content(rig), "") << where;

  if (t.status.ok()) {
    // The addresses were kept: the range can be committed again.
    ASSERT_TRUE(commit_granules(rig, 0, 1, c.k, c.handle_granules).ok()) << where;
    fill(rig, 0, 1, c.k);
    ASSERT_EQ(kt::check_invariants(rig.world()), "") << where << ", recommitted";
    EXPECT_EQ(verify_content(rig), "") << where << ", recommitted";
  } else {
    // A poisoned block cannot be released again (and that refusal changes nothing); the
    // healthy neighbours still can.
    const State refused_before = capture(rig);
    const std::uint64_t calls_before = rig.fault->counts().total();
    for (const Block& b : left) {
      const Status again = reservation.release(b.offset, b.bytes);
      EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition)
          << where << ": releasing poisoned " << show(b) << " again: " << again.to_string();
    }
    EXPECT_EQ(rig.fault->counts().total(), calls_before) << where;
    EXPECT_EQ(show(reservation.blocks()), show(refused_before.blocks[0])) << where;
    EXPECT_EQ(rig.pool->snapshot().owned_bytes, refused_before.pool.owned_bytes) << where;
    EXPECT_TRUE(reservation.release(0, g).ok()) << where;
    EXPECT_TRUE(reservation.release((1 + c.k) * g, g).ok()) << where;
    ASSERT_EQ(kt::check_invariants(rig.world()), "") << where << ", neighbours released";
  }
}

Sweep release_sweep(const ReleaseCase& c) {
  Sweep sweep;
  sweep.name = c.name;
  sweep.max_pooled_bytes = c.max_pooled_bytes;
  sweep.setup = [c](Rig& rig) {
    add_reservation(rig, 16);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(commit_granules(rig, 0, 0, 1).ok());
    ASSERT_TRUE(commit_granules(rig, 0, 1, c.k, c.handle_granules).ok());
    ASSERT_TRUE(commit_granules(rig, 0, 1 + c.k, 1).ok());
    fill(rig, 0, 0, c.k + 2);
  };
  sweep.op = [c](Rig& rig) { return rig.at(0).release(rig.g, c.k * rig.g); };
  sweep.check = [c](Rig& rig, const Trial& t) {
    Outcome outcome = Outcome::kCompleted;
    check_release(rig, t, c, &outcome);
    return outcome;
  };
  if (c.failing_fallback) {
    // Position i: the coalesced unmap (call 1) fails and so does the per-block unmap of the
    // i-th block (unmap number 1 + i).
    sweep.arm = [](FaultDriver& fault, std::uint64_t position) {
      fault.fail_nth_call(1);
      fault.fail_nth(DriverOp::kUnmap, 1 + position);
    };
    sweep.count_positions = [](const Trial& clean) {
      return static_cast<std::uint64_t>(clean.before.blocks[0].size() - 2);
    };
    sweep.injections = 2;
  }
  return sweep;
}

TYPED_TEST_SUITE(FaultSweepTest, kt::AllBackends, kt::BackendNames);

// A single failing unmap is absorbed by the per-block fallback (and a failing release of a
// handle above the pool bound by quarantining it): every faulted release completes.
TYPED_TEST(FaultSweepTest, ReleaseOneGranule) {
  const SweepResult r = run_sweep<TypeParam>(release_sweep({.name = "release k=1", .k = 1}));
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions);
}

TYPED_TEST(FaultSweepTest, ReleaseTwoGranules) {
  const SweepResult r = run_sweep<TypeParam>(release_sweep({.name = "release k=2", .k = 2}));
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions);
}

TYPED_TEST(FaultSweepTest, ReleaseFiveGranules) {
  const SweepResult r = run_sweep<TypeParam>(release_sweep({.name = "release k=5", .k = 5}));
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions);
}

TYPED_TEST(FaultSweepTest, ReleaseFiveGranulesInTwoGranuleHandles) {
  const SweepResult r = run_sweep<TypeParam>(
      release_sweep({.name = "release k=5, 2-granule handles", .k = 5, .handle_granules = 2}));
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions);
}

TYPED_TEST(FaultSweepTest, ReleaseFiveGranulesPoolKeepsNothing) {
  const SweepResult r = run_sweep<TypeParam>(
      release_sweep({.name = "release k=5, pool bound 0", .k = 5, .max_pooled_bytes = 0}));
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions);
}

// The coalesced unmap fails and so does the per-block unmap of block i: residual each time.
TYPED_TEST(FaultSweepTest, ReleaseWithFailingFallbackReportsResidual) {
  const SweepResult r = run_sweep<TypeParam>(release_sweep(
      {.name = "release k=5, failing fallback unmap", .k = 5, .failing_fallback = true}));
  EXPECT_EQ(r.positions, 5u);
  EXPECT_EQ(r.count(Outcome::kResidual), r.positions);
}

}  // namespace
}  // namespace kvvm
