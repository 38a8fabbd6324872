// Fault sweeps (docs/ARCHITECTURE.md "Tests") of a Reservation's teardown: every driver call of the
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
// Teardown: reservation 0 (8 granules) holds [0, 2) and [3, 5) (two runs of two handles);
// reservation 1 holds [0, 1) and maps reservation 0's first handle read-only at granule 2.
// The operation destroys reservation 0 with the default synchronizer (driver.synchronize(),
// so position 1 is the synchronize call).

struct TeardownCase {
  std::string name;
  std::uint64_t max_pooled_bytes = kNoPoolBound;
  bool with_poisoned = false;  // reservation 0 also holds a poisoned block at [6, 7)
};

void check_teardown(Rig& rig, const Trial& t, const TeardownCase& c, Outcome* outcome) {
  const std::string where = c.name + ", " + t.where();
  const std::size_t g = rig.g;
  const State after = capture(rig);
  TeardownStats d;
  d.leaked_reservations =
      after.teardown.leaked_reservations - t.before.teardown.leaked_reservations;
  d.leaked_blocks = after.teardown.leaked_blocks - t.before.teardown.leaked_blocks;
  d.leaked_bytes = after.teardown.leaked_bytes - t.before.teardown.leaked_bytes;
  d.leaked_address_bytes =
      after.teardown.leaked_address_bytes - t.before.teardown.leaked_address_bytes;
  d.free_failures = after.teardown.free_failures - t.before.teardown.free_failures;
  const std::vector<Block>& torn = t.before.blocks[0];
  std::size_t poisoned = 0;
  for (const Block& b : torn) poisoned += b.poisoned ? 1 : 0;

  // What the teardown reports it left behind is what the world must account for.
  rig.leaked_mappings = d.leaked_blocks;
  rig.leaked_reservations = d.leaked_address_bytes / (8 * g);
  EXPECT_EQ(d.leaked_address_bytes % (8 * g), 0u) << where;
  ASSERT_EQ(kt::check_invariants(rig.world()), "") << where;

  const bool sync_failed = t.calls.failed(DriverOp::kSynchronize) > 0;
  if (t.position == 1) {
    EXPECT_TRUE(sync_failed) << where << ": position 1 of a teardown is not its synchronize";
  }
  *outcome = sync_failed ? Outcome::kLeaked : Outcome::kCompleted;
  if (sync_failed) {
    // Deliberately leaked: nothing unmapped, released, reused or reported free; counted.
    EXPECT_EQ(d.leaked_reservations, 1u) << where;
    EXPECT_EQ(d.leaked_blocks, torn.size()) << where;
    EXPECT_EQ(d.leaked_bytes, bytes_of(torn)) << where;
    EXPECT_EQ(d.leaked_address_bytes, 8 * g) << where;
    EXPECT_EQ(t.calls.total(), 1u) << where << ": driver calls after a failed synchronize";
    if (rig.real->info().backend == "host") {
      EXPECT_EQ(after.tables.mappings, t.before.tables.mappings) << where;
      EXPECT_EQ(after.tables.reservations, t.before.tables.reservations) << where;
      EXPECT_EQ(after.tables.handles, t.before.tables.handles) << where;
    }
    EXPECT_EQ(after.pool.handles_in_use, t.before.pool.handles_in_use) << where;
    EXPECT_EQ(after.pool.mapped_bytes, t.before.pool.mapped_bytes) << where;
    EXPECT_EQ(after.pool.owned_bytes, t.before.pool.owned_bytes) << where;
    EXPECT_EQ(after.tier.used, t.before.tier.used) << where;
    for (const Block& b : torn) {
      Result<HandleInfo> info = rig.pool->describe(b.handle);
      EXPECT_TRUE(info.ok() && info->state != HandleState::kPooled && info->mappings > 0)
          << where << ": a leaked block's handle is reusable: " << show(b);
    }
  } else {
    EXPECT_EQ(d.leaked_reservations, 0u) << where;
    // Only the blocks that were already poisoned stay behind (a single fault in the unmap
    // is absorbed by the per-block fallback).
    EXPECT_EQ(d.leaked_blocks, poisoned) << where;
    const bool free_failed = t.calls.failed(DriverOp::kFree) > 0;
    EXPECT_EQ(d.free_failures, free_failed ? 1u : 0u) << where;
    EXPECT_EQ(d.leaked_address_bytes, (poisoned > 0 || free_failed) ? 8 * g : 0u) << where;
    for (const Block& b : torn) {
      Result<HandleInfo> info = rig.pool->describe(b.handle);
      if (b.poisoned) {
        EXPECT_TRUE(info.ok() && info->state == HandleState::kQuarantined) << where << show(b);
      } else if (b.offset == 0) {
        // Still mapped by the sharer: in use, one mapping.
        ASSERT_TRUE(info.ok()) << where << ": the shared handle was released";
        EXPECT_EQ(info->state, HandleState::kInUse) << where;
        EXPECT_EQ(info->mappings, 1u) << where;
      } else if (info.ok()) {
        EXPECT_TRUE(info->state == HandleState::kPooled ||
                    (info->state == HandleState::kQuarantined &&
                     after.pool.release_failures > t.before.pool.release_failures))
            << where << ": handle of " << show(b) << " is " << to_string(info->state);
      }
    }
  }
  // The sharer is untouched and still reads the owner's bytes through its shared block.
  EXPECT_EQ(show(after.blocks[1]), show(t.before.blocks[1])) << where;
  EXPECT_EQ(verify_content(rig), "") << where;
}

Sweep teardown_sweep(const TeardownCase& c) {
  Sweep sweep;
  sweep.name = c.name;
  sweep.max_pooled_bytes = c.max_pooled_bytes;
  sweep.setup = [c](Rig& rig) {
    add_reservation(rig, 8);
    add_reservation(rig, 8);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(commit_granules(rig, 0, 0, 2).ok());
    ASSERT_TRUE(commit_granules(rig, 0, 3, 2).ok());
    ASSERT_TRUE(commit_granules(rig, 1, 0, 1).ok());
    fill(rig, 0, 0, 2);
    fill(rig, 0, 3, 2);
    fill(rig, 1, 0, 1);
    Result<HandleInfo> info = rig.pool->describe(rig.at(0).block_at(0)->handle);
    ASSERT_TRUE(info.ok());
    ASSERT_TRUE(rig.at(1).map_shared(2 * rig.g, *info).ok());
    share_seeds(rig, 0, 0, 1, 2, 1);
    if (c.with_poisoned) {
      ASSERT_TRUE(commit_granules(rig, 0, 6, 1).ok());
      fill(rig, 0, 6, 1);
      rig.fault->fail_nth_call(1);               // the coalesced unmap
      rig.fault->fail_nth(DriverOp::kUnmap, 2);  // and the per-block one
      const Status released = rig.at(0).release(6 * rig.g, rig.g);
      rig.fault->clear();
      ASSERT_TRUE(mentions(released, "poisoned")) << released.to_string();
      ASSERT_EQ(rig.at(0).residual_bytes(), rig.g);
    }
  };
  sweep.op = [](Rig& rig) {
    rig.reservations[0].reset();
    return Status::Ok();
  };
  sweep.check = [c](Rig& rig, const Trial& t) {
    if (t.position == 0) {
      EXPECT_EQ(t.calls.of(DriverOp::kSynchronize), 1u) << c.name;
    }
    Outcome outcome = Outcome::kCompleted;
    check_teardown(rig, t, c, &outcome);
    return outcome;
  };
  return sweep;
}

TYPED_TEST_SUITE(FaultSweepTest, kt::AllBackends, kt::BackendNames);

// Position 1 (the synchronize) leaks deliberately; every other fault is absorbed.
TYPED_TEST(FaultSweepTest, Teardown) {
  const SweepResult r = run_sweep<TypeParam>(teardown_sweep({.name = "teardown"}));
  EXPECT_EQ(r.count(Outcome::kLeaked), 1u);
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions - 1);
}

TYPED_TEST(FaultSweepTest, TeardownPoolKeepsNothing) {
  const SweepResult r = run_sweep<TypeParam>(
      teardown_sweep({.name = "teardown, pool bound 0", .max_pooled_bytes = 0}));
  EXPECT_EQ(r.count(Outcome::kLeaked), 1u);
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions - 1);
}

TYPED_TEST(FaultSweepTest, TeardownWithPoisonedBlock) {
  const SweepResult r = run_sweep<TypeParam>(
      teardown_sweep({.name = "teardown with a poisoned block", .with_poisoned = true}));
  EXPECT_EQ(r.count(Outcome::kLeaked), 1u);
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions - 1);
}

}  // namespace
}  // namespace kvvm
